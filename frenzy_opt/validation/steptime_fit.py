"""The step-time model against measured runs: predict each run's seconds per iteration, score, fit the model's
parameters, and cross-validate leaving one source or one GPU type out.

**Error** of a row = ``predicted / measured - 1``; the scores are the mean of ``|error|``. **Fit**
(:func:`fit`): the parameters of :class:`~frenzy_opt.prediction.steptime.StepTimeModel` minimising the sum of squared
``log(predicted / measured)`` (a relative error, symmetric in over- and under-prediction), by
Levenberg-Marquardt (Marquardt 1963) over the logarithms of the parameters with a numerical Jacobian
(:func:`frenzy_opt.prediction.fitting.fit_points`, the fitter the closed loop uses too), with a weak pull
towards the starting parameters (:data:`PRIOR_WEIGHT`).
**Cross-validation** (:func:`cross_validate`) refits without each source (or GPU type) in turn and
predicts that group's rows with the others' parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from frenzy_opt.core.enums import Precision
from frenzy_opt.prediction.fitting import (
    FitPoint,
    Parameter,
    efficiency_parameter,
    fit_points,
    per_runtime_parameter,
    scalar_parameter,
)
from frenzy_opt.prediction.stepterms import StepTerms, step_terms
from frenzy_opt.prediction.steptime import DEFAULT_EFFICIENCY, MAX_RELATIVE_EFFICIENCY, StepTimeModel
from frenzy_opt.validation.steptime_runs import StepRun, fittable, usable

# Physical ranges of the parameters other than the efficiencies (those are bounded by
# frenzy_opt.prediction.steptime.MAX_RELATIVE_EFFICIENCY): a layer forward reads and writes its activations
# some 4 times when fully fused and about 60 when every op is its own kernel (eager PyTorch: each norm, add,
# dropout, activation and cast reads and writes its input); a layer runs 20-80 kernels forward and backward at 5-25 us
# of launch and framework cost each (CUDA C++ Best Practices Guide, "Kernel launch overhead").
ELEMENTWISE_PASSES_RANGE = (4.0, 60.0)


LAYER_OVERHEAD_RANGE = (1e-5, 2e-3)


# Weight of the pull towards the starting parameters in the fit (a weak ridge term in log space: 0.2-1.0
# raised the leave-one-source-out error from 28-29 % to 30-32 %).
PRIOR_WEIGHT = 0.05


@dataclass(frozen=True, slots=True, kw_only=True)
class Scored:
    row_id: str
    source: str
    gpu_class: str
    measured_s: float
    predicted_s: float

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.row_id,
            "source": self.source,
            "gpu_class": self.gpu_class,
            "measured_s": round(self.measured_s, 6),
            "predicted_s": round(self.predicted_s, 6),
            "error": round(self.error, 4),
        }


@dataclass(frozen=True, slots=True)
class _Prepared:
    run: StepRun
    terms: StepTerms


def _prepare(runs: Sequence[StepRun]) -> list[_Prepared]:
    out = []
    for r in usable(runs):
        assert r.job is not None
        out.append(_Prepared(r, step_terms(r.job)))
    return out


def predict_s(run: StepRun, model: StepTimeModel) -> float:
    assert run.job is not None
    return _slowest_s(step_terms(run.job), run, model)


def _slowest_s(terms: StepTerms, run: StepRun, model: StepTimeModel) -> float:
    """The run's step on the slowest of its GPU types (:attr:`StepRun.others`)."""
    return max(terms.evaluate(gpu, links, model).total_s for gpu, links in run.placements())


def score(runs: Sequence[StepRun], model: StepTimeModel) -> list[Scored]:
    out = []
    for p in _prepare(runs):
        r = p.run
        assert r.measured_s
        seconds = _slowest_s(p.terms, r, model)
        out.append(
            Scored(
                row_id=r.row_id, source=r.source, gpu_class=r.gpu_class, measured_s=r.measured_s, predicted_s=seconds
            )
        )
    return out


def parameters_for(runs: Sequence[StepRun], *, keys: str = "architecture") -> list[Parameter]:
    """The parameters the runs can inform. ``keys="architecture"`` (the published runs): each runtime's share
    of the measured kernel rates (no efficiency per GPU: GPU types differ by their measured throughput
    tables, data/kernel-throughput.yaml), the fp8 ratio if any run is fp8, the per-micro-batch overhead of
    each runtime, and from 8 runs on the elementwise passes and per-layer cost. ``keys="gpu"`` (a user's few
    runs): one efficiency per GPU type and format they ran on."""
    rows = usable(runs)
    if keys == "gpu":
        seen = dict.fromkeys(f"{r.gpu.name}@{r.job.training.precision}" for r in rows if r.gpu and r.job)
        return [efficiency_parameter(key) for key in seen]
    if keys != "architecture":
        raise ValueError(f"keys must be 'architecture' or 'gpu', got {keys!r}")
    runtimes = sorted({r.job.training.runtime for r in rows if r.job is not None})
    out = [
        per_runtime_parameter("gemm_efficiency", rt, 0.2, MAX_RELATIVE_EFFICIENCY, start=DEFAULT_EFFICIENCY)
        for rt in runtimes
    ]
    if any(r.job is not None and r.job.training.precision == Precision.FP8 for r in rows):
        out.append(scalar_parameter("fp8_efficiency", 0.2, MAX_RELATIVE_EFFICIENCY))
    out.extend(per_runtime_parameter("microbatch_overhead_s", rt, 1e-5, 1.0, start=1e-3) for rt in runtimes)
    if len(rows) >= 8:
        out.extend(per_runtime_parameter("elementwise_passes", rt, *ELEMENTWISE_PASSES_RANGE) for rt in runtimes)
        out.extend(per_runtime_parameter("layer_overhead_s", rt, *LAYER_OVERHEAD_RANGE) for rt in runtimes)
    return out


def fit(
    runs: Sequence[StepRun],
    base: StepTimeModel | None = None,
    *,
    keys: str = "architecture",
    iterations: int = 60,
) -> StepTimeModel:
    """Parameters minimising ``sum(log(predicted / measured)^2)`` over ``runs`` (module docstring): the
    fittable runs and :func:`parameters_for` them, fitted by :func:`frenzy_opt.prediction.fitting.fit_points`
    with the weak prior :data:`PRIOR_WEIGHT`."""
    model = base or StepTimeModel()
    runs = fittable(runs)
    prepared = _prepare(runs)
    if not prepared:
        raise ValueError("fit needs at least one usable homogeneous measured run")
    points = []
    for p in prepared:
        assert p.run.gpu is not None and p.run.links is not None
        points.append(FitPoint(p.terms, p.run.gpu, p.run.links, float(p.run.measured_s or 0.0)))
    params = parameters_for(runs, keys=keys)
    return fit_points(points, params, model, prior_weight=PRIOR_WEIGHT, iterations=iterations)


def _group(run: StepRun, by: str) -> str:
    if by == "source":
        return run.source
    return gpu_type_of(run)


def gpu_type_of(run: StepRun) -> str:
    """The GPU type a row reports under: the file's ``gpu_class`` (A100, H100, ..., "mixed (...)")."""
    return run.gpu_class


def cross_validate(runs: Sequence[StepRun], *, by: str = "source", base: StepTimeModel | None = None) -> list[Scored]:
    """Leave one group (``"source"`` or ``"gpu"`` type) out: each group's rows predicted by the parameters
    fitted on all the other rows."""
    rows = usable(runs)
    groups = sorted({_group(r, by) for r in rows})
    out: list[Scored] = []
    for g in groups:
        train = [r for r in rows if _group(r, by) != g]
        test = [r for r in rows if _group(r, by) == g]
        fitted = fit(train, base) if train else (base or StepTimeModel())
        out.extend(score(test, fitted))
    order = {r.row_id: i for i, r in enumerate(rows)}
    return sorted(out, key=lambda s: order[s.row_id])
