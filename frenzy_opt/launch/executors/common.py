"""What the executors that run the training worker (local torchrun, Ray) share: whether the worker runs a
plan, the run folder an attempt starts from, and the summary of what a run measured."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from frenzy_opt.core.spec import JobSpec
from frenzy_opt.launch.executors import Launch
from frenzy_opt.launch.worker.support import worker_supports
from frenzy_opt.models.arch import ModelArch
from frenzy_opt.planning.plans import Plan


def plan_supported(plan: Plan, arch: ModelArch) -> bool:
    """The executors' ``supports``: whether the training worker runs ``plan`` (:func:`worker_supports`)."""
    return worker_supports(plan.parallel, arch, plan.num_micro_batches) is None


def job_plan_supported(plan: Plan, job: JobSpec) -> bool:
    """:func:`plan_supported` for the job's model: the executors' ``plan_filter`` (picklable, for plan
    searches in a worker process)."""
    return plan_supported(plan, job.model)


def prepare_run(workdir: Path, launch: Launch, max_steps: int | None) -> tuple[Path, int]:
    """The attempt's run folder ``workdir/<job>/`` with the worker's ``job.json`` and ``plan.json`` (a previous
    attempt's report removed, its checkpoints kept), and the steps to train."""
    job_dir = workdir / launch.job_id
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "job.json").write_text(json.dumps(launch.spec.to_mapping()), encoding="utf-8")
    (job_dir / "plan.json").write_text(json.dumps(launch.option.plan.to_dict()), encoding="utf-8")
    (job_dir / "report.jsonl").unlink(missing_ok=True)
    steps = launch.spec.training.train_steps
    return job_dir, steps if max_steps is None else min(max_steps, steps)


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What a run measured, from its report lines: steps, first/last loss, median step time (the first
    step excluded when there are others: it includes warm-up), tokens/s, per-rank peak memory."""
    steps = [r for r in records if r.get("event") == "step"]
    memory = [r for r in records if r.get("event") == "memory"]
    times = [r["step_time_s"] for r in steps]
    steady = times[1:] if len(times) > 1 else times
    out: dict[str, Any] = {"steps_run": len(steps)}
    if steps:
        out |= {
            "loss_first": steps[0]["loss"],
            "loss_last": steps[-1]["loss"],
            "step_time_s": statistics.median(steady),
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steps[1:] or steps),
        }
    if memory:
        out |= {"peak_memory_bytes": memory[-1]["peak_memory_bytes"], "memory_source": memory[-1]["source"]}
    return out
