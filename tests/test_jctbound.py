"""The lower bound on the average JCT (solvers/jctbound.py): tight for a job alone, below every policy's
schedule, and it sees contention."""

from __future__ import annotations

import pytest
from factories import synthetic_plan

from frenzy_opt.hardware.cluster import parse_cluster
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.planning.problem import Option
from frenzy_opt.planning.scenario import Request
from frenzy_opt.simulation.simulator import ModelTruth, SimJob, Simulator
from frenzy_opt.solvers.base import make_policy
from frenzy_opt.solvers.jctbound import jct_lower_bound

GPU = "A100-SXM4-80GB"


def _topology(nodes: int, per_node: int) -> Topology:
    return Topology(parse_cluster({"node_groups": [{"gpu": GPU, "num_nodes": nodes, "gpus_per_node": per_node}]}))


def _option(num_gpus: int, step_s: float, per_node: int = 8) -> Option:
    plan = synthetic_plan(GPU, num_gpus, step_s)
    whole = num_gpus // per_node if num_gpus >= per_node else 0
    return Option(gpu_type=GPU, num_gpus=num_gpus, whole_nodes=whole, duration_s=step_s, plan=plan)


def _job(job_id: str, arrival_s: float, steps: int, options: tuple[Option, ...]) -> SimJob:
    return SimJob(
        id=job_id, arrival_s=arrival_s, weight=1.0, model="m", steps=steps, options=options,
        per_count={(o.gpu_type, o.num_gpus): o for o in options},
        request=Request(gpu_type=GPU, num_gpus=options[0].num_gpus), restart_s=30.0,
    )  # fmt: skip


def test_a_job_alone_is_bounded_by_its_fastest_run() -> None:
    job = _job("a", 10.0, 100, (_option(1, 4.0), _option(8, 1.0)))
    bound = jct_lower_bound([job], _topology(1, 8), ModelTruth())
    assert bound.status == "Optimal" and bound.avg_jct_s == pytest.approx(100.0, rel=1e-6)
    assert bound.avg_jct_s <= 100.0


def test_two_jobs_on_one_gpu_see_the_contention_and_stay_below_the_best_schedule() -> None:
    jobs = [_job("a", 0.0, 100, (_option(1, 1.0, per_node=1),)), _job("b", 0.0, 100, (_option(1, 1.0, per_node=1),))]
    bound = jct_lower_bound(jobs, _topology(1, 1), ModelTruth())
    assert bound.avg_jct_s is not None
    # One after the other is optimal (average 150 s); alone each would take 100 s.
    assert 125.0 < bound.avg_jct_s <= 150.0


def test_no_policy_beats_the_bound() -> None:
    topology = _topology(2, 8)
    options = (_option(1, 8.0), _option(8, 1.5), _option(16, 1.0))
    jobs = [_job(f"j{i}", 60.0 * i, 200 + 50 * i, options) for i in range(6)]
    bound = jct_lower_bound(jobs, topology, ModelTruth())
    assert bound.avg_jct_s is not None
    for name in ("frenzy", "fifo", "cpsat-offline"):
        result = Simulator(topology, jobs, make_policy(name)).run()  # type: ignore[arg-type]
        assert bound.avg_jct_s <= result.metrics()["avg_jct_s"]
