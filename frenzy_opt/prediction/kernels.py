"""Kernel times from measured throughput: GEMMs by shape, FlashAttention, memory-bound passes.

The step-time model prices a micro-batch as the kernels it runs, each on what the GPU type was measured to
reach (:mod:`frenzy_opt.hardware.throughput`), not as FLOPs over a fitted efficiency:

* **GEMM** ``(m, n, k)``: a roofline (Williams et al. 2009) of its math and its operand traffic. The math runs
  in tiles of ``TILE`` output elements per SM, one wave of ``sm_count`` tiles at a time, so a GEMM pays for
  its partial tiles and its last partial wave (tile and wave quantization, NVIDIA "Matrix Multiplication
  Background User's Guide", sections "Tile Quantization" and "Wave Quantization"); when there are fewer
  tiles than SMs and ``k`` is long, the library splits ``k`` over the idle SMs (split-K / stream-K: Osama
  et al. 2023), as cuBLAS's heuristics do. The per-SM rate is the measured large-GEMM rate over the SMs, so a
  large well-shaped GEMM takes exactly its FLOPs over the measured rate.
* **FlashAttention** at the rate measured for the kernel the runtime uses, the nearest head dimension and
  causal setting (FlashAttention's own benchmark tables); where a GPU type has no such table, its matmul rate
  times the ratio of attention to matmul rate measured on its architecture's reference part.
* **Memory-bound kernels** (norms, activations, residuals, casts, optimizer) as bytes over the measured
  device-memory bandwidth.

Every kernel also pays :data:`LAUNCH_S`, so a model of a few million parameters is not priced as if its
hundreds of small kernels cost only their FLOPs.
"""

from __future__ import annotations

import functools
import math

from frenzy_opt.core.runtime_profile import profile
from frenzy_opt.hardware.gpus import GpuType, load_gpus
from frenzy_opt.hardware.throughput import Achievable, FlashPoint, achievable

# A kernel's floor: the GPU-side time of an empty kernel plus its launch, a few microseconds on every
# generation (CUDA C++ Best Practices Guide, "Kernel launch overhead": about 5 us per launch).
LAUNCH_S = 5e-6

# Output tile per thread block of the large-GEMM kernels cuBLAS/CUTLASS pick: 128 x 128 before Hopper,
# 128 x 256 on Hopper's and Blackwell's warp-group MMA kernels (CUTLASS 3 default tile shapes for SM90/SM100;
# NVIDIA's matrix-multiplication guide uses 128 x 128 and 256 x 128 tiles in its quantization examples).
TILE = {"hopper": (128, 256), "blackwell": (128, 256)}
DEFAULT_TILE = (128, 128)
# The least k per split when a GEMM splits k over idle SMs: each split must still fill a pipelined main loop
# of several 64-deep k-tiles (CUTLASS mainloop stages).
MIN_SPLIT_K = 512

# The reference part whose attention/matmul ratio stands in for a GPU type without its own attention table.
FLASH_REFERENCE = {
    "ampere": "A100-SXM4-80GB",
    "ada": "A100-SXM4-80GB",
    "hopper": "H100-SXM5-80GB",
    "blackwell": "H100-SXM5-80GB",
}
# FlashAttention-2's forward-and-backward rate over its forward-only rate at the same shape, measured on
# H100 (head dim 128, causal, seq 4k: 294 over 319 TFLOP/s; data/kernel-throughput.yaml): stands in where a
# table gives only the forward (the FlashAttention-3 and cuDNN rows).
FWD_BWD_OVER_FWD = 294.0 / 319.0


def gemm_s(m: float, n: float, k: float, *, tflops: float, hbm_gbyte_s: float, gpu: GpuType, operand_bytes: float,
           out_bytes: float) -> float:  # fmt: skip
    """Seconds of one ``m x k`` by ``k x n`` GEMM on ``gpu`` at ``tflops`` (the measured large-GEMM rate of its
    format) and ``hbm_gbyte_s`` (module docstring)."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    sms = gpu.sm_count or 1
    tile_m, tile_n = TILE.get(gpu.architecture, DEFAULT_TILE)
    tiles = math.ceil(m / tile_m) * math.ceil(n / tile_n)
    splits = 1
    if tiles < sms:
        splits = max(1, min(sms // tiles, int(k // MIN_SPLIT_K)))
    waves = math.ceil(tiles * splits / sms)
    per_sm = tflops * 1e12 / sms
    math_s = waves * 2.0 * tile_m * tile_n * (k / splits) / per_sm
    traffic = (m * k + k * n) * operand_bytes + m * n * out_bytes
    return max(math_s, traffic / (hbm_gbyte_s * 1e9)) + LAUNCH_S


@functools.lru_cache(maxsize=65536)
def gemms_s(gemms: tuple[tuple[float, float, float, float], ...], gpu: GpuType, tflops: float, hbm_gbyte_s: float,
            operand_bytes: float, out_bytes: float) -> float:  # fmt: skip
    """Seconds of ``(m, n, k, count)`` GEMMs (:func:`gemm_s` each); cached, as a plan search prices the same
    layer shapes at many data-parallel degrees."""
    return sum(
        count * gemm_s(m, n, k, tflops=tflops, hbm_gbyte_s=hbm_gbyte_s, gpu=gpu, operand_bytes=operand_bytes,
                       out_bytes=out_bytes)
        for m, n, k, count in gemms
    )  # fmt: skip


def memory_s(nbytes: float, rates: Achievable, kernels: float = 0.0) -> float:
    """Seconds of memory-bound kernels moving ``nbytes`` in ``kernels`` launches."""
    return nbytes / (rates.hbm_gbyte_s * 1e9) + kernels * LAUNCH_S


def _nearest(points: list[FlashPoint], head_dim: int, seq_len: int) -> FlashPoint | None:
    """The causal point (training's attention is causal) of the nearest head dimension, then sequence length."""
    if not points:
        return None
    return min(
        points,
        key=lambda p: (p.causal is False, abs((p.head_dim or head_dim) - head_dim),
                       abs(math.log((p.seq_len or seq_len) / seq_len))),
    )  # fmt: skip


def _fwd_bwd(point: FlashPoint) -> float | None:
    if point.fwd_bwd_tflops:
        return float(point.fwd_bwd_tflops)
    if point.fwd_tflops:
        return float(point.fwd_tflops) * FWD_BWD_OVER_FWD
    return None


def measured_flash_tflops(rates: Achievable, kernel: str, head_dim: int, seq_len: int) -> float | None:
    """The forward-and-backward FlashAttention rate ``rates`` has for ``kernel`` near ``head_dim`` and
    ``seq_len``."""
    point = _nearest([p for p in rates.flash if p.implementation == kernel and _fwd_bwd(p)], head_dim, seq_len)
    return _fwd_bwd(point) if point is not None else None


@functools.lru_cache(maxsize=4096)
def flash_tflops(gpu: GpuType, runtime: str, head_dim: int, seq_len: int, precision: str) -> float:
    """FlashAttention's forward-and-backward rate for ``runtime`` on ``gpu`` (module docstring)."""
    # cuDNN's fused attention where the runtime's profile runs it (``cudnn_attention_architectures``), else
    # FlashAttention-2.
    kernel = "cuDNN" if gpu.architecture in profile(runtime).cudnn_attention_architectures else "FA2"

    def measured(rates: Achievable) -> float | None:
        own = measured_flash_tflops(rates, kernel, head_dim, seq_len)
        return own if own is not None else measured_flash_tflops(rates, "FA2", head_dim, seq_len)

    rates = achievable(gpu)
    own = measured(rates)
    if own is not None:
        return own
    reference = achievable(load_gpus()[FLASH_REFERENCE.get(gpu.architecture, "A100-SXM4-80GB")])
    ref = measured(reference)
    assert ref is not None, "the reference parts have FlashAttention tables"
    sixteen = "bf16" if precision in ("bf16", "fp8") else "fp16"
    return rates.matmul(sixteen) * ref / reference.matmul("bf16")
