"""Measured NCCL bus bandwidth per link class (``data/collectives.yaml``) and the share of the wire it reaches.

``data/collectives.yaml`` (sources and caveats: docs/collectives-sources.md) holds published nccl-tests
figures per link class: NVLink generations, NVLink bridges, PCIe with and without peer-to-peer, InfiniBand,
RoCE and cloud fabrics. Its conventions (the file's header): the bus bandwidth (busbw) is nccl-tests' (doc/
PERFORMANCE.md) -- the algorithm bandwidth ``bytes / time`` times ``2 (n-1)/n`` for an all-reduce, ``(n-1)/n``
for an all-gather, reduce-scatter and all-to-all, 1 for send/recv -- in GB/s (1e9 bytes/s); ``bus_gbyte_s``
is the large-message plateau (or the largest size the source ran); a ``null`` or ``status: missing`` means
the source measured nothing; ``derived: true`` marks arithmetic on a cited figure.

:func:`measurements` gives a class's large-message busbw per collective, :func:`share` its all-reduce busbw
over the class's per-direction wire rate (:func:`wire_gbyte_s`): what a large collective reaches of the link,
the figure :class:`frenzy_opt.hardware.topology.Links` carries and the step-time model prices collectives
with. A ring all-reduce's busbw is bounded by the per-direction link rate, so that share is at most 1.
NVLink SHARP (NVLS) is not: the switch does the reduction, and its busbw exceeds the link (478.9 GB/s on
H100's 450). Where a source gives both, the ring figure (``ring_bus_gbyte_s``, NCCL_NVLS_ENABLE=0) is used,
because the model prices every collective as a ring (or rings) over the link; an NVLS figure without a ring
one is not used. A cloud fabric's multi-node busbw can exceed its NICs the same way (AWS p5, 2 nodes: 477.7
GB/s on 400, NCCL's tree algorithms crossing the network less than a ring); no link maps to those classes.

A class without an all-reduce measurement takes its nearest measured sibling's share (:data:`FALLBACK`),
flagged in :attr:`LinkShare.fallback`. :func:`intra_node_class` and :func:`network_class` map a catalogue GPU
type's intra-node link and a node's NICs to a class.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from frenzy_opt.hardware.gpus import GpuType, lookup_gpu

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "sendrecv", "broadcast", "reduce")

# The wire a GPU-side class was measured on, per direction: half the bidirectional figure of the catalogue
# entry of the measured setup's GPU (data/gpus.yaml; its `setup.gpu` and description in data/collectives.yaml).
# The RTX 5090 is not in the catalogue: its PCIe Gen5 x16 is the H100 PCIe's (gpus.yaml pcie_gbps 128).
WIRE_OF_GPU_LINK = {
    "nvlink3_a100_nvswitch": ("A100-SXM4-80GB", "intra_node_gbyte_s"),
    "nvlink4_h100_nvswitch": ("H100-SXM5-80GB", "intra_node_gbyte_s"),
    "nvlink5_b200_nvswitch": ("B200-SXM-180GB", "intra_node_gbyte_s"),
    "nvlink5_gb200_4gpu_tray": ("GB200-186GB", "intra_node_gbyte_s"),
    "nvlink_bridge_h100_pcie_2gpu": ("H100-PCIE-80GB", "nvlink_gbyte_s"),
    "nvlink_bridge_turing_2gpu": ("RTX-2080Ti", "nvlink_gbyte_s"),
    "pcie_gen3_no_p2p": ("RTX-2080Ti", "pcie_gbyte_s"),
    "pcie_gen5_consumer_8gpu": ("H100-PCIE-80GB", "pcie_gbyte_s"),
}
# The wire of a network class: Gbit/s per node, all NICs together (NICs x Gbit/s per NIC), of the measured setup
# (data/collectives.yaml: each class's `setup` and description; InfiniBand EDR and HDR are 100 and 200 Gbit/s
# per port by their names there). The all-reduce runs over all of a node's NICs; per direction it is / 8.
WIRE_OF_NETWORK = {
    "ib_edr_100g": 1 * 100.0,
    "ib_hdr_200g_4nic": 4 * 200.0,
    "roce_200g_1nic_gb10": 1 * 200.0,
    "roce_400g": 1 * 400.0,
    "aws_efa_p5_3200g": 32 * 100.0,
    "aws_efa_p5en_3200g": 3200.0,
    "aws_efa_p6_b200_3200g": 8 * 400.0,
    "gcp_a3_mega_tcpxo": 8 * 200.0,
}

# The nearest measured sibling of each class the step-time model reaches without an all-reduce figure of its
# own (data/collectives.yaml says why each is missing). Volta's NVLink2 (no public 8-GPU table) takes
# Ampere's NVSwitch node, the closest NVLink generation measured; GB200 NVL72 (a vendor slide's 680 GB/s ring,
# second-hand) the measured 4-GPU GB200 tray of the same NVLink5; a data-centre PCIe board with peer-to-peer
# (no public table) the 8 x RTX 5090 PCIe node, the one PCIe measurement with P2P (ACS disabled); the 8 x
# RTX 4090 node (no plateau retrievable; its driver disables P2P) the other host-staged PCIe class; InfiniBand
# NDR (the large-size rows not retrievable) and XDR (no measurement) HDR, the fastest InfiniBand measured.
FALLBACK = {
    "nvlink2_v100_dgx1": "nvlink3_a100_nvswitch",
    "nvlink2_v100_dgx2_nvswitch": "nvlink3_a100_nvswitch",
    "nvlink5_gb200_nvl72": "nvlink5_gb200_4gpu_tray",
    "pcie_gen4_datacenter_p2p": "pcie_gen5_consumer_8gpu",
    "pcie_gen4_consumer_8gpu": "pcie_gen3_no_p2p",
    "ib_ndr_400g_8nic": "ib_hdr_200g_4nic",
    "ib_xdr_800g": "ib_hdr_200g_4nic",
}

# The NVLink class of each architecture's 8-GPU server (data/collectives.yaml descriptions); an NVLink part
# of another architecture is priced as Ampere's, the middle generation.
NVLINK_CLASS = {
    "volta": "nvlink2_v100_dgx1",
    "ampere": "nvlink3_a100_nvswitch",
    "hopper": "nvlink4_h100_nvswitch",
    "blackwell": "nvlink5_b200_nvswitch",
}
DEFAULT_NVLINK_CLASS = "nvlink3_a100_nvswitch"
# InfiniBand classes by the speed of one NIC, Gbit/s (EDR 100, HDR 200, NDR 400, XDR 800). A network slower
# than 100 Gbit/s per NIC (Ethernet: no published nccl-tests table) is priced as EDR, the slowest measured.
NETWORK_CLASS_BY_GBIT_S = ((100.0, "ib_edr_100g"), (200.0, "ib_hdr_200g_4nic"), (400.0, "ib_ndr_400g_8nic"))
FASTEST_NETWORK_CLASS = "ib_xdr_800g"


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """One collective's large-message bus bandwidth on one link class, as the yaml cites it."""

    link_class: str
    collective: str
    bus_gbyte_s: float
    """Busbw, GB/s: the ring figure where the source gives NVLS and ring (module docstring)."""
    wire_gbyte_s: float
    """The class's per-direction wire rate (:func:`wire_gbyte_s`)."""
    ranks: int | None
    algo: str
    citation: str
    locator: str

    @property
    def share(self) -> float:
        """Busbw over the wire rate (above 1: not a wire rate, module docstring)."""
        return self.bus_gbyte_s / self.wire_gbyte_s


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkShare:
    """The all-reduce busbw share a link class is priced at."""

    link_class: str
    measured_class: str
    """The class whose measurement gives the share (``link_class`` unless :attr:`fallback`)."""
    share: float
    fallback: bool
    """No all-reduce measurement of ``link_class``: the share is its sibling's (:data:`FALLBACK`)."""


@functools.cache
def _classes() -> dict[str, dict[str, Any]]:
    text = resources.files("frenzy_opt").joinpath("data/collectives.yaml").read_text(encoding="utf-8")
    classes: dict[str, dict[str, Any]] = yaml.safe_load(text)["link_classes"]
    return classes


def link_classes() -> list[str]:
    """Every link class of the yaml, in its order."""
    return list(_classes())


def wire_gbyte_s(link_class: str) -> float:
    """Per-direction wire rate in GB/s of a ``link_class`` with a measurement: a GPU link's from the catalogue
    (:data:`WIRE_OF_GPU_LINK`), a network's Gbit/s per node / 8 (:data:`WIRE_OF_NETWORK`)."""
    if link_class in WIRE_OF_GPU_LINK:
        name, attribute = WIRE_OF_GPU_LINK[link_class]
        return float(getattr(lookup_gpu(name), attribute)) / 2
    if link_class in WIRE_OF_NETWORK:
        return WIRE_OF_NETWORK[link_class] / 8
    known = sorted([*WIRE_OF_GPU_LINK, *WIRE_OF_NETWORK])
    raise ValueError(f"link class {link_class!r} has no measured wire rate; known: {known}")


def _bus_figure(entry: dict[str, Any]) -> float | None:
    """The entry's wire figure: the ring busbw where given, else the headline busbw unless it is NVLS."""
    if entry.get("ring_bus_gbyte_s") is not None:
        return float(entry["ring_bus_gbyte_s"])
    algo = str(entry.get("algo") or "").split()
    if entry.get("bus_gbyte_s") is None or (algo and algo[0] == "NVLS"):
        return None
    return float(entry["bus_gbyte_s"])


@functools.cache
def measurements(link_class: str) -> dict[str, Measurement]:
    """``link_class``'s measured large-message busbw by collective (:data:`COLLECTIVES`; absent: not
    measured, or only NVLS). A class flagged ``status`` (missing, vendor_slide_only) as a whole has none."""
    classes = _classes()
    if link_class not in classes:
        raise ValueError(f"unknown link class {link_class!r}; known: {sorted(classes)}")
    entry = classes[link_class]
    if entry.get("status"):
        return {}
    out = {}
    for name, data in (entry.get("collectives") or {}).items():
        figure = _bus_figure(data)
        if figure is None:
            continue
        ring = data.get("ring_bus_gbyte_s") is not None
        out[str(name)] = Measurement(
            link_class=link_class,
            collective=str(name),
            bus_gbyte_s=figure,
            wire_gbyte_s=wire_gbyte_s(link_class),
            ranks=data.get("ranks"),
            algo="Ring" if ring else str(data.get("algo") or ""),
            citation=str(data.get("ring_citation" if ring else "citation") or entry.get("citation") or ""),
            locator=str(data.get("ring_locator" if ring else "locator") or ""),
        )
    return out


@functools.cache
def share(link_class: str) -> LinkShare:
    """The all-reduce busbw share of ``link_class`` (module docstring), else its sibling's, flagged."""
    measured = measurements(link_class).get("all_reduce")
    if measured is not None:
        return LinkShare(link_class=link_class, measured_class=link_class, share=measured.share, fallback=False)
    if link_class not in FALLBACK:
        raise ValueError(f"link class {link_class!r} has no all-reduce measurement and no sibling in FALLBACK")
    sibling = share(FALLBACK[link_class])
    return LinkShare(link_class=link_class, measured_class=sibling.measured_class, share=sibling.share, fallback=True)


def intra_node_class(gpu: GpuType, *, link: str, bridged: bool, gpus_per_node: int, nvlink_domain: int) -> str:
    """The link class of ``gpu``'s intra-node link: ``link`` is ``"nvlink"`` or ``"pcie"``; ``bridged``, a
    PCIe server whose own figure is given (an NVLink bridge: the GeForce pair measured for boards without
    peer-to-peer, the H100 PCIe pair for the others); an NVLink domain beyond the node is a GB200 NVL72 rack
    on Blackwell, four GPUs a GB200 tray; PCIe boards without peer-to-peer are host-staged (Gen3 boards, the
    measured pair, else the 8 x RTX 4090 node), the others the data-centre P2P class."""
    if link == "pcie" and bridged:
        return "nvlink_bridge_h100_pcie_2gpu" if gpu.pcie_p2p else "nvlink_bridge_turing_2gpu"
    if link == "pcie":
        if gpu.pcie_p2p:
            return "pcie_gen4_datacenter_p2p"
        return "pcie_gen3_no_p2p" if gpu.pcie_gbyte_s <= 32 else "pcie_gen4_consumer_8gpu"
    if gpu.architecture == "blackwell" and nvlink_domain > gpus_per_node:
        return "nvlink5_gb200_nvl72"
    if gpu.architecture == "blackwell" and gpus_per_node <= 4:
        return "nvlink5_gb200_4gpu_tray"
    if gpu.architecture == "volta" and gpus_per_node > 8:
        return "nvlink2_v100_dgx2_nvswitch"
    return NVLINK_CLASS.get(gpu.architecture, DEFAULT_NVLINK_CLASS)


def network_class(nic_gbit_s: float) -> str:
    """The InfiniBand class of a NIC of ``nic_gbit_s`` Gbit/s (:data:`NETWORK_CLASS_BY_GBIT_S`)."""
    for limit, name in NETWORK_CLASS_BY_GBIT_S:
        if nic_gbit_s <= limit:
            return name
    return FASTEST_NETWORK_CLASS
