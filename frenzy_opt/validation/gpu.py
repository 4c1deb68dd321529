"""Measure the same training steps on a CUDA GPU: the three totals MARP predicts.

``torch.cuda.max_memory_allocated`` and ``max_memory_reserved`` after a steady-state step, and the device
memory nvidia-smi reports for this GPU. Used by ``benchmarks/gpu_memory.py`` on a machine with a GPU to
compare with MARP and calibrate the CUDA-only terms (:class:`frenzy_opt.prediction.marp.cuda.CudaTerms`).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

import torch

from frenzy_opt.core.spec import JobSpec
from frenzy_opt.validation.harness import build_rank, check_supported, megatron_optimizer, run_step

MIB = 2**20


@dataclass(frozen=True, slots=True, kw_only=True)
class CudaMeasurement:
    stage: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    device_used_bytes: int | None
    """nvidia-smi's ``memory.used`` after the step (the caching allocator keeps its reserve), or None."""


def nvidia_smi_used_bytes(index: int) -> int | None:
    """``memory.used`` of GPU ``index`` as nvidia-smi reports it (MiB), or None without nvidia-smi."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={index}", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return int(out.strip().splitlines()[0]) * MIB


def measure_cuda(job: JobSpec, *, stage: int = 0, steps: int = 2, device: int = 0) -> CudaMeasurement:
    """Peak memory of rank ``stage`` of ``job`` over ``steps`` steady-state steps on CUDA device ``device``."""
    check_supported(job)
    torch.cuda.set_device(device)
    torch.cuda.empty_cache()
    with torch.device(f"cuda:{device}"):
        model, in_flight = build_rank(job, stage)
        optimizer, _buffers = megatron_optimizer(model, job)
        optimizer.step()  # the optimizer states exist from here on, as in a running job
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        for _ in range(steps):
            run_step(model, job, in_flight, optimizer)
        torch.cuda.synchronize()
        allocated = torch.cuda.max_memory_allocated()
        reserved = torch.cuda.max_memory_reserved()
        used = nvidia_smi_used_bytes(device)
    del model, optimizer, _buffers
    torch.cuda.empty_cache()
    return CudaMeasurement(
        stage=stage, peak_allocated_bytes=allocated, peak_reserved_bytes=reserved, device_used_bytes=used
    )
