"""Cluster topology: a networkx graph of nodes, GPUs and links built from a cluster file (contract 2).

Graph vertices: ``("gpu", node, k)`` for GPU ``k`` of node ``node``, ``("node", node)`` for each server's
internal switch (NVLink/NVSwitch or the PCIe root complex) and ``("network",)`` for the inter-node fabric.
Edges carry ``gbs``, the bandwidth per direction in GB/s: GPU–node edges the GPU's intra-node link (half the
bidirectional figure its spec sheet states), node–network edges the node's NIC (``inter_node_gbps`` / 8).

The scheduler's placement rules live here too, shared by every solver so their schedules compare: a plan of
``n <= gpus_per_node`` GPUs runs inside one node (tensor-parallel groups never cross nodes); a larger plan
takes ``n / gpus_per_node`` whole nodes of its GPU type (data-parallel and pipeline groups on the fewest
nodes).
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from frenzy_opt.cluster import ClusterSpec
from frenzy_opt.gpus import GpuType


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """One server: ``num_gpus`` GPUs of one type."""

    index: int
    name: str
    gpu: GpuType
    num_gpus: int
    intra_node: str


class Topology:
    """Nodes and links of a cluster, with the queries the solvers need."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        self.nodes: list[Node] = []
        self.graph = nx.Graph()
        network_gbs = cluster.inter_node_gbps / 8
        self.graph.add_node(("network",), kind="network")
        for group_index, group in enumerate(cluster.node_groups):
            intra_gbs = (group.gpu.pcie_gbps if group.intra_node == "pcie" else group.gpu.intra_node_gbps) / 2
            for i in range(group.num_nodes):
                node = Node(
                    index=len(self.nodes),
                    name=f"{group.gpu.name}-g{group_index}-n{i}",
                    gpu=group.gpu,
                    num_gpus=group.gpus_per_node,
                    intra_node=group.intra_node,
                )
                self.nodes.append(node)
                self.graph.add_node(("node", node.index), kind="node", gpu_type=node.gpu.name)
                self.graph.add_edge(("node", node.index), ("network",), gbs=network_gbs)
                for k in range(node.num_gpus):
                    self.graph.add_node(("gpu", node.index, k), kind="gpu", gpu_type=node.gpu.name)
                    self.graph.add_edge(("gpu", node.index, k), ("node", node.index), gbs=intra_gbs)
        self._by_type: dict[str, list[int]] = {}
        for node in self.nodes:
            self._by_type.setdefault(node.gpu.name, []).append(node.index)

    @property
    def gpu_types(self) -> list[str]:
        return list(self._by_type)

    def nodes_of(self, gpu_type: str) -> list[int]:
        """Node indices of one GPU type."""
        return self._by_type.get(gpu_type, [])

    def num_gpus_of(self, gpu_type: str) -> int:
        return sum(self.nodes[i].num_gpus for i in self.nodes_of(gpu_type))

    def free_gpus(self, used: dict[int, int]) -> dict[str, dict[int, int]]:
        """Free GPUs per type and node, given the GPUs ``used`` per node."""
        return {
            gpu_type: {i: self.nodes[i].num_gpus - used.get(i, 0) for i in indices}
            for gpu_type, indices in self._by_type.items()
        }

    def nodes_needed(self, gpu_type: str, num_gpus: int) -> int:
        """Whole nodes a plan of ``num_gpus`` takes (0: it fits inside one node), or -1 if the placement rule
        admits it nowhere (more than one node's worth but not a whole number of nodes)."""
        size = max((self.nodes[i].num_gpus for i in self.nodes_of(gpu_type)), default=0)
        if num_gpus <= size:
            return 0
        if num_gpus % size or num_gpus // size > len(self.nodes_of(gpu_type)):
            return -1
        return num_gpus // size

    def best_nodes(self, gpu_type: str, num_gpus: int, free: dict[int, int]) -> list[int] | None:
        """The nodes a plan of ``num_gpus`` GPUs should take now, or None if it cannot start.

        Inside one node: best fit, the node with the fewest free GPUs that still fit (keeps large blocks
        free). Across nodes: the required number of wholly free nodes, lowest index first.
        """
        whole = self.nodes_needed(gpu_type, num_gpus)
        if whole < 0:
            return None
        if whole == 0:
            fitting = [(left, i) for i, left in free.items() if left >= num_gpus and self.nodes[i].num_gpus >= num_gpus]
            return [min(fitting)[1]] if fitting else None
        empty = [i for i, left in free.items() if left == self.nodes[i].num_gpus]
        return sorted(empty)[:whole] if len(empty) >= whole else None

    def slowest_link_gbs(self, nodes: list[int]) -> float:
        """The slowest link (GB/s per direction) on the paths between the GPUs of a placement."""
        if len(set(nodes)) <= 1:
            node = nodes[0]
            return float(self.graph.edges[("gpu", node, 0), ("node", node)]["gbs"])
        return float(
            min(
                min(
                    self.graph.edges[("gpu", n, 0), ("node", n)]["gbs"],
                    self.graph.edges[("node", n), ("network",)]["gbs"],
                )
                for n in nodes
            )
        )
