"""The hardware a step-time calibration row names in its own words: the catalogue GPU types of its ``gpu``
cell (:data:`GPU_WORDS`; a stated stand-in for a type the catalogue lacks, :data:`GPU_FALLBACK`) and the
links its ``interconnect`` cell describes (:func:`links_of`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from frenzy_opt.hardware.gpus import GpuType, lookup_gpu
from frenzy_opt.hardware.topology import Links
from frenzy_opt.prediction.flops import peak_tflops

# GPU words of the calibration format -> catalogue names, most specific first.
GPU_WORDS = (
    ("GB200", "GB200"),
    ("GH200", "GH200"),
    ("H800", "H800-SXM5-80GB"),
    ("H200", "H200-SXM-141GB"),
    ("H100 96GB", "H100-SXM5-96GB"),
    ("H100-PCIE", "H100-PCIE-80GB"),
    ("H100", "H100-SXM5-80GB"),
    ("A800", "A800-SXM4-80GB"),
    ("A100-SXM4-40GB", "A100-SXM4-40GB"),
    ("40GB", "A100-SXM4-40GB"),
    ("A100", "A100-SXM4-80GB"),
    ("V100-SXM3", "V100-SXM3-32GB"),
    ("V100-16GB", "V100-SXM2-16GB"),
    ("V100", "V100-SXM2-32GB"),
    ("T4", "T4"),
    ("RTX-3090", "RTX-3090"),
    ("Titan-RTX", "TITAN-RTX"),
    # The calibration file's "RTX-2080" rows are Sailor's, whose RTX-2080 is an RTX 2080 Ti (11 GB in Sailor's
    # GPU-memory table; gpus.yaml's note on RTX-2080).
    ("RTX-2080", "RTX-2080Ti"),
)


# Catalogue fall-backs for GPU types the catalogue may lack: the part whose compute and memory they share.
GPU_FALLBACK = {
    "H100-SXM5-96GB": "H100-SXM5-80GB",
    "V100-SXM3-32GB": "V100-SXM2-32GB",
    "TITAN-RTX": "RTX-2080Ti",
}


# Reference node designs for networks a source names without numbers: eight single-port compute NICs per
# node, one per GPU -- DGX A100: 8 x 200 Gbit/s HDR InfiniBand (NVIDIA DGX A100 User Guide, "Hardware
# Overview"); DGX H100: 8 x 400 Gbit/s NDR (NVIDIA DGX H100 User Guide, "Hardware Overview"); DGX-2(H):
# 8 x 100 Gbit/s EDR (NVIDIA DGX-2 datasheet), which is the blog's "100 GB/s inter-server".
REFERENCE_NIC_GBPS = {"ampere": 200.0, "hopper": 400.0, "blackwell": 400.0, "volta": 100.0}


# GB200 NVL72: 72 GPUs in one NVLink domain (NVIDIA GB200 NVL72 product page).
NVL72_DOMAIN = 72


def gpu_names(text: str) -> list[str]:
    """Catalogue names of the GPU types a ``gpu`` cell names, in order of appearance."""
    found: list[tuple[int, str]] = []
    taken: list[tuple[int, int]] = []
    for word, name in GPU_WORDS:
        for match in re.finditer(re.escape(word), text, flags=re.IGNORECASE):
            span = (match.start(), match.end())
            if any(a < span[1] and span[0] < b for a, b in taken):
                continue
            taken.append(span)
            found.append((span[0], name))
    return list(dict.fromkeys(name for _, name in sorted(found)))


def catalogue_gpu(name: str) -> tuple[GpuType, str | None]:
    """The catalogue entry for ``name``, or its stated stand-in (with the assumption made)."""
    try:
        return lookup_gpu(name), None
    except ValueError:
        stand_in = GPU_FALLBACK.get(name)
        if stand_in is None:
            raise
        return lookup_gpu(stand_in), f"{name} is not in the catalogue: priced as {stand_in}"


def slowest_gpu(gpus: Sequence[GpuType], precision: str) -> GpuType:
    """The GPU type with the least peak for the run's number format (then the least HBM bandwidth)."""
    return min(gpus, key=lambda g: (peak_tflops(g, precision), g.hbm_gbyte_s))


def links_of(interconnect: str, gpu: GpuType, gpus_per_node: int, intra: str) -> tuple[Links, list[str]]:
    """The links a row's ``interconnect`` words describe (module docstring), and the assumptions made.

    Per-node figures are taken as per node and per-GPU ones times the GPUs of a node; an InfiniBand speed
    with no count on an NVLink server is per NIC with one NIC per GPU (the DGX reference designs,
    :data:`REFERENCE_NIC_GBPS`); a network named without a speed gets its reference design's."""
    low = interconnect.lower()
    notes: list[str] = []
    domain = NVL72_DOMAIN if "nvl" in low and "domain" in low else 0
    nics, nic_gbit_s = 1, 0.0
    per_node = re.search(r"(\d+)\s*x\s*(\d+)\s*gb/s", low)
    speeds = [(float(m.group(1)), m.group(0)) for m in re.finditer(r"(\d+(?:\.\d+)?)\s*gb/s", low)]
    gigabytes = re.search(r"(\d+)\s*gb/s inter-server", interconnect.lower().replace("GB/s", "gb/s"))
    if per_node:
        nics, nic_gbit_s = int(per_node.group(1)), float(per_node.group(2))
    elif "per gpu" in low and speeds:
        nics, nic_gbit_s = gpus_per_node, speeds[-1][0]
    elif gigabytes and "GB/s inter-server" in interconnect:
        nics, nic_gbit_s = 8, float(gigabytes.group(1)) * 8 / 8
        notes.append("100 GB/s inter-server read as 8 x 100 Gbit/s EDR NICs (DGX-2 datasheet)")
    elif "infiniband" in low or "rdma" in low:
        stated = [s for s, text in speeds if "gb/s" in text and not re.search(rf"{int(s)}\s*gb/s", low.split(";")[0])]
        if stated and "nvlink" in low:
            nics, nic_gbit_s = gpus_per_node, stated[-1]
            notes.append(f"InfiniBand {stated[-1]:g} Gbit/s read as one NIC per GPU (DGX reference design)")
        elif stated:
            nic_gbit_s = stated[-1]
        else:
            nics, nic_gbit_s = gpus_per_node, REFERENCE_NIC_GBPS.get(gpu.architecture, 200.0)
            notes.append(f"network not detailed: {nics} x {nic_gbit_s:g} Gbit/s (DGX reference design)")
    elif speeds and ("inter-node" in low or "+" in low):
        nic_gbit_s = min(s for s, _ in speeds)  # the slowest node's network
    elif "single" in low or ("nvlink/nvswitch" in low and "inter" not in low):
        nic_gbit_s = 0.0
    else:
        nic_gbit_s = 100.0
        notes.append("inter-node network not stated: 1 x 100 Gbit/s assumed")
    capped = "400 gb/s" in low.split(";")[0] and "nvlink" in low  # A800/H800: NVLink at 400 GB/s (the row's words)
    links = Links.for_gpu(
        gpu,
        inter_node_gbit_s=nics * nic_gbit_s,
        nics_per_node=nics,
        gpus_per_node=gpus_per_node,
        intra_node=intra,
        nvlink_domain=domain,
        intra_node_spec_gbyte_s=400.0 if capped else None,
    )
    return links, notes
