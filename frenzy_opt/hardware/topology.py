"""Cluster topology: a networkx graph of nodes, GPUs and links built from a cluster file (contract 2).

Graph vertices: ``("gpu", node, k)`` for GPU ``k`` of node ``node``, ``("node", node)`` for each server's
internal switch (NVLink/NVSwitch or the PCIe root complex) and ``("network",)`` for the inter-node fabric.
Edges carry ``gbs``, the bandwidth per direction in GB/s: GPU–node edges the GPU's intra-node link (half the
bidirectional figure its spec sheet states), node–network edges the node's NICs together (``nics_per_node x
nic_gbps / 8``, with ``nics`` and ``nic_gbs`` on the edge). A node vertex carries ``nvlink_domain``, the GPUs
its NVLink fabric reaches (a node, or a GB200 NVL72 rack). :func:`links_for` reads the links a GPU type's
plans see from this graph; it is the one place the step-time model gets its bandwidths.

The scheduler's placement rules live here too, shared by every solver so their schedules compare: a plan of
``n <= gpus_per_node`` GPUs runs inside one node (tensor-parallel groups never cross nodes); a larger plan
takes ``n / gpus_per_node`` whole nodes of its GPU type (data-parallel and pipeline groups on the fewest
nodes).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import networkx as nx

from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.hardware.gpus import GpuType
from frenzy_opt.hardware.placement import Shape, choose, whole_nodes_for


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """One server: ``num_gpus`` GPUs of one type."""

    index: int
    name: str
    gpu: GpuType
    num_gpus: int
    intra_node: str


# All-reduce bus bandwidth over the link's per-direction rate when PCIe boards cannot exchange data peer to
# peer: 4.0 GB/s measured on two RTX 2080 Ti over PCIe Gen3 x16 (16 GB/s), nccl-tests all_reduce_perf at 1 GiB
# (data/collectives.yaml, pcie_gen3_no_p2p, with its citation).
HOST_STAGED_FRACTION = 4.0 / 16.0

# The time of a small-message all-reduce (nccl-tests, data/collectives.yaml, each with its citation): what
# every collective call or pipeline send pays before its bytes. NVLink: 8 x H100 on NVSwitch, 25.6 us (1 KiB
# row of Azure's ND H100 v5 table); PCIe: 8 x RTX 4090, 42.1 us (8 B, nccl issue #1530); across nodes:
# 16 ranks on 2 nodes of 8 x 400 Gb/s InfiniBand NDR, 46.3 us (16 B, nccl issue #1244).
NVLINK_LATENCY_S = 25.6e-6
PCIE_LATENCY_S = 42.1e-6
NETWORK_LATENCY_S = 46.3e-6


@dataclass(frozen=True, slots=True, kw_only=True)
class Links:
    """The links of one GPU type's nodes, in GB/s per direction, before ``link_efficiency``."""

    intra_node_gbyte_s: float
    """GPU to GPU inside a node or NVLink domain (NVLink or PCIe), per GPU."""
    nic_gbyte_s: float = 0.0
    """All NICs of one node together (0: a single node, nothing crosses a network)."""
    gpus_per_node: int = 8
    nvlink_domain: int = 0
    """GPUs sharing one NVLink fabric (0: one node)."""
    pcie: bool = False
    """The intra-node link is PCIe (not NVLink)."""
    host_staged: bool = False
    """Intra-node traffic goes through host memory (PCIe boards without peer-to-peer, ``GpuType.pcie_p2p``):
    it reaches :data:`HOST_STAGED_FRACTION` of the link, whatever ``link_efficiency`` says."""

    @property
    def domain(self) -> int:
        return max(self.nvlink_domain, self.gpus_per_node)

    @property
    def intra_node_latency_s(self) -> float:
        """A collective call's fixed time inside the node (:data:`NVLINK_LATENCY_S`, :data:`PCIE_LATENCY_S`)."""
        return PCIE_LATENCY_S if self.pcie else NVLINK_LATENCY_S

    def intra_node_bytes_s(self, efficiency: float) -> float:
        """Bytes per second per direction an intra-node collective or send reaches at ``efficiency``."""
        share = HOST_STAGED_FRACTION if self.host_staged else efficiency
        return self.intra_node_gbyte_s * 1e9 * share

    @staticmethod
    def for_gpu(
        gpu: GpuType,
        *,
        inter_node_gbit_s: float | None = None,
        gpus_per_node: int = 8,
        intra_node: str | None = None,
        nvlink_domain: int = 0,
        intra_node_spec_gbyte_s: float | None = None,
    ) -> Links:
        """Links of ``gpu``'s nodes: ``inter_node_gbit_s`` is Gbit/s per node (all NICs; None: one node only);
        ``intra_node="pcie"`` overrides an NVLink part's default (a PCIe-only server), and
        ``intra_node_spec_gbyte_s`` both: the intra-node figure as a spec sheet states it (bidirectional), for a
        server whose own words give it (an A800's or H800's NVLink capped at 400 GB/s)."""
        if intra_node_spec_gbyte_s is not None:
            spec = intra_node_spec_gbyte_s
        else:
            spec = gpu.pcie_gbyte_s if intra_node == "pcie" else gpu.intra_node_gbyte_s
        # A server whose own figure is given (an NVLink bridge, a capped NVLink) is not plain PCIe.
        pcie = (intra_node or gpu.intra_node) == "pcie" and intra_node_spec_gbyte_s is None
        return Links(
            intra_node_gbyte_s=spec / 2,
            nic_gbyte_s=(inter_node_gbit_s or 0.0) / 8,
            gpus_per_node=gpus_per_node,
            nvlink_domain=nvlink_domain,
            pcie=pcie,
            host_staged=pcie and not gpu.pcie_p2p,
        )


class Topology:
    """Nodes and links of a cluster, with the queries the solvers need."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        self.nodes: list[Node] = []
        self.graph = nx.Graph()
        self.graph.add_node(("network",), kind="network")
        for group_index, group in enumerate(cluster.node_groups):
            links = Links.for_gpu(
                group.gpu,
                inter_node_gbit_s=group.inter_node_gbit_s,
                gpus_per_node=group.gpus_per_node,
                intra_node=group.intra_node,
                nvlink_domain=group.domain_gpus,
            )
            for i in range(group.num_nodes):
                node = Node(
                    index=len(self.nodes),
                    name=f"{group.gpu.name}-g{group_index}-n{i}",
                    gpu=group.gpu,
                    num_gpus=group.gpus_per_node,
                    intra_node=group.intra_node,
                )
                self.nodes.append(node)
                self.graph.add_node(
                    ("node", node.index), kind="node", gpu_type=node.gpu.name, nvlink_domain=group.domain_gpus
                )
                self.graph.add_edge(
                    ("node", node.index),
                    ("network",),
                    gbyte_s=links.nic_gbyte_s,
                    nics=group.nics_per_node,
                    nic_gbyte_s=links.nic_gbyte_s / group.nics_per_node,
                )
                for k in range(node.num_gpus):
                    self.graph.add_node(("gpu", node.index, k), kind="gpu", gpu_type=node.gpu.name)
                    self.graph.add_edge(("gpu", node.index, k), ("node", node.index),
                                        gbyte_s=links.intra_node_gbyte_s, host_staged=links.host_staged,
                                        pcie=links.pcie)  # fmt: skip
        self._by_type: dict[str, list[int]] = {}
        for node in self.nodes:
            self._by_type.setdefault(node.gpu.name, []).append(node.index)
        self._node_size = {t: max(self.nodes[i].num_gpus for i in nodes) for t, nodes in self._by_type.items()}

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
        return whole_nodes_for(num_gpus, self.node_size(gpu_type), len(self.nodes_of(gpu_type)))

    def node_size(self, gpu_type: str) -> int:
        """GPUs of the type's largest node (0 if the cluster has none)."""
        return self._node_size.get(gpu_type, 0)

    def best_nodes(self, gpu_type: str, num_gpus: int, free: dict[int, int]) -> list[int] | None:
        """The nodes a plan of ``num_gpus`` GPUs takes now by the placement rule
        (:mod:`frenzy_opt.hardware.placement`), or None if it cannot start."""
        whole = self.nodes_needed(gpu_type, num_gpus)
        if whole < 0:
            return None
        nodes = choose(Shape(num_gpus, whole), free, self.node_size(gpu_type))
        return None if nodes is None else list(nodes)

    def links(self, gpu_type: str) -> Links:
        """The links a plan on ``gpu_type`` sees, read from the graph (the type's largest node)."""
        indices = self.nodes_of(gpu_type)
        if not indices:
            raise KeyError(f"no node of GPU type {gpu_type} in cluster {self.cluster.name}")
        node = max(indices, key=lambda i: self.nodes[i].num_gpus)
        edge = self.graph.edges[("gpu", node, 0), ("node", node)]
        return Links(
            intra_node_gbyte_s=float(edge["gbyte_s"]),
            host_staged=bool(edge["host_staged"]),
            pcie=bool(edge["pcie"]),
            nic_gbyte_s=float(self.graph.edges[("node", node), ("network",)]["gbyte_s"]),
            gpus_per_node=self.nodes[node].num_gpus,
            nvlink_domain=int(self.graph.nodes[("node", node)]["nvlink_domain"]),
        )


@functools.lru_cache(maxsize=64)
def topology_of(cluster: ClusterSpec) -> Topology:
    """One :class:`Topology` per cluster spec (specs are immutable)."""
    return Topology(cluster)


def links_for(cluster: ClusterSpec, gpu_type: str) -> Links:
    """The links of ``gpu_type``'s nodes in ``cluster`` (:meth:`Topology.links`)."""
    return topology_of(cluster).links(gpu_type)
