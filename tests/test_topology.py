"""Topology graph and the placement rule the solvers share."""

from __future__ import annotations

from frenzy_opt.hardware.cluster import parse_cluster
from frenzy_opt.hardware.gpus import lookup_gpu
from frenzy_opt.hardware.topology import Topology


def _topology() -> Topology:
    return Topology(
        parse_cluster(
            {
                "node_groups": [
                    {"gpu": "A100-SXM4-80GB", "num_nodes": 2, "gpus_per_node": 8, "intra_node": "nvlink"},
                    {"gpu": "RTX-3090", "num_nodes": 3, "gpus_per_node": 4, "intra_node": "pcie"},
                ],
                "network": {"inter_node_gbps": 200},
            }
        )
    )


def test_graph_has_every_gpu_and_link() -> None:
    topology = _topology()
    kinds = [data["kind"] for _, data in topology.graph.nodes(data=True)]
    assert kinds.count("gpu") == 2 * 8 + 3 * 4 and kinds.count("node") == 5 and kinds.count("network") == 1
    assert topology.graph.number_of_edges() == 28 + 5
    assert topology.gpu_types == ["A100-SXM4-80GB", "RTX-3090"]
    assert topology.num_gpus_of("RTX-3090") == 12


def test_free_gpus_per_type_and_node() -> None:
    free = _topology().free_gpus({0: 3, 2: 4})
    assert free["A100-SXM4-80GB"] == {0: 5, 1: 8}
    assert free["RTX-3090"] == {2: 0, 3: 4, 4: 4}


def test_placement_rule() -> None:
    topology = _topology()
    assert topology.nodes_needed("A100-SXM4-80GB", 8) == 0
    assert topology.nodes_needed("A100-SXM4-80GB", 16) == 2
    assert topology.nodes_needed("A100-SXM4-80GB", 12) == -1  # not a whole number of nodes
    assert topology.nodes_needed("A100-SXM4-80GB", 24) == -1  # more nodes than the cluster has
    # Best fit inside a node: the tightest node that still fits keeps the large block free.
    assert topology.best_nodes("A100-SXM4-80GB", 2, {0: 3, 1: 8}) == [0]
    assert topology.best_nodes("A100-SXM4-80GB", 4, {0: 3, 1: 8}) == [1]
    assert topology.best_nodes("A100-SXM4-80GB", 16, {0: 3, 1: 8}) is None
    assert topology.best_nodes("RTX-3090", 8, {2: 4, 3: 4, 4: 1}) == [2, 3]


def test_links_read_from_the_graph() -> None:
    topology = _topology()
    a100 = lookup_gpu("A100-SXM4-80GB")
    assert topology.links("A100-SXM4-80GB").intra_node_gbyte_s == a100.intra_node_gbyte_s / 2
    assert topology.links("A100-SXM4-80GB").nic_gbyte_s == 200 / 8  # the 200 Gb/s NIC
    assert topology.links("RTX-3090").intra_node_gbyte_s == lookup_gpu("RTX-3090").pcie_gbyte_s / 2
