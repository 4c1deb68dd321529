"""MARP against one measured run: the row predicted on the metric it measured (the last stage or the maximum
over stages, as its ``rank_measured`` says) and scored, and the summaries of many scores.

**Accuracy** of a row = ``1 - |predicted - measured| / measured``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from frenzy_opt.prediction.marp import bound
from frenzy_opt.prediction.marp.cuda import cuda_terms_of
from frenzy_opt.prediction.marp.fit import MemoryFit
from frenzy_opt.prediction.marp.predictor import MemoryPrediction, StagePrediction, predict_memory
from frenzy_opt.validation.memory_runs import MeasuredRun


@dataclass(frozen=True, slots=True, kw_only=True)
class RowScore:
    row_id: str
    source: str
    metric: str
    measured_bytes: int
    predicted_bytes: int
    upper_bytes: int
    predicted_allocated_bytes: int
    predicted_reserved_bytes: int
    predicted_used_bytes: int
    required_upper_bytes: int = 0
    """The bound's required part (what admission tests)."""
    capacity_bytes: int | None = None
    headroom_fraction: float = 0.0
    explanation: str = ""
    """The required bound's parts (:meth:`frenzy_opt.prediction.marp.bound.MemoryBound.explain`)."""

    @property
    def admitted(self) -> bool | None:
        """Whether the planner would admit the run on its own GPU: the required bound plus the fit's default
        headroom within the GPU's memory."""
        if self.capacity_bytes is None:
            return None
        return self.required_upper_bytes + self.headroom_fraction * self.capacity_bytes <= self.capacity_bytes

    @property
    def accuracy(self) -> float:
        return 1 - abs(self.predicted_bytes - self.measured_bytes) / self.measured_bytes

    @property
    def signed_error(self) -> float:
        return self.predicted_bytes / self.measured_bytes - 1

    @property
    def upper_margin(self) -> float:
        """How far the upper bound is above the measurement (negative: the bound is under it)."""
        return self.upper_bytes / self.measured_bytes - 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.row_id,
            "source": self.source,
            "metric": self.metric,
            "measured": self.measured_bytes,
            "predicted": self.predicted_bytes,
            "upper": self.upper_bytes,
            "accuracy": round(self.accuracy, 4),
            "signed_error": round(self.signed_error, 4),
            "upper_margin": round(self.upper_margin, 4),
            "predicted_allocated_bytes": self.predicted_allocated_bytes,
            "predicted_reserved_bytes": self.predicted_reserved_bytes,
            "predicted_used_bytes": self.predicted_used_bytes,
            "required_upper_bytes": self.required_upper_bytes,
            "admitted": self.admitted,
        }


def prediction_of(run: MeasuredRun, fit: MemoryFit) -> MemoryPrediction:
    assert run.job is not None
    cuda = cuda_terms_of(replace(fit, rows=max(fit.rows, 1)), run.gpu_family)
    return predict_memory(run.job, None, cuda=cuda, fit=fit, architecture=run.gpu_family)


def stages_of(run: MeasuredRun, prediction: MemoryPrediction) -> list[StagePrediction]:
    return [prediction.stages[-1]] if run.last_rank else list(prediction.stages)


def score_run(run: MeasuredRun, fit: MemoryFit) -> RowScore:
    assert run.measured_bytes is not None
    stages = stages_of(run, prediction_of(run, fit))
    allocated = max(s.peak_allocated_bytes for s in stages)
    reserved = max(s.peak_reserved_bytes for s in stages)
    used = max(s.device_used_bytes for s in stages)
    predicted = {"max_allocated": allocated, "max_reserved": reserved, "device_used": used}[run.metric]
    upper = {
        "max_allocated": max(s.peak_allocated_upper_bytes for s in stages),
        "max_reserved": max(s.peak_reserved_upper_bytes for s in stages),
        "device_used": max(s.device_used_upper_bytes for s in stages),
    }[run.metric]
    worst = max(stages, key=lambda s: s.required_upper_bytes)
    return RowScore(
        row_id=run.row_id,
        source=run.source,
        metric=run.metric,
        measured_bytes=run.measured_bytes,
        predicted_bytes=predicted,
        upper_bytes=upper,
        predicted_allocated_bytes=allocated,
        predicted_reserved_bytes=reserved,
        predicted_used_bytes=used,
        required_upper_bytes=worst.required_upper_bytes,
        capacity_bytes=run.capacity_bytes,
        headroom_fraction=fit.headroom_fraction,
        explanation=bound.MemoryBound(worst.bound).explain(run.capacity_bytes),
    )


# --- summaries ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    rows: int
    mean_accuracy: float
    worst_accuracy: float
    under_predicted_3pct: int
    upper_under_3pct: int
    upper_coverage: float
    admitted: float = math.nan
    """Fraction of the rows (that name their GPU's memory) the planner would admit on that GPU."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "mean_accuracy": round(self.mean_accuracy, 4),
            "worst_accuracy": round(self.worst_accuracy, 4),
            "under_predicted_3pct": self.under_predicted_3pct,
            "upper_under_3pct": self.upper_under_3pct,
            "upper_coverage": round(self.upper_coverage, 4),
            "admitted": round(self.admitted, 4),
        }


def summarise(scores: Sequence[RowScore]) -> Summary:
    if not scores:
        return Summary(rows=0, mean_accuracy=math.nan, worst_accuracy=math.nan, under_predicted_3pct=0,
                       upper_under_3pct=0, upper_coverage=math.nan)  # fmt: skip
    sized = [s for s in scores if s.capacity_bytes is not None]
    return Summary(
        rows=len(scores),
        mean_accuracy=statistics.fmean(s.accuracy for s in scores),
        worst_accuracy=min(s.accuracy for s in scores),
        under_predicted_3pct=sum(1 for s in scores if s.signed_error < -0.03),
        upper_under_3pct=sum(1 for s in scores if s.upper_margin < -0.03),
        upper_coverage=sum(1 for s in scores if s.upper_margin >= 0) / len(scores),
        admitted=statistics.fmean(bool(s.admitted) for s in sized) if sized else math.nan,
    )


def by_source(scores: Sequence[RowScore]) -> dict[str, Summary]:
    groups: dict[str, list[RowScore]] = {}
    for s in scores:
        groups.setdefault(s.source, []).append(s)
    return {source: summarise(group) for source, group in sorted(groups.items())}
