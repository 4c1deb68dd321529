"""The placement rule (frenzy_opt.hardware.placement): the greedy's bucketed index always chooses what the
plain rule chooses, every choice passes the rule's own check, and the topology's answer is the rule's."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from frenzy_opt.hardware.cluster import parse_cluster
from frenzy_opt.hardware.placement import FreeIndex, Shape, choose, refusal, whole_nodes_for
from frenzy_opt.hardware.topology import Topology


@st.composite
def ledgers(draw: st.DrawFn) -> tuple[dict[int, int], list[tuple[int, int]], list[Shape]]:
    """Node sizes (the largest node's size S at least once), a sequence of takes (+) and releases (-) that
    keep every node within 0..its size, and shapes the rule admits on such a type."""
    size = draw(st.integers(1, 8))
    sizes = [*draw(st.lists(st.integers(1, size), min_size=0, max_size=7)), size]
    nodes = dict(enumerate(draw(st.permutations(sizes))))
    free = dict(nodes)
    changes = []
    for _ in range(draw(st.integers(0, 30))):
        node = draw(st.sampled_from(sorted(nodes)))
        delta = draw(st.integers(-free[node], nodes[node] - free[node]))
        free[node] += delta
        changes.append((node, delta))
    shapes = []
    for n in draw(st.lists(st.integers(1, size * len(nodes)), min_size=1, max_size=6)):
        whole = whole_nodes_for(n, size, len(nodes))
        if whole >= 0:
            shapes.append(Shape(n, whole))
    return nodes, changes, shapes


@settings(max_examples=300, deadline=None)
@given(ledgers())
def test_the_index_chooses_what_the_rule_chooses(
    ledger: tuple[dict[int, int], list[tuple[int, int]], list[Shape]],
) -> None:
    nodes, changes, shapes = ledger
    index = FreeIndex(nodes)
    free = dict(nodes)
    for node, delta in changes:
        index.change(node, delta)
        free[node] += delta
        assert index.count == sum(free.values())
        for shape in shapes:
            chosen = choose(shape, free, index.size)
            assert index.fit(shape) == chosen
            if chosen is not None:
                assert refusal(shape, chosen, free, index.size) is None


def test_best_fit_inside_a_node_and_lowest_whole_nodes() -> None:
    free = {0: 8, 1: 3, 2: 5, 3: 3, 4: 8}
    assert choose(Shape(3, 0), free, 8) == (1,)  # the tightest node; the lower one of a tie
    assert choose(Shape(4, 0), free, 8) == (2,)
    assert choose(Shape(6, 0), free, 8) == (0,)
    assert choose(Shape(16, 2), free, 8) == (0, 4)
    assert choose(Shape(24, 3), free, 8) is None
    assert choose(Shape(9, 0), free, 8) is None


def test_the_check_names_what_is_wrong() -> None:
    free = {0: 8, 1: 3, 2: 8}
    assert refusal(Shape(16, 2), (0, 2), free, 8) is None
    assert refusal(Shape(16, 2), (0,), free, 8) == "1 nodes, the rule takes 2"
    assert refusal(Shape(16, 2), (0, 0), free, 8) == "node 0 is listed twice"
    assert "node 1 has 3 free GPUs" in (refusal(Shape(16, 2), (0, 1), free, 8) or "")
    assert "node 1 has 3 free GPUs" in (refusal(Shape(4, 0), (1,), free, 8) or "")
    assert "node b has 3 free GPUs" in (refusal(Shape(4, 0), (1,), free, 8, "abc".__getitem__) or "")


def test_whole_nodes_for() -> None:
    assert [whole_nodes_for(n, 8, 4) for n in (1, 8, 9, 16, 32, 40)] == [0, 0, -1, 2, 4, -1]


def test_the_topology_places_by_the_rule() -> None:
    topology = Topology(
        parse_cluster(
            {
                "node_groups": [{"gpu": "A100-SXM4-80GB", "num_nodes": 4, "gpus_per_node": 8, "intra_node": "nvlink"}],
                "network": {"inter_node_gbps": 200},
            }
        )
    )
    free = {0: 2, 1: 8, 2: 4, 3: 8}
    a100 = topology.gpu_types[0]
    assert topology.best_nodes(a100, 4, free) == [2]
    assert topology.best_nodes(a100, 16, free) == [1, 3]
    assert topology.best_nodes(a100, 12, free) is None  # not a whole number of nodes
