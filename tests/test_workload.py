"""Workloads: the synthetic Philly-distribution generator, trace files, the ``workload:`` section, and the
mapping of trace jobs to LLM jobs (size classes, requests, GPU-time kept)."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import pytest

from frenzy_opt.hardware.topology import Topology
from frenzy_opt.planning.problem import OptionCache
from frenzy_opt.planning.scenario import load_cluster_ref, parse_scenario
from frenzy_opt.planning.workload import (
    TraceJob,
    WorkloadSpec,
    parse_workload,
    read_trace,
    size_class,
    synthetic_trace,
    trace_of,
)
from frenzy_opt.simulation.tracemap import TraceMapper, default_request, expand, fastest_request, with_requests


def test_synthetic_trace_is_seeded_and_follows_the_philly_distribution() -> None:
    spec = WorkloadSpec(seed=7, num_jobs=4000, jobs_per_hour=100)
    a, b = synthetic_trace(spec), synthetic_trace(spec)
    assert a == b
    assert synthetic_trace(WorkloadSpec(seed=8, num_jobs=4000, jobs_per_hour=100)) != a
    counts = Counter(j.num_gpus for j in a)
    for gpus, p in {1: 0.70, 2: 0.10, 4: 0.15, 8: 0.05}.items():
        assert abs(counts[gpus] / len(a) - p) < 0.03
    minutes = sorted(j.duration_s / 60 for j in a)
    assert minutes[0] >= 10**1.5 and minutes[-1] <= 10**4
    long_share = sum(m > 10**3 for m in minutes) / len(minutes)
    assert 0.15 < long_share < 0.25  # 20 % drawn from 10^U(3, 4) minutes
    rate = len(a) / (a[-1].submit_s / 3600)
    assert 90 < rate < 110  # Poisson at 100 jobs/h
    assert all(x.submit_s <= y.submit_s for x, y in itertools.pairwise(a))


def test_bursts_raise_the_arrival_rate_inside_their_window() -> None:
    spec = parse_workload(
        {"seed": 1, "num_jobs": 3000, "jobs_per_hour": 50, "bursts": [{"start_h": 10, "duration_h": 5, "factor": 4}]}
    )
    jobs = synthetic_trace(spec)
    inside = sum(10 * 3600 <= j.submit_s < 15 * 3600 for j in jobs) / 5
    before = sum(j.submit_s < 10 * 3600 for j in jobs) / 10
    assert inside > 3 * before


def test_workload_errors_name_the_field_and_allowed_values() -> None:
    with pytest.raises(ValueError, match=r"workload\.num_jobs must be an integer in"):
        parse_workload({"num_jobs": 0})
    with pytest.raises(ValueError, match=r"unknown field.*allowed:"):
        parse_workload({"jobs": 3})
    with pytest.raises(ValueError, match="probabilities must sum to 1"):
        parse_workload({"gpus": {1: 0.5, 2: 0.2}})
    with pytest.raises(ValueError, match="unknown size class"):
        parse_workload({"model_mix": {"XXL": ["llama3-8b"]}})
    with pytest.raises(ValueError, match="either jobs or workload"):
        parse_scenario({"cluster": "paper-3type", "jobs": [], "workload": {}})


def test_trace_files_in_philly_and_sia_layouts(tmp_path: Path) -> None:
    philly = tmp_path / "philly.csv"
    philly.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:01:55,66.0,1,66.0,a\n"
        "2017-10-09 06:13:03,2951.0,4,11804.0,b\n"
        "2017-10-09 08:00:00,0,1,0,c\n",  # no run time: dropped
        encoding="utf-8",
    )
    jobs = read_trace(philly)
    assert [(j.submit_s, j.num_gpus, j.duration_s) for j in jobs] == [(0.0, 4, 2951.0), (2932.0, 1, 66.0)]
    sia = tmp_path / "sia.csv"
    sia.write_text(
        "name,time,application,num_replicas,batch_size\ncifar10-0,401.0,cifar10,2,4096\nimagenet-1,528.0,imagenet,8,200\n",
        encoding="utf-8",
    )
    small, large = read_trace(sia, seed=3)
    assert size_class(small.gpu_seconds) == "S" and size_class(large.gpu_seconds) == "XL"
    assert small.id == "cifar10-0" and large.submit_s == 127.0
    assert len(trace_of(WorkloadSpec(trace=str(philly), limit=1, skip=1))) == 1
    bad = tmp_path / "bad.csv"
    bad.write_text("when,gpus\n1,2\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no column among timestamp"):
        read_trace(bad)


def test_size_classes_follow_sia() -> None:
    hour = 3600.0
    assert [size_class(h * hour) for h in (0.5, 1.0, 9.9, 10, 99, 100, 5000)] == ["S", "M", "M", "L", "L", "XL", "XL"]


@pytest.fixture(scope="module")
def sia_cache() -> OptionCache:
    cluster = load_cluster_ref("sia-64")
    return OptionCache(cluster, Topology(cluster))


def test_mapping_keeps_gpu_time_on_the_request_and_drops_models_that_fit_nowhere(sia_cache: OptionCache) -> None:
    trace = [
        TraceJob(id="s", submit_s=0.0, num_gpus=1, duration_s=1200.0),
        TraceJob(id="m", submit_s=10.0, num_gpus=2, duration_s=3 * 3600.0),
        TraceJob(id="l", submit_s=20.0, num_gpus=8, duration_s=5 * 3600.0),
        TraceJob(id="xl", submit_s=30.0, num_gpus=16, duration_s=20 * 3600.0),
    ]
    mapper = TraceMapper(sia_cache)
    assert all(spec.model.name != "llama3-70b" for spec, _ in mapper.templates["XL"])  # 70 B fits no 64-GPU type
    jobs = mapper.map(trace, seed=0)
    assert [j.id for j in jobs] == ["s", "m", "l", "xl"]
    for tj, job in zip(trace, jobs, strict=True):
        assert job.request is not None
        option = sia_cache.per_count(job.spec)[(job.request.gpu_type, job.request.num_gpus)]
        step = option.plan.step_time_s
        assert step is not None
        kept = job.spec.training.train_steps * step * job.request.num_gpus
        assert (
            abs(kept - tj.gpu_seconds) <= step * job.request.num_gpus / 2 + 1e-6 or job.spec.training.train_steps == 1
        )
        assert job.request.num_gpus >= min(tj.num_gpus, 16)
    assert jobs[0].spec.model.num_params < 1e9 < jobs[3].spec.model.num_params


def test_default_request_prefers_the_most_common_type_and_power_of_two_counts(sia_cache: OptionCache) -> None:
    jobs = TraceMapper(sia_cache).map([TraceJob(id="a", submit_s=0, num_gpus=3, duration_s=600)], seed=0)
    per_count = sia_cache.per_count(jobs[0].spec)
    request = default_request(per_count, sia_cache.topology, 3)
    assert request is not None and request.num_gpus == 4  # 3 GPUs asked -> the next power of two
    assert sia_cache.topology.num_gpus_of(request.gpu_type) == 24  # T4 and RTX-2080Ti (24 each) before A100 (16)


def test_a_job_without_a_request_asks_for_its_fastest_type_not_the_most_common(sia_cache: OptionCache) -> None:
    """sia-64 has 24 T4s, 24 RTX-2080Tis and 16 A100s: a hand-written job with no ``request:`` gets the fewest
    GPUs of the type that runs it fastest per GPU (the A100 for an LLM), as Sia's and Gavel's baselines."""
    scenario = parse_scenario(
        {"name": "mine", "cluster": "sia-64",
         "jobs": [{"id": "a", "model": "gpt3-350m", "training": {"seq_len": 2048, "global_batch_size": 64}},
                  {"id": "b", "model": "gpt3-125m", "training": {"seq_len": 1024, "global_batch_size": 32},
                   "request": {"gpu_type": "T4", "num_gpus": 2}}]}
    )  # fmt: skip
    jobs = with_requests(scenario, sia_cache).jobs
    a, b = jobs[0].request, jobs[1].request
    assert a is not None and a.source == "default" and a.gpu_type == "A100-SXM4-40GB"
    per_count = sia_cache.per_count(jobs[0].spec)
    assert a.num_gpus == min(n for t, n in per_count if t == a.gpu_type)
    assert b is not None and (b.gpu_type, b.num_gpus, b.source) == ("T4", 2, "scenario")
    # per GPU, the chosen type's step is the cheapest of every type's fewest-GPU plan
    chosen = per_count[(a.gpu_type, a.num_gpus)]
    for gpu_type in sia_cache.topology.gpu_types:
        fewest = min(n for t, n in per_count if t == gpu_type)
        other = per_count[(gpu_type, fewest)]
        assert chosen.plan.step_time_s * a.num_gpus <= other.plan.step_time_s * fewest
    assert fastest_request({}, sia_cache.topology) is None


def test_model_mix_override_and_unknown_models(sia_cache: OptionCache) -> None:
    mapper = TraceMapper(sia_cache, {"*": {"gpt3-125m": 1.0}})
    jobs = mapper.map([TraceJob(id=str(i), submit_s=i, num_gpus=1, duration_s=10.0**i) for i in range(1, 6)], seed=0)
    assert {j.spec.model.name for j in jobs} == {"gpt3-125m"}
    with pytest.raises(ValueError, match="unknown model 'gpt-5'"):
        TraceMapper(sia_cache, {"S": {"gpt-5": 1.0}})


def test_scenario_workloads_expand_reproducibly() -> None:
    scenario = parse_scenario({"cluster": "sia-64", "workload": {"seed": 5, "num_jobs": 12, "jobs_per_hour": 30}})
    assert scenario.jobs == () and scenario.workload is not None
    a, b = expand(scenario), expand(scenario)
    assert len(a.jobs) == 12 and a.jobs == b.jobs
    assert all(j.request is not None for j in a.jobs)
