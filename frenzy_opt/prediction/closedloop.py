"""The closed loop: what real runs measured, against what MARP and the step-time model predicted for the
same plan, and the recalibration of the per-GPU-type efficiency factors from those runs.

A :class:`Sample` is one finished attempt: its job spec at the plan's parallel config, the GPU type and the
links of its placement, the measured median step time (warm-up step excluded) and per-rank peak memory.
:func:`recalibrate` refits, per ``GPU@precision`` with samples, the achievable efficiency of the step-time
model (with :mod:`frenzy_opt.prediction.fitting`'s fitter, minimising the squared log error of the predicted
step times) and reports the mean relative step-time error before and after. :func:`memory_errors` compares
measured peak memory with MARP's ``peak_allocated_bytes`` where the measurement is of the same quantity
(``torch.cuda`` peak allocated bytes on GPU, MemTracker's peak live tensor storage on CPU); a process's
resident set size is not.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any

from frenzy_opt.core.enums import Precision
from frenzy_opt.core.measurement import Measurement
from frenzy_opt.core.plan import Plan
from frenzy_opt.core.spec import JobSpec
from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.hardware.gpus import GpuType, lookup_gpu
from frenzy_opt.hardware.topology import Links, links_for
from frenzy_opt.prediction.fitting import FitPoint, efficiency_parameter, fit_points
from frenzy_opt.prediction.stepterms import step_terms
from frenzy_opt.prediction.steptime import MAX_RELATIVE_EFFICIENCY, StepTimeModel

COMPARABLE_MEMORY = ("MemTracker", "torch.cuda.max_memory_allocated")
# The range a refitted efficiency may take: a run can reach far below the kernel model (a CPU slot priced as a
# GPU type, a tiny model that is all fixed overhead), and somewhat above it
# (:meth:`StepTimeModel.with_efficiency` admits (0, MAX_RELATIVE_EFFICIENCY]).
EFFICIENCY_RANGE = (1e-5, MAX_RELATIVE_EFFICIENCY)


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


def sample_of(job_id: str, spec: JobSpec, plan: Plan, measured: Measurement, cluster: ClusterSpec) -> Sample | None:
    """The sample of a finished run from the plan it ran and what it measured (None without a step time)."""
    if not measured.step_time_s:
        return None
    job = spec.with_parallel(plan.parallel, plan.micro_batch_size)
    job = replace(job, training=replace(job.training, precision=Precision(plan.precision)))
    gpu = lookup_gpu(plan.gpu_type)
    return Sample(
        job_id=job_id,
        spec=job,
        gpu=gpu,
        precision=plan.precision,
        links=links_for(cluster, gpu.name),
        step_time_s=float(measured.step_time_s),
        peak_memory_bytes=measured.peak_memory_bytes or (),
        memory_source=measured.memory_source or "",
        predicted_peak_bytes=plan.peak_allocated_bytes,
    )


def predicted_step_s(sample: Sample, model: StepTimeModel) -> float:
    return step_terms(sample.spec).evaluate(sample.gpu, sample.links, model).total_s


def _mean_error(samples: list[Sample], model: StepTimeModel) -> float:
    return statistics.fmean(abs(predicted_step_s(s, model) / s.step_time_s - 1) for s in samples)


def recalibrate(samples: list[Sample], model: StepTimeModel) -> tuple[StepTimeModel, dict[str, dict[str, Any]]]:
    """The model with each sampled ``GPU@precision``'s efficiency refitted, and per key: samples, efficiency
    before/after, mean relative step-time error before/after.

    One efficiency per key (stored under the ``f"{gpu}@{precision}"`` key that
    :meth:`StepTimeModel.efficiency_of` reads first), each starting from the model's current value, fitted by
    :func:`frenzy_opt.prediction.fitting.fit_points` on absolute log errors: ``log(predicted / measured)``
    weighs every run alike, so the slowest run does not dominate runs of one type but very different sizes (a
    tiny model's steps are mostly fixed overhead), and its absolute value keeps one outlying run (a layout
    the model prices badly) from dragging the fit, as the mean relative error it is judged by does. No prior:
    only the sampled keys' efficiencies are fitted, each informed by its own runs. The range is
    :data:`EFFICIENCY_RANGE`. The reported error is the mean relative error; a key whose fitted efficiency
    makes that worse than the starting model's keeps the starting efficiency.
    """
    by_key: dict[str, list[Sample]] = {}
    for s in samples:
        by_key.setdefault(s.key, []).append(s)
    start = {key: model.efficiency_of(group[0].gpu, group[0].precision) for key, group in by_key.items()}
    params = [
        efficiency_parameter(key, start=start[key], lo=EFFICIENCY_RANGE[0], hi=EFFICIENCY_RANGE[1])
        for key in sorted(by_key)
    ]
    points = [FitPoint(step_terms(s.spec), s.gpu, s.links, s.step_time_s) for s in samples]
    trial = fit_points(points, params, model, absolute=True) if points else model
    fitted = model
    report: dict[str, dict[str, Any]] = {}
    for key, group in sorted(by_key.items()):
        gpu, precision = group[0].gpu, group[0].precision
        error_before = _mean_error(group, model)
        efficiency = trial.efficiency[key]
        candidate = fitted.with_efficiency(gpu.name, efficiency, precision)
        if _mean_error(group, candidate) > error_before:
            efficiency = start[key]
            candidate = fitted.with_efficiency(gpu.name, efficiency, precision)
        fitted = candidate
        report[key] = {
            "samples": len(group),
            "efficiency_before": start[key],
            "efficiency_after": efficiency,
            "step_time_error_before": error_before,
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
