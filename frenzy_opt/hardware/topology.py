"""Cluster topology: a networkx graph of nodes, GPUs and links built from a cluster file (contract 2).

Graph vertices: ``("gpu", node, k)`` for GPU ``k`` of node ``node``, ``("node", node)`` for each server's
internal switch (NVLink/NVSwitch or the PCIe root complex) and ``("network",)`` for the inter-node fabric.
Edges carry ``gbyte_s``, the wire bandwidth per direction in GB/s, and ``share`` and ``link_class``, the share
of it a large NCCL collective measurably reaches on the link's class (:mod:`frenzy_opt.hardware.collectives`):
GPU–node edges the GPU's intra-node link (half the bidirectional figure its spec sheet states), node–network
edges the node's NICs together (``nics_per_node x nic_gbps / 8``, with ``nics`` and ``nic_gbyte_s`` on the
edge). A node vertex carries ``nvlink_domain``, the GPUs its NVLink fabric reaches (a node, or a GB200 NVL72
rack). :func:`links_for` reads the links a GPU type's plans see from this graph; it is the one place the
step-time model gets its bandwidths.

The scheduler's placement rules live here too, shared by every solver so their schedules compare: a plan of
``n <= gpus_per_node`` GPUs runs inside one node (tensor-parallel groups never cross nodes); a larger plan
takes ``n / gpus_per_node`` whole nodes of its GPU type (data-parallel and pipeline groups on the fewest
nodes).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import networkx as nx

from frenzy_opt.hardware import collectives
from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.hardware.collectives import LinkShare
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
# (data/collectives.yaml, pcie_gen3_no_p2p, with its citation; collectives.share("pcie_gen3_no_p2p") reads the
# same figure, a test checks they agree).
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
    """The links of one GPU type's nodes: wire rates in GB/s per direction and the share of them a large NCCL
    collective measurably reaches (:mod:`frenzy_opt.hardware.collectives`: nccl-tests bus bandwidth over the
    wire, per link class)."""

    intra_node_gbyte_s: float
    """GPU to GPU inside a node or NVLink domain (NVLink or PCIe), per GPU: the wire rate."""
    intra_node_share: float
    """The measured all-reduce bus bandwidth share of the intra-node link's class (host-staged PCIe boards:
    :data:`HOST_STAGED_FRACTION`)."""
    nic_gbyte_s: float = 0.0
    """All NICs of one node together (0: a single node, nothing crosses a network): the wire rate."""
    nic_share: float
    """The measured all-reduce bus bandwidth share of the NICs' class, over all of a node's NICs."""
    intra_node_class: str = ""
    """The link class (data/collectives.yaml) the intra-node share is measured on or falls back from."""
    nic_class: str = ""
    gpus_per_node: int = 8
    nvlink_domain: int = 0
    """GPUs sharing one NVLink fabric (0: one node)."""
    pcie: bool = False
    """The intra-node link is PCIe (not NVLink)."""
    host_staged: bool = False
    """Intra-node traffic goes through host memory (PCIe boards without peer-to-peer, ``GpuType.pcie_p2p``):
    its share is :data:`HOST_STAGED_FRACTION`."""

    @property
    def domain(self) -> int:
        return max(self.nvlink_domain, self.gpus_per_node)

    @property
    def intra_node_latency_s(self) -> float:
        """A collective call's fixed time inside the node (:data:`NVLINK_LATENCY_S`, :data:`PCIE_LATENCY_S`)."""
        return PCIE_LATENCY_S if self.pcie else NVLINK_LATENCY_S

    def intra_node_bytes_s(self, multiplier: float = 1.0) -> float:
        """Bytes per second per direction a large intra-node collective or send reaches: the wire rate times
        the measured share, times ``multiplier`` (``StepTimeModel.link_efficiency``, 1 = as measured)."""
        return self.intra_node_gbyte_s * 1e9 * self.intra_node_share * multiplier

    def nic_bytes_s(self, multiplier: float = 1.0) -> float:
        """Bytes per second per direction a node's NICs together reach in a large collective (as
        :meth:`intra_node_bytes_s`)."""
        return self.nic_gbyte_s * 1e9 * self.nic_share * multiplier

    @staticmethod
    def for_gpu(
        gpu: GpuType,
        *,
        inter_node_gbit_s: float | None = None,
        nics_per_node: int | None = None,
        gpus_per_node: int = 8,
        intra_node: str | None = None,
        nvlink_domain: int = 0,
        intra_node_spec_gbyte_s: float | None = None,
    ) -> Links:
        """Links of ``gpu``'s nodes: ``inter_node_gbit_s`` is Gbit/s per node (all NICs; None: one node only)
        over ``nics_per_node`` NICs (None: one per GPU, the DGX reference designs), whose speed picks the
        network's class (:func:`collectives.network_class`); ``intra_node="pcie"`` overrides an NVLink part's
        default (a PCIe-only server), and ``intra_node_spec_gbyte_s`` both: the intra-node figure as a spec
        sheet states it (bidirectional), for a server whose own words give it (an A800's or H800's NVLink
        capped at 400 GB/s, an NVLink bridge between PCIe boards)."""
        if intra_node_spec_gbyte_s is not None:
            spec = intra_node_spec_gbyte_s
        else:
            spec = gpu.pcie_gbyte_s if intra_node == "pcie" else gpu.intra_node_gbyte_s
        link = intra_node or gpu.intra_node
        # A server whose own figure is given (an NVLink bridge, a capped NVLink) is not plain PCIe.
        pcie = link == "pcie" and intra_node_spec_gbyte_s is None
        bridged = link == "pcie" and intra_node_spec_gbyte_s is not None
        intra = _intra_share(gpu, link, bridged, gpus_per_node, nvlink_domain)
        nic_gbit_s = (inter_node_gbit_s or 0.0) / (nics_per_node or gpus_per_node)
        network = _network_share(nic_gbit_s)
        return Links(
            intra_node_gbyte_s=spec / 2,
            intra_node_share=intra.share,
            intra_node_class=intra.link_class,
            nic_gbyte_s=(inter_node_gbit_s or 0.0) / 8,
            nic_share=network.share,
            nic_class=network.link_class,
            gpus_per_node=gpus_per_node,
            nvlink_domain=nvlink_domain,
            pcie=pcie,
            host_staged=pcie and not gpu.pcie_p2p,
        )


@functools.cache
def _intra_share(gpu: GpuType, link: str, bridged: bool, gpus_per_node: int, nvlink_domain: int) -> LinkShare:
    """The measured share of ``gpu``'s intra-node link (:func:`collectives.intra_node_class`), computed once per
    argument tuple: :meth:`Links.for_gpu` runs in plan searches. A host-staged board's class is a no-P2P PCIe
    one, whose share is :data:`HOST_STAGED_FRACTION`."""
    name = collectives.intra_node_class(
        gpu, link=link, bridged=bridged, gpus_per_node=gpus_per_node, nvlink_domain=nvlink_domain
    )
    return collectives.share(name)


@functools.cache
def _network_share(nic_gbit_s: float) -> LinkShare:
    """The measured share of a network of ``nic_gbit_s`` Gbit/s NICs (:func:`collectives.network_class`)."""
    return collectives.share(collectives.network_class(nic_gbit_s))


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
                nics_per_node=group.nics_per_node,
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
                    share=links.nic_share,
                    link_class=links.nic_class,
                    nics=group.nics_per_node,
                    nic_gbyte_s=links.nic_gbyte_s / group.nics_per_node,
                )
                for k in range(node.num_gpus):
                    self.graph.add_node(("gpu", node.index, k), kind="gpu", gpu_type=node.gpu.name)
                    self.graph.add_edge(("gpu", node.index, k), ("node", node.index),
                                        gbyte_s=links.intra_node_gbyte_s, share=links.intra_node_share,
                                        link_class=links.intra_node_class, host_staged=links.host_staged,
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
        network = self.graph.edges[("node", node), ("network",)]
        return Links(
            intra_node_gbyte_s=float(edge["gbyte_s"]),
            intra_node_share=float(edge["share"]),
            intra_node_class=str(edge["link_class"]),
            host_staged=bool(edge["host_staged"]),
            pcie=bool(edge["pcie"]),
            nic_gbyte_s=float(network["gbyte_s"]),
            nic_share=float(network["share"]),
            nic_class=str(network["link_class"]),
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
