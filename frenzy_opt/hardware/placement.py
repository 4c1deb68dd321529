"""The placement rule, once: where a job of N GPUs of one type goes, for the greedy HAS, the simulator's
policies and checks, CP-SAT, ``frenzy launch`` and the orchestrator.

* **Inside one node** when N fits the type's largest node: on the node with the fewest free GPUs that still
  fit (best fit, which keeps large blocks free: Knuth, TAOCP vol. 1 §2.5, dynamic storage allocation),
  the lowest-numbered on a tie.
* **Whole nodes** otherwise: N must be a multiple of the largest node's size S (tensor and pipeline groups
  never straddle a partly used node: Megatron-LM keeps tensor parallelism inside a node, Narayanan et al.,
  SC 2021, §3, takeaway 1); the N / S lowest-numbered nodes with all S GPUs free.

:class:`FreeIndex` keeps the free GPUs per node of one type bucketed by count so that the greedy answers the
same question in O(S) instead of O(nodes); a property test checks that it always agrees with :func:`choose`.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Shape:
    """A shape by itself (``whole_nodes`` 0: inside one node)."""

    num_gpus: int
    whole_nodes: int


class Shaped(Protocol):
    """A placement shape: :class:`frenzy_opt.planning.problem.Option` is one."""

    @property
    def num_gpus(self) -> int: ...

    @property
    def whole_nodes(self) -> int: ...


def whole_nodes_for(num_gpus: int, node_size: int, num_nodes: int) -> int:
    """Whole nodes a job of ``num_gpus`` takes on a type of ``num_nodes`` nodes of at most ``node_size``
    GPUs: 0 if it fits inside one node, -1 if the rule admits it nowhere."""
    if num_gpus <= node_size:
        return 0
    if num_gpus % node_size or num_gpus // node_size > num_nodes:
        return -1
    return num_gpus // node_size


def per_node(shape: Shaped) -> int:
    """GPUs the shape holds on each node it is placed on."""
    return shape.num_gpus if shape.whole_nodes == 0 else shape.num_gpus // shape.whole_nodes


def gpus_per_node(shape: Shaped) -> tuple[int, ...]:
    """The GPUs it holds on each of its nodes: one node, or ``whole_nodes`` full ones."""
    return (shape.num_gpus,) if shape.whole_nodes == 0 else (per_node(shape),) * shape.whole_nodes


def can_host(shape: Shaped, node_gpus: int, node_size: int) -> bool:
    """Whether a node of ``node_gpus`` GPUs (on a type whose largest node has ``node_size``) can ever hold
    the shape's part."""
    return node_gpus >= shape.num_gpus if shape.whole_nodes == 0 else node_gpus == node_size


def choose(shape: Shaped, free: Mapping[int, int], node_size: int) -> tuple[int, ...] | None:
    """The nodes the shape takes now given the free GPUs per node of its type (only the nodes it may use:
    a caller leaves out nodes that are down), or None if it does not fit."""
    if shape.whole_nodes == 0:
        best: tuple[int, int] | None = None
        for node, left in free.items():
            if left >= shape.num_gpus and (best is None or (left, node) < best):
                best = (left, node)
        return None if best is None else (best[1],)
    empty = sorted(node for node, left in free.items() if left == node_size)
    return tuple(empty[: shape.whole_nodes]) if len(empty) >= shape.whole_nodes else None


def refusal(
    shape: Shaped, nodes: Iterable[int], free: Mapping[int, int], node_size: int, name: Callable[[int], str] = str
) -> str | None:
    """Why the rule does not admit the shape on ``nodes`` now (a node listed twice, too many or too few nodes,
    a node without room, a whole-node part on a partly used node), or None if it does; ``name`` spells a
    node index in the reason."""
    nodes = list(nodes)
    want = shape.whole_nodes or 1
    if len(set(nodes)) != len(nodes):
        twice = next(n for n in nodes if nodes.count(n) > 1)
        return f"node {name(twice)} is listed twice"
    if len(nodes) != want:
        return f"{len(nodes)} nodes, the rule takes {want}"
    part = per_node(shape)
    for node in nodes:
        left = free.get(node, 0)
        if left < part or (shape.whole_nodes and left != node_size):
            return f"node {name(node)} has {left} free GPUs, the placement needs {part}" + (
                f" on a wholly free node of {node_size}" if shape.whole_nodes else ""
            )
    return None


class FreeIndex:
    """Free GPUs per node of one GPU type, bucketed by free count, each bucket's nodes in ascending order:
    :meth:`fit` is :func:`choose` in O(S) (S: GPUs per node) without a pass over the nodes; a change moves one node
    between two buckets (a bisection and a list insertion, O(nodes) at C speed)."""

    def __init__(self, sizes: Mapping[int, int]) -> None:
        """``sizes``: GPUs per node of the type's nodes, all free at first."""
        self.size = max(sizes.values())
        self.free = dict(sizes)
        self.buckets: list[list[int]] = [[] for _ in range(self.size + 1)]
        for node, left in sorted(self.free.items()):
            self.buckets[left].append(node)
        self.count = sum(self.free.values())
        """Free GPUs of the type in all."""
        self.version = 0
        """Changes so far (what was derived from the index at one version holds until the next)."""

    def change(self, node: int, delta: int) -> None:
        """``delta`` more free GPUs on ``node`` (negative: taken)."""
        self.count += delta
        self.version += 1
        left = self.free[node]
        bucket = self.buckets[left]
        del bucket[bisect.bisect_left(bucket, node)]
        self.free[node] = left + delta
        bisect.insort(self.buckets[left + delta], node)

    def fit(self, shape: Shaped) -> tuple[int, ...] | None:
        if shape.whole_nodes == 0:
            for left in range(shape.num_gpus, self.size + 1):  # the tightest bucket that fits
                if self.buckets[left]:
                    return (self.buckets[left][0],)
            return None
        empty = self.buckets[self.size]
        if len(empty) < shape.whole_nodes:
            return None
        return tuple(empty[: shape.whole_nodes])
