"""Seconds of the step's collectives and point-to-point sends over a placement's links.

What the step-time model (:mod:`frenzy_opt.prediction.steptime`, whose docstring states the link model)
charges for communication: an all-reduce inside one NVLink domain runs a ring over the intra-node link; one
across nodes the faster of a flat ring and a hierarchical all-reduce, as NCCL would pick (Patarasuk & Yuan
2009; NVIDIA nccl-tests PERFORMANCE.md, "bus bandwidth"); every call pays the link's measured small-message
latency; pipeline sends and MoE all-to-alls share the node's NICs. Links come from
:func:`frenzy_opt.hardware.topology.links_for` (:class:`~frenzy_opt.hardware.topology.Links`).
"""

from __future__ import annotations

from frenzy_opt.hardware.topology import NETWORK_LATENCY_S, Links

__all__ = ["all_to_all_s", "collective_s", "latency_s", "p2p_s"]


def _ring_factor(ranks: int) -> float:
    """Bytes a ring all-reduce moves per rank, per byte of buffer: 2 (n-1)/n (Patarasuk & Yuan 2009)."""
    return 2 * (ranks - 1) / ranks if ranks > 1 else 0.0


def collective_s(links: Links, nbytes: float, group: int, stride: int, efficiency: float) -> float:
    """Seconds of an all-reduce of ``nbytes`` per rank over ``group`` ranks whose consecutive members are
    ``stride`` GPUs apart in the rank order (a reduce-scatter or all-gather is half of it), each link at its
    measured bus-bandwidth share times ``efficiency`` (``StepTimeModel.link_efficiency``).

    Inside one NVLink domain: a ring over the intra-node link. Across nodes: the faster of a flat ring (every
    ring link carries ``2 (n-1)/n`` of the buffer; a node's NICs carry that for each group it hosts) and a
    hierarchical all-reduce (reduce-scatter among the ``k`` members of a node, a ring of the ``1/k`` shards
    across the ``N`` nodes, all-gather back), each node's NICs shared by all its GPUs' groups."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    intra = links.intra_node_bytes_s(efficiency)
    if group * stride <= links.domain or links.nic_gbyte_s <= 0:
        return _ring_factor(group) * nbytes / intra
    nic = links.nic_bytes_s(efficiency)
    per_node = max(1, min(group, links.gpus_per_node // max(stride, 1)))
    nodes = max(group // per_node, 1)
    groups_per_node = links.gpus_per_node / per_node
    ring = max(_ring_factor(group) * nbytes / intra, groups_per_node * _ring_factor(group) * nbytes / nic)
    hierarchical = _ring_factor(per_node) * nbytes / intra + (
        links.gpus_per_node * _ring_factor(nodes) * nbytes / per_node / nic
    )
    return min(ring, hierarchical)


def latency_s(links: Links, group: int, stride: int) -> float:
    """The fixed time of one collective call over ``group`` ranks ``stride`` apart: the intra-node link's
    small-message latency inside one NVLink domain or node, the network's across nodes (topology's measured
    nccl-tests figures)."""
    if group <= 1:
        return 0.0
    if group * stride <= links.domain or links.nic_gbyte_s <= 0:
        return links.intra_node_latency_s
    return NETWORK_LATENCY_S


def p2p_s(links: Links, nbytes: float, crosses_nodes: bool, efficiency: float) -> float:
    """A point-to-point send: over NVLink/PCIe inside a node, else over the node's NICs, which every GPU of
    the node uses at once in the pipeline's steady state."""
    if nbytes <= 0:
        return 0.0
    if crosses_nodes and links.nic_gbyte_s > 0:
        return nbytes / (links.nic_bytes_s(efficiency) / links.gpus_per_node)
    return nbytes / links.intra_node_bytes_s(efficiency)


def all_to_all_s(links: Links, nbytes: float, group: int, stride: int, efficiency: float) -> float:
    """An all-to-all of ``nbytes`` per rank: ``(n-1)/n`` of it leaves the GPU, the share whose peers sit on
    other nodes through the NICs (shared by the node's GPUs)."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    out = nbytes * (group - 1) / group
    intra = out / links.intra_node_bytes_s(efficiency)
    if group * stride <= links.domain or links.nic_gbyte_s <= 0:
        return intra
    per_node = max(1, min(group, links.gpus_per_node // max(stride, 1)))
    off_node = nbytes * (group - per_node) / group
    return max(intra, off_node * links.gpus_per_node / links.nic_bytes_s(efficiency))
