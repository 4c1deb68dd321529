"""Replaying Sia's workloads with its tables (frenzy_opt.simulation.siareplay) on an invented fixture in Sia's
formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frenzy_opt.cli import main
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.planning.scenario import load_cluster_ref
from frenzy_opt.simulation.siareplay import (
    RESCALE_S,
    SLOWDOWN,
    iterations_to_complete,
    load_sia_replay,
    read_validation,
)
from frenzy_opt.simulation.simulator import Simulator, check_result
from frenzy_opt.simulation.throughputs import read_sia_profiles
from frenzy_opt.solvers.base import make_policy

DATA = Path(__file__).parent / "data" / "sia_replay"
TRACES = DATA / "traces"


def _replay():  # type: ignore[no-untyped-def]
    topology = Topology(load_cluster_ref(str(DATA / "cluster.yaml")))
    jobs, truth = load_sia_replay(DATA / "workload.csv", read_sia_profiles(TRACES), TRACES, topology)
    return topology, jobs, truth


def test_iterations_follow_the_gain_of_each_epoch() -> None:
    validation = read_validation(TRACES / "bert")
    # Batch 8 = the smallest validated: gain 1, progress to min(200, 220) = 200 iterations.
    assert iterations_to_complete(validation, 8, 2) == pytest.approx(200.0)
    # Batch 16, scale 2: gain (1+1)/(1/2+1) = 4/3 in epoch 0, (3+1)/(3/2+1) = 1.6 in epoch 1.
    assert iterations_to_complete(validation, 16, 2) == pytest.approx(100 / (4 / 3) + 100 / 1.6)
    with pytest.raises(ValueError, match="outside"):
        iterations_to_complete(validation, 64, 2)


def test_jobs_have_only_profiled_options_and_sia_times() -> None:
    _, jobs, truth = _replay()
    by_id = {j.id: j for j in jobs}
    assert [j.arrival_s for j in jobs] == [0.0, 30.0, 300.0]
    job = by_id["bert-1"]
    assert job.steps == round(100 / (4 / 3) + 100 / 1.6)
    # (2, 2) whole T4 nodes has no profile: not an option.
    assert sorted(job.per_count) == [("RTX-2080Ti", 1), ("RTX-2080Ti", 2), ("T4", 1), ("T4", 2)]
    assert job.startup_s == job.restart_s == RESCALE_S["bert"]
    # One T4: local 16 > max 8, one accumulation step of atomic 8: 0.80 + (0.80 - 0.04), times the slowdown.
    assert truth.step_s(job, job.per_count[("T4", 1)]) == pytest.approx((0.80 + 0.76) * SLOWDOWN["bert"])
    assert truth.step_s(job, job.per_count[("T4", 2)]) == pytest.approx(0.84 * SLOWDOWN["bert"])
    # Before a run a policy knows the one-GPU profile scaled linearly, not the table's two-GPU time.
    assert job.step_s(job.per_count[("T4", 2)]) == pytest.approx(1.56 * SLOWDOWN["bert"] / 2)
    assert job.request.num_gpus == 2


@pytest.mark.parametrize("policy", ["fifo", "frenzy", "sia", "gavel"])
def test_replay_conserves_jobs_and_pays_the_first_start(policy: str) -> None:
    topology, jobs, truth = _replay()
    result = Simulator(topology, jobs, make_policy(policy), truth=truth).run()  # type: ignore[arg-type]
    assert check_result(result, topology) == []
    for state in result.jobs.values():
        assert state.segments[0].restart_s == pytest.approx(RESCALE_S["bert"])
        fastest = min(truth.step_s(state.job, o) for o in state.job.per_count.values())
        assert state.end_s is not None
        assert state.end_s - state.job.arrival_s >= RESCALE_S["bert"] + state.job.steps * fastest - 1e-6


def test_cli_replays_a_sia_workload(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", str(DATA / "cluster.yaml"), "--workload-file", str(DATA / "workload.csv")]
    args += ["--workload-format", "sia", "--truth", "profiled", "--profiles", str(TRACES), "--policy", "sia,fifo"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for name in ("sia", "fifo"):
        m = out["policies"][name]
        assert m["num_finished"] == 3
        assert {"avg_jct_s", "p99_jct_s", "restarts", "mean_decision_ms"} <= set(m)
    assert main([*args[:-4], "--policy", "fifo", "--truth", "model"]) == 2
    assert "needs --truth profiled" in capsys.readouterr().err
