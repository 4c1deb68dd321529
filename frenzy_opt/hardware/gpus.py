"""The GPU catalogue: public spec-sheet figures per GPU type, loaded from ``data/gpus.yaml``.

Hardware numbers live here and only here; formulas elsewhere take a :class:`GpuType`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, fields
from importlib import resources
from typing import Any

from frenzy_opt.core.enums import Precision
from frenzy_opt.yamlload import load_yaml


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuType:
    """One GPU model. TFLOPs are dense tensor-core peaks (fp32: plain CUDA-core peak); bandwidths in GB/s."""

    name: str
    """Canonical name (what plans and cluster files print)."""
    aliases: tuple[str, ...] = ()
    """Other names that resolve to this type: lower case, unique over the catalogue."""
    architecture: str
    """GPU architecture in lower case (e.g. ampere, hopper; cpu for the CPU slot type): it selects the
    step-time model's efficiencies and whether FlashAttention runs."""
    memory_bytes: int
    """Device memory in bytes (what nvidia-smi reports as total where the catalogue says so)."""
    memory_type: str
    """Device memory technology (HBM2, HBM3, GDDR6, ...)."""
    hbm_gbyte_s: float
    """Device-memory bandwidth, decimal GB/s (GDDR parts too, despite the key's name)."""
    bf16_tflops: float | None
    """Dense bf16 tensor-core peak (None: no bf16 tensor cores)."""
    fp16_tflops: float
    """Dense fp16 tensor-core peak."""
    fp32_tflops: float
    """Plain fp32 peak on the CUDA cores (not tensor cores)."""
    tf32_tflops: float | None
    """Dense tf32 tensor-core peak (None: no tf32 tensor cores)."""
    fp8_tflops: float | None
    """Dense fp8 tensor-core peak (None: no fp8 tensor cores)."""
    form_factor: str
    """sxm (an NVLink-attached module), pcie (a board) or cpu."""
    intra_node: str
    """The link a node of this type uses between its GPUs unless the cluster file says otherwise (nvlink or
    pcie)."""
    nvlink_gbyte_s: float | None
    """Per-GPU NVLink bandwidth, bidirectional aggregate as the sheet states it (None: no NVLink)."""
    pcie_gbyte_s: float
    """Host interface bandwidth, bidirectional aggregate."""
    intra_node_gbyte_s: float
    """What the planner assumes between two GPUs of one node: the NVLink figure for SXM parts, the PCIe one
    for PCIe boards (bridges are optional, so not assumed)."""
    tdp_w: float
    """Board or module maximum power in watts."""
    source: str
    """The public document the figures come from."""
    notes: str = ""
    """How figures were derived from the source, and caveats."""
    pcie_p2p: bool = True
    """Whether two of these boards exchange data peer to peer over PCIe (False: GeForce/TITAN boards, whose
    collectives NCCL stages through host memory; :class:`frenzy_opt.hardware.topology.Links`)."""
    sm_count: int | None = None
    """Streaming multiprocessors (None: not a GPU): how many GEMM tiles run at once (wave quantization,
    :mod:`frenzy_opt.prediction.kernels`)."""

    def supports(self, precision: str) -> bool:
        """Whether the GPU has tensor cores for ``precision`` (fp32 and fp16 run everywhere)."""
        if precision == Precision.BF16:
            return self.bf16_tflops is not None
        if precision == Precision.FP8:
            return self.fp8_tflops is not None
        return True

    def to_dict(self) -> dict[str, Any]:
        """The catalogue entry under its file's keys (contract 3's ``frenzy catalog gpus``)."""
        out = {KEY_OF_FIELD.get(f.name, f.name): getattr(self, f.name) for f in fields(self)}
        out["aliases"] = list(self.aliases)
        return out


# data/gpus.yaml and contract 3 name bandwidths ``*_gbps`` (GB/s); the attributes say their unit.
KEY_OF_FIELD = {
    "hbm_gbyte_s": "hbm_gbps",
    "nvlink_gbyte_s": "nvlink_gbps",
    "pcie_gbyte_s": "pcie_gbps",
    "intra_node_gbyte_s": "intra_node_gbps",
}
FIELD_OF_KEY = {key: name for name, key in KEY_OF_FIELD.items()}


@functools.cache
def load_gpus() -> dict[str, GpuType]:
    """All GPU types by canonical name, in catalogue order."""
    text = resources.files("frenzy_opt").joinpath("data/gpus.yaml").read_text(encoding="utf-8")
    gpus = {}
    for entry in load_yaml(text)["gpus"]:
        entry = dict(entry)
        entry["aliases"] = tuple(str(a) for a in entry.get("aliases") or ())
        entry["notes"] = str(entry.get("notes") or "")
        gpus[entry["name"]] = GpuType(**{FIELD_OF_KEY.get(str(k), str(k)): v for k, v in entry.items()})
    return gpus


@functools.cache
def _index() -> dict[str, str]:
    index = {}
    for gpu in load_gpus().values():
        index[gpu.name.lower()] = gpu.name
        for alias in gpu.aliases:
            index[alias.lower()] = gpu.name
    return index


def lookup_gpu(name: str) -> GpuType:
    """A GPU type by name (:func:`resolve_gpu`, the one resolver of the CLI, cluster files, scenarios and the
    data files alike)."""
    return resolve_gpu(name)


def _tokens(name: str) -> frozenset[str]:
    return frozenset(t for t in re.split(r"[\s_-]+", name.strip().lower()) if t)


def gpu_candidates(name: str) -> list[GpuType]:
    """The types ``name`` may mean: the one whose catalogue name or alias it is (case-insensitive), else every
    type one of whose names holds every word of ``name`` (words split at spaces, ``-`` and ``_``)."""
    gpus = load_gpus()
    exact = _index().get(str(name).strip().lower())
    if exact is not None:
        return [gpus[exact]]
    wanted = _tokens(str(name))
    return [gpu for gpu in gpus.values() if wanted and any(wanted <= _tokens(n) for n in (gpu.name, *gpu.aliases))]


def resolve_gpu(name: str, field: str = "gpu") -> GpuType:
    """The GPU type a user or a file named. The rule: a catalogue name or alias (case-insensitive) always
    resolves; any other name must match exactly one type by its words (:func:`gpu_candidates`). A family
    name that several parts share (``v100``, ``a100``, ``h100``: memory sizes and form factors that plan
    differently) is no alias, so it is an error listing the parts, on the CLI and in files alike; so is an
    unknown name, listing every type. ``field`` names where the name came from in the message."""
    matches = gpu_candidates(name)
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ValueError(
            f"{field}: {name!r} is ambiguous; it matches {', '.join(g.name for g in matches)} (give one of these names)"
        )
    raise ValueError(f"{field}: unknown GPU type {name!r}; allowed: {', '.join(load_gpus())}")
