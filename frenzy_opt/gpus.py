"""The GPU catalogue: public spec-sheet figures per GPU type, loaded from ``data/gpus.yaml``.

Hardware numbers live here and only here; formulas elsewhere take a :class:`GpuType`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from importlib import resources
from typing import Any

import yaml


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuType:
    """One GPU model. TFLOPs are dense tensor-core peaks (fp32: plain CUDA-core peak); bandwidths in GB/s."""

    name: str
    aliases: tuple[str, ...]
    architecture: str
    memory_bytes: int
    memory_type: str
    hbm_gbps: float
    bf16_tflops: float | None
    fp16_tflops: float
    fp32_tflops: float
    tf32_tflops: float | None
    fp8_tflops: float | None
    form_factor: str
    intra_node: str
    nvlink_gbps: float | None
    pcie_gbps: float
    intra_node_gbps: float
    tdp_w: float
    source: str
    notes: str

    def supports(self, precision: str) -> bool:
        """Whether the GPU has tensor cores for ``precision`` (fp32 and fp16 run everywhere)."""
        if precision == "bf16":
            return self.bf16_tflops is not None
        if precision == "fp8":
            return self.fp8_tflops is not None
        return True

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["aliases"] = list(self.aliases)
        return out


@functools.cache
def load_gpus() -> dict[str, GpuType]:
    """All GPU types by canonical name, in catalogue order."""
    text = resources.files("frenzy_opt").joinpath("data/gpus.yaml").read_text(encoding="utf-8")
    gpus = {}
    for entry in yaml.safe_load(text)["gpus"]:
        entry = dict(entry)
        entry["aliases"] = tuple(str(a) for a in entry.get("aliases") or ())
        entry["notes"] = str(entry.get("notes") or "")
        gpus[entry["name"]] = GpuType(**entry)
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
    """A GPU type by name or alias (case-insensitive); ``ValueError`` lists the valid names."""
    key = _index().get(str(name).strip().lower())
    if key is None:
        raise ValueError(f"gpu: unknown GPU type {name!r}; allowed: {', '.join(load_gpus())}")
    return load_gpus()[key]
