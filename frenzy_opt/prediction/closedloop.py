"""The closed loop: what real runs measured, against what MARP and the step-time model predicted for the
same plan, and the recalibration of the per-GPU-type efficiency factors from those runs.

A :class:`Sample` is one finished attempt: its job spec at the plan's parallel config, the GPU type and the
links of its placement, the measured median step time (warm-up step excluded) and per-rank peak memory.
:func:`recalibrate` refits, per ``GPU@precision`` with samples, the achievable efficiency of the step-time
model to minimise the mean relative step-time error (:func:`fit_relative`) and reports that error before
and after. :func:`memory_errors` compares measured peak memory with MARP's
``peak_allocated_bytes`` where the measurement is of the same quantity (``torch.cuda`` peak allocated bytes
on GPU, MemTracker's peak live tensor storage on CPU); a process's resident set size is not.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Any

from frenzy_opt.core.spec import JobSpec, plan_layout
from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.hardware.gpus import GpuType, lookup_gpu
from frenzy_opt.hardware.topology import links_for
from frenzy_opt.prediction.steptime import Links, StepTimeModel, step_terms

COMPARABLE_MEMORY = ("MemTracker", "torch.cuda.max_memory_allocated")


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    job_id: str
    spec: JobSpec
    gpu: GpuType
    precision: str
    links: Links
    step_time_s: float
    peak_memory_bytes: tuple[int, ...]
    memory_source: str
    predicted_peak_bytes: int

    @property
    def key(self) -> str:
        return f"{self.gpu.name}@{self.precision}"


def sample_of(
    job_id: str,
    spec: JobSpec,
    plan: dict[str, Any],
    measured: dict[str, Any],
    cluster: ClusterSpec,
) -> Sample | None:
    """The sample of a finished run from its stored plan and measurement (None without a step time)."""
    if not measured or not measured.get("step_time_s") or not plan:
        return None
    job = spec.with_parallel(*plan_layout(plan))
    job = replace(job, training=replace(job.training, precision=plan["precision"]))
    gpu = lookup_gpu(plan["gpu_type"])
    links = links_for(cluster, gpu.name)
    return Sample(
        job_id=job_id,
        spec=job,
        gpu=gpu,
        precision=plan["precision"],
        links=links,
        step_time_s=float(measured["step_time_s"]),
        peak_memory_bytes=tuple(int(b) for b in measured.get("peak_memory_bytes") or ()),
        memory_source=str(measured.get("memory_source") or ""),
        predicted_peak_bytes=int(plan["peak_allocated_bytes"]),
    )


def predicted_step_s(sample: Sample, model: StepTimeModel) -> float:
    return step_terms(sample.spec).evaluate(sample.gpu, sample.links, model).total_s


def _mean_error(samples: list[Sample], model: StepTimeModel) -> float:
    return statistics.fmean(abs(predicted_step_s(s, model) / s.step_time_s - 1) for s in samples)


def fit_relative(samples: list[Sample], model: StepTimeModel) -> float:
    """The efficiency of ``samples``' GPU type (and precision) minimising the mean relative step-time error.

    An absolute squared error would let the slowest run dominate; runs of one type but very different sizes
    (a tiny model's steps are mostly fixed overhead) need every run weighed alike. The error is unimodal in
    log(efficiency) for one sample and close to it for several: a log-spaced scan of (1e-5, 1] then
    golden-section refinement around the best point; the current efficiency is a candidate too, so the fit
    never does worse than the model it starts from.
    """
    gpu, precision = samples[0].gpu, samples[0].precision
    terms = [(step_terms(s.spec), s) for s in samples]

    def error(log_eff: float) -> float:
        trial = model.with_efficiency(gpu.name, min(math.exp(log_eff), 1.0), precision)
        return statistics.fmean(abs(t.evaluate(s.gpu, s.links, trial).total_s / s.step_time_s - 1) for t, s in terms)

    grid = [math.log(1e-5) + i * (0 - math.log(1e-5)) / 200 for i in range(201)]
    current = math.log(model.efficiency_of(gpu, precision))
    best = min([*grid, current], key=error)
    lo, hi = best - 0.06, min(best + 0.06, 0.0)
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if error(a) <= error(b):
            hi = b
        else:
            lo = a
    refined = (lo + hi) / 2
    return math.exp(min([best, refined], key=error))


def recalibrate(samples: list[Sample], model: StepTimeModel) -> tuple[StepTimeModel, dict[str, dict[str, Any]]]:
    """The model with each sampled ``GPU@precision``'s efficiency refitted (:func:`fit_relative`), and per
    key: samples, efficiency before/after, mean relative step-time error before/after."""
    report: dict[str, dict[str, Any]] = {}
    by_key: dict[str, list[Sample]] = {}
    for s in samples:
        by_key.setdefault(s.key, []).append(s)
    fitted = model
    for key, group in sorted(by_key.items()):
        gpu, precision = group[0].gpu, group[0].precision
        before = model.efficiency_of(gpu, precision)
        efficiency = min(max(fit_relative(group, model), 1e-6), 1.0)
        fitted = fitted.with_efficiency(gpu.name, efficiency, precision)
        report[key] = {
            "samples": len(group),
            "efficiency_before": before,
            "efficiency_after": efficiency,
            "step_time_error_before": _mean_error(group, model),
            "step_time_error_after": _mean_error(group, fitted),
        }
    return fitted, report


def memory_errors(samples: list[Sample]) -> list[dict[str, Any]]:
    """Per sample with a comparable measurement: the largest rank's measured peak against MARP's."""
    out = []
    for s in samples:
        if s.memory_source in COMPARABLE_MEMORY and s.peak_memory_bytes and s.predicted_peak_bytes:
            peak = max(s.peak_memory_bytes)
            out.append(
                {
                    "job": s.job_id,
                    "gpu_type": s.gpu.name,
                    "measured_bytes": peak,
                    "predicted_bytes": s.predicted_peak_bytes,
                    "error": s.predicted_peak_bytes / peak - 1,
                    "source": s.memory_source,
                }
            )
    return out
