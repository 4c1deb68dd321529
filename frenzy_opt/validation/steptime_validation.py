"""``frenzy validate steptime`` and ``frenzy calibrate --name steptime``: the step-time model scored on a
calibration-format file in sample, leaving one source out and leaving one GPU type out (:class:`Validation`),
the refit that keeps its leave-one-source-out residuals (:func:`calibrate`), and whether the planner admits
each published configuration (:func:`refused`).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from frenzy_opt.prediction.stepeval import profiled_point
from frenzy_opt.prediction.stepterms import step_terms
from frenzy_opt.prediction.steptime import FIT_PATH, StepTimeModel, shipped_model
from frenzy_opt.validation.steptime_fit import Scored, cross_validate, fit, gpu_type_of, score
from frenzy_opt.validation.steptime_runs import StepRun, read_runs, usable

# --- summaries ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    rows: int
    mean_abs_error: float
    median_abs_error: float
    max_abs_error: float
    mean_signed_error: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "mean_abs_error": round(self.mean_abs_error, 4),
            "median_abs_error": round(self.median_abs_error, 4),
            "max_abs_error": round(self.max_abs_error, 4),
            "mean_signed_error": round(self.mean_signed_error, 4),
        }


def summarise(scores: Sequence[Scored]) -> Summary:
    if not scores:
        return Summary(
            rows=0,
            mean_abs_error=math.nan,
            median_abs_error=math.nan,
            max_abs_error=math.nan,
            mean_signed_error=math.nan,
        )
    errors = [abs(s.error) for s in scores]
    return Summary(
        rows=len(scores),
        mean_abs_error=statistics.fmean(errors),
        median_abs_error=statistics.median(errors),
        max_abs_error=max(errors),
        mean_signed_error=statistics.fmean(s.error for s in scores),
    )


def summary_by(scores: Sequence[Scored], key: Callable[[Scored], str]) -> dict[str, Summary]:
    groups: dict[str, list[Scored]] = {}
    for s in scores:
        groups.setdefault(key(s), []).append(s)
    return {k: summarise(v) for k, v in sorted(groups.items())}


@dataclass
class Validation:
    """``frenzy validate steptime``'s result: in sample (the given parameters), leave one source out and
    leave one GPU type out."""

    runs: list[StepRun]
    model: StepTimeModel
    in_sample: list[Scored]
    by_source_cv: list[Scored]
    by_gpu_cv: list[Scored]
    gpu_of: dict[str, str] = field(default_factory=dict)
    profiled: frozenset[str] = frozenset()
    """Rows priced from a measured layer profile (:mod:`frenzy_opt.prediction.profiles`) on any of their GPU
    types: reported apart from the rest."""

    def profile_split(self) -> dict[str, Any]:
        """In sample, LOSO and LOGO summaries of the profile-guided rows and of the others."""
        out: dict[str, Any] = {"rows": sorted(self.profiled)}
        for label, scores in (
            ("in_sample", self.in_sample),
            ("leave_one_source_out", self.by_source_cv),
            ("leave_one_gpu_type_out", self.by_gpu_cv),
        ):
            out[label] = {
                "profile_guided": summarise([s for s in scores if s.row_id in self.profiled]).to_dict(),
                "unprofiled": summarise([s for s in scores if s.row_id not in self.profiled]).to_dict(),
            }
        return out

    def to_dict(self) -> dict[str, Any]:
        loso = {s.row_id: s for s in self.by_source_cv}
        logo = {s.row_id: s for s in self.by_gpu_cv}
        rows = []
        for run in self.runs:
            base: dict[str, Any] = {"id": run.row_id, "source": run.source, "gpu_class": run.gpu_class}
            score_ = next((s for s in self.in_sample if s.row_id == run.row_id), None)
            if score_ is None:
                rows.append({**base, "skipped": run.skip_reason})
                continue
            rows.append(
                {
                    **score_.to_dict(),
                    "gpu_type": self.gpu_of[run.row_id],
                    "assumptions": list(run.assumptions),
                    "cross_validated": {
                        "leave_one_source_out": loso[run.row_id].to_dict(),
                        "leave_one_gpu_type_out": logo[run.row_id].to_dict(),
                    },
                }
            )

        def by_gpu(scores: Sequence[Scored]) -> dict[str, Any]:
            return {k: v.to_dict() for k, v in summary_by(scores, lambda s: self.gpu_of[s.row_id]).items()}

        def by_src(scores: Sequence[Scored]) -> dict[str, Any]:
            return {k: v.to_dict() for k, v in summary_by(scores, lambda s: s.source).items()}

        return {
            "rows": rows,
            "by_source": by_src(self.in_sample),
            "by_gpu_type": by_gpu(self.in_sample),
            "overall": summarise(self.in_sample).to_dict(),
            "cross_validated": {
                "leave_one_source_out": {
                    "overall": summarise(self.by_source_cv).to_dict(),
                    "by_source": by_src(self.by_source_cv),
                    "by_gpu_type": by_gpu(self.by_source_cv),
                },
                "leave_one_gpu_type_out": {
                    "overall": summarise(self.by_gpu_cv).to_dict(),
                    "by_gpu_type": by_gpu(self.by_gpu_cv),
                    "by_source": by_src(self.by_gpu_cv),
                },
            },
            "skipped": sum(1 for r in self.runs if r.skip_reason is not None),
            "profile_guided": self.profile_split() if self.profiled else None,
            "parameters": self.model.to_dict(),
        }


def validate(path: str | Path, model: StepTimeModel | None = None) -> Validation:
    """Score the step-time model on every usable row of ``path`` with ``model`` (the shipped parameters by
    default) and cross-validated, leaving one source and one GPU type out."""
    runs = read_runs(path)
    model = model or shipped_model()
    # Cross-validation refits from the defaults (the given parameters were fitted on these rows), keeping
    # the given model's measured layer profiles.
    base = StepTimeModel(layer_profiles=model.layer_profiles)
    return Validation(
        runs=runs,
        model=model,
        in_sample=score(runs, model),
        by_source_cv=cross_validate(runs, by="source", base=base),
        by_gpu_cv=cross_validate(runs, by="gpu", base=base),
        gpu_of={r.row_id: gpu_type_of(r) for r in runs},
        profiled=profiled_rows(runs, model),
    )


def profiled_rows(runs: Sequence[StepRun], model: StepTimeModel) -> frozenset[str]:
    """The usable rows ``model`` prices from a measured layer profile on any of their GPU types."""
    if not model.profiles:
        return frozenset()
    out = set()
    for r in usable(runs):
        assert r.job is not None
        terms = step_terms(r.job)
        if any(profiled_point(terms, gpu, model) is not None for gpu, _ in r.placements()):
            out.add(r.row_id)
    return frozenset(out)


def calibrate(path: str | Path, base: StepTimeModel | None = None) -> tuple[StepTimeModel, Validation]:
    """Fit on every usable row of ``path``; the residuals kept for bands and noisy truth are the
    leave-one-source-out ones."""
    runs = read_runs(path)
    loso = cross_validate(runs, by="source", base=base)
    fitted = fit(runs, base)
    arch = {r.row_id: r.gpu.architecture for r in usable(runs) if r.gpu is not None and not r.heterogeneous}
    by_arch: dict[str, list[float]] = {}
    for s in loso:
        if s.row_id in arch:
            by_arch.setdefault(arch[s.row_id], []).append(math.log(s.measured_s / s.predicted_s))
    fitted = replace(
        fitted,
        residuals=tuple(math.log(s.measured_s / s.predicted_s) for s in loso),
        residuals_by_architecture={k: tuple(v) for k, v in by_arch.items()},
    )
    return fitted, Validation(
        runs=runs,
        model=fitted,
        in_sample=score(runs, fitted),
        by_source_cv=loso,
        by_gpu_cv=cross_validate(runs, by="gpu", base=base),
        gpu_of={r.row_id: gpu_type_of(r) for r in runs},
    )


def write_fit(model: StepTimeModel, source: str, path: Path | None = None) -> Path:
    """Write the shipped parameters (``frenzy_opt/data/steptime-fit.json``)."""
    target = path or Path(__file__).resolve().parents[1] / FIT_PATH
    payload = {"source": source, "parameters": model.to_dict()}
    target.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return target


# --- feasibility of the published configurations ------------------------------------------------------


PARALLEL_FIELDS = ("dp", "tp", "pp", "vpp", "cp", "ep", "sequence_parallel", "zero_stage", "recompute", "attention")


def refused(run: StepRun) -> str | None:
    """Why the planner would refuse the run's own configuration on its own GPU type (None: admitted).

    The job is pinned to the run's parallel config and micro-batch and planned on a cluster of the run's
    GPU type and node size, as ``frenzy plan`` would; a refusal is a plan search without that plan."""
    from frenzy_opt.hardware.cluster import parse_cluster
    from frenzy_opt.planning.plans import enumerate_plans

    assert run.job is not None and run.gpu is not None and run.links is not None
    job = replace(run.job, pinned=frozenset({*PARALLEL_FIELDS, "micro_batch_size"}))
    n, per_node = job.parallel.num_gpus, run.links.gpus_per_node
    nodes = max(1, math.ceil(n / per_node))
    cluster = parse_cluster(
        {
            "name": f"row-{run.row_id}",
            "node_groups": [{"gpu": run.gpu.name, "num_nodes": nodes, "gpus_per_node": min(per_node, n)}],
        }
    )
    search = enumerate_plans(job, cluster)
    if any(p.parallel == job.parallel and p.micro_batch_size == job.training.micro_batch_size for p in search.plans):
        return None
    needed = search.min_device_bytes
    gib = 2**30
    if not needed:
        return "no valid configuration"
    why = search.refusal({run.gpu.name: run.gpu.memory_bytes})
    return (
        f"memory: the bound needs {needed / gib:.1f} GiB per GPU, {run.gpu.name} has "
        f"{run.gpu.memory_bytes / gib:.1f} GiB" + (f" ({why})" if why else "")
    )
