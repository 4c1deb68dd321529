"""The closed loop's arithmetic: a recalibration recovers a known efficiency from step times generated with
it, lowers the step-time error and never raises it, and memory is compared only with comparable
measurements."""

from __future__ import annotations

from dataclasses import replace

import pytest

from frenzy_opt.core.measurement import Measurement
from frenzy_opt.core.spec import parse_job
from frenzy_opt.hardware.gpus import lookup_gpu
from frenzy_opt.planning.plans import DEFAULT_STEP_MODEL, enumerate_plans
from frenzy_opt.planning.scenario import load_cluster_ref
from frenzy_opt.prediction import closedloop
from frenzy_opt.prediction.closedloop import Sample, memory_errors, predicted_step_s, recalibrate, sample_of

CLUSTER = load_cluster_ref("paper-3type")
JOB = parse_job({"model": "gpt3-350m", "training": {"seq_len": 2048, "global_batch_size": 64, "precision": "bf16"}})


def _samples(efficiency: float) -> list[Sample]:
    truth = DEFAULT_STEP_MODEL.with_efficiency("A100-SXM4-80GB", efficiency, "bf16")
    plans = [p for p in enumerate_plans(JOB, CLUSTER).plans if p.gpu_type == "A100-SXM4-80GB"][:6]
    samples = []
    for i, plan in enumerate(plans):
        base = sample_of(f"j{i}", JOB, plan, Measurement(step_time_s=1.0), CLUSTER)
        assert base is not None
        measured = predicted_step_s(base, truth)
        samples.append(replace(base, step_time_s=measured, peak_memory_bytes=(plan.peak_allocated_bytes,)))
    return samples


def test_recalibration_recovers_the_efficiency_that_generated_the_times() -> None:
    samples = _samples(0.31)
    model, report = recalibrate(samples, DEFAULT_STEP_MODEL)
    entry = report["A100-SXM4-80GB@bf16"]
    assert entry["efficiency_after"] == pytest.approx(0.31, rel=1e-6)
    assert entry["step_time_error_after"] < 1e-6 < entry["step_time_error_before"]
    assert model.efficiency["A100-SXM4-80GB@bf16"] == pytest.approx(0.31, rel=1e-6)
    assert model.efficiency_of(lookup_gpu("A100-SXM4-80GB"), "bf16") == entry["efficiency_after"]
    assert entry["samples"] == len(samples)


def test_recalibration_never_raises_the_mean_relative_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # Runs no one efficiency explains (measured times scattered around the truth's): the fit minimises the
    # squared log error, the report's error is the mean relative one; the latter never gets worse.
    samples = [
        replace(s, step_time_s=s.step_time_s * f) for s, f in zip(_samples(0.3), (0.5, 3, 1, 0.7, 2, 1.4), strict=True)
    ]
    before = DEFAULT_STEP_MODEL.efficiency_of(samples[0].gpu, "bf16")
    _, report = recalibrate(samples, DEFAULT_STEP_MODEL)
    entry = report["A100-SXM4-80GB@bf16"]
    assert entry["step_time_error_after"] <= entry["step_time_error_before"]
    assert entry["efficiency_before"] == before
    # A fit that lands somewhere worse on that metric is not taken: the starting efficiency stays.
    worse = DEFAULT_STEP_MODEL.with_efficiency("A100-SXM4-80GB", 1e-3, "bf16")
    monkeypatch.setattr(closedloop, "fit_points", lambda *args, **kwargs: worse)
    model, report = recalibrate(samples, DEFAULT_STEP_MODEL)
    entry = report["A100-SXM4-80GB@bf16"]
    assert entry["efficiency_after"] == before
    assert entry["step_time_error_after"] == entry["step_time_error_before"]
    assert model.efficiency_of(samples[0].gpu, "bf16") == before


def test_memory_is_compared_only_for_comparable_measurements() -> None:
    samples = _samples(0.4)
    tracked = [replace(s, memory_source="MemTracker", peak_memory_bytes=(s.predicted_peak_bytes * 2,)) for s in samples]
    rss = [replace(s, memory_source="max_rss") for s in samples]
    errors = memory_errors(tracked + rss)
    assert len(errors) == len(samples)
    assert all(e["error"] == pytest.approx(-0.5) for e in errors)


def test_runs_without_a_step_time_give_no_sample() -> None:
    plan = enumerate_plans(JOB, CLUSTER).plans[0]
    assert sample_of("x", JOB, plan, Measurement(), CLUSTER) is None
    assert sample_of("x", JOB, plan, Measurement.from_dict({"steps_run": 0}), CLUSTER) is None


def test_a_sample_runs_the_plan_it_was_given() -> None:
    """The typed plan reaches the closed loop whole: its layout, micro-batch and the precision it ran at (not
    the spec's), and its predicted peak."""
    plan = next(p for p in enumerate_plans(JOB, CLUSTER).plans if p.micro_batch_size > 1 and p.parallel.dp > 1)
    fp16 = replace(plan, precision="fp16")
    sample = sample_of("x", JOB, fp16, Measurement(step_time_s=0.5, peak_memory_bytes=(7, 9)), CLUSTER)
    assert sample is not None
    assert sample.spec.parallel == plan.parallel
    assert sample.spec.training.micro_batch_size == plan.micro_batch_size
    assert sample.precision == sample.spec.training.precision == "fp16" != JOB.training.precision
    assert sample.predicted_peak_bytes == plan.peak_allocated_bytes and sample.peak_memory_bytes == (7, 9)
