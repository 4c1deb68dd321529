"""Measured achievable kernel throughput per GPU type, beside the spec-sheet peaks of :mod:`gpus`.

``data/kernel-throughput.yaml`` holds, per catalogue GPU type, the largest dense matmul rate a shape search
measured (bf16, fp16, fp8, tf32, fp32), the device-memory bandwidth a STREAM-like copy measured, and
FlashAttention forward(+backward) rates per kernel, head dimension and sequence length; every figure cites
its table (docs/kernel-throughput-sources.md), and a figure derived from a sibling's measured/peak ratio says
so (``derived_from``). :func:`achievable` answers for every type and format: the file's figure, else this
type's spec peak times the measured/peak ratio of the measured types of its architecture (of all types when
its architecture has none), flagged in :attr:`Achievable.derived`.
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass
from importlib import resources
from typing import Any

from frenzy_opt.core.enums import Precision
from frenzy_opt.hardware.gpus import GpuType, load_gpus
from frenzy_opt.yamlload import load_yaml

FORMATS = ("bf16", "fp16", "fp8", "tf32", "fp32")


@dataclass(frozen=True, slots=True)
class FlashPoint:
    """One measured FlashAttention rate (TFLOP/s as the FlashAttention benchmarks count them: causal
    attention does half the FLOPs of full attention, the backward 2.5x the forward)."""

    implementation: str
    head_dim: int | None
    seq_len: int | None
    causal: bool | None
    fwd_tflops: float | None
    fwd_bwd_tflops: float | None


@dataclass(frozen=True, slots=True)
class Achievable:
    """What one GPU type reaches in practice: TFLOP/s per format, device-memory GB/s, FlashAttention points."""

    gpu: str
    matmul_tflops: dict[str, float]
    hbm_gbyte_s: float
    flash: tuple[FlashPoint, ...]
    derived: frozenset[str]
    """The figures not measured on this type: ``matmul_tflops.<format>`` or ``hbm_gbyte_s``, derived from a
    sibling (the data file) or from the architecture's measured/peak ratio (:func:`achievable`)."""

    def matmul(self, precision: str) -> float:
        """Dense matmul TFLOP/s for ``precision`` (fp32 trains on tf32 tensor cores where they exist; a format
        without tensor cores runs at fp16's rate, as :func:`frenzy_opt.prediction.flops.peak_tflops`)."""
        if precision == Precision.FP32 and "tf32" in self.matmul_tflops:
            return self.matmul_tflops["tf32"]
        if precision in self.matmul_tflops:
            return self.matmul_tflops[precision]
        return self.matmul_tflops["fp16"]


def _peak(gpu: GpuType, fmt: str) -> float | None:
    value = {"bf16": gpu.bf16_tflops, "fp16": gpu.fp16_tflops, "fp8": gpu.fp8_tflops, "tf32": gpu.tf32_tflops,
             "fp32": gpu.fp32_tflops}[fmt]  # fmt: skip
    return float(value) if value else None


@functools.cache
def _table() -> dict[str, dict[str, Any]]:
    text = resources.files("frenzy_opt").joinpath("data/kernel-throughput.yaml").read_text(encoding="utf-8")
    gpus: dict[str, dict[str, Any]] = load_yaml(text)["gpus"]
    return gpus


def _measured(entry: dict[str, Any]) -> tuple[dict[str, float], float | None, set[str]]:
    derived = {str(d["figure"]) for d in entry.get("derived_from") or []}
    matmul = {str(k): float(v) for k, v in (entry.get("matmul_tflops") or {}).items() if v}
    hbm = entry.get("hbm_gbyte_s")
    return matmul, float(hbm) if hbm else None, derived


@functools.cache
def _ratios() -> dict[tuple[str, str], float]:
    """Median measured/peak ratio per (architecture or "*", figure) over the figures measured (not derived)."""
    pools: dict[tuple[str, str], list[float]] = {}
    gpus = load_gpus()
    for name, entry in _table().items():
        gpu = gpus.get(name)
        if gpu is None:
            continue
        matmul, hbm, derived = _measured(entry)
        figures: dict[str, tuple[float | None, float | None]] = {
            f"matmul_tflops.{k}": (v, _peak(gpu, k)) for k, v in matmul.items()
        }
        figures["hbm_gbyte_s"] = (hbm, gpu.hbm_gbyte_s)
        for figure, (value, peak) in figures.items():
            if value and peak and figure not in derived:
                for key in (gpu.architecture, "*"):
                    pools.setdefault((key, figure), []).append(value / peak)
    return {key: statistics.median(values) for key, values in pools.items()}


def _ratio(architecture: str, figure: str) -> float:
    ratios = _ratios()
    return ratios.get((architecture, figure), ratios[("*", figure)])


@functools.cache
def achievable(gpu: GpuType) -> Achievable:
    """The achievable figures of ``gpu`` (module docstring); CPU slot types get their spec figures."""
    entry = _table().get(gpu.name, {})
    matmul, hbm, derived = _measured(entry)
    if gpu.architecture == "cpu":
        return Achievable(gpu.name, {"fp16": gpu.fp16_tflops, "fp32": gpu.fp32_tflops}, gpu.hbm_gbyte_s, (),
                          frozenset({"matmul_tflops.fp16", "matmul_tflops.fp32", "hbm_gbyte_s"}))  # fmt: skip
    for fmt in FORMATS:
        peak = _peak(gpu, fmt)
        if fmt not in matmul and peak is not None:
            matmul[fmt] = peak * _ratio(gpu.architecture, f"matmul_tflops.{fmt}")
            derived.add(f"matmul_tflops.{fmt}")
    if hbm is None:
        hbm = gpu.hbm_gbyte_s * _ratio(gpu.architecture, "hbm_gbyte_s")
        derived.add("hbm_gbyte_s")
    flash = tuple(
        FlashPoint(
            implementation=str(p["implementation"]),
            head_dim=p.get("head_dim"),
            seq_len=p.get("seq_len"),
            causal=p.get("causal"),
            fwd_tflops=p.get("fwd_tflops"),
            fwd_bwd_tflops=p.get("fwd_bwd_tflops"),
        )
        for p in entry.get("flash_attention") or []
    )
    return Achievable(gpu.name, matmul, hbm, flash, frozenset(derived))
