"""The discrete-event simulator and its policies: event order, conservation of GPUs and jobs, every policy's
feasibility (random small workloads), failures and preemption accounting."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from factories import synthetic_option
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frenzy_opt.hardware.cluster import parse_cluster
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.planning.scenario import Request, load_scenario
from frenzy_opt.simulation.simulator import (
    Action,
    Failures,
    SimJob,
    SimulationError,
    Simulator,
    Start,
    check_result,
    percentile,
    sim_jobs,
)
from frenzy_opt.simulation.view import ClusterView
from frenzy_opt.solvers.base import make_policy, policy_names
from frenzy_opt.solvers.policies import FifoPolicy, FrenzyPolicy, place

GPU_TYPES = ("A100-SXM4-80GB", "V100-SXM2-32GB")


def _job(topology: Topology, job_id: str, arrival: float, steps: int, base_s: float, request: Request) -> SimJob:
    per_count = {}
    for t in topology.gpu_types:
        size = topology.nodes[topology.nodes_of(t)[0]].num_gpus
        speed = 3.0 if t.startswith("A100") else 1.0
        counts = [n for n in (1, 2, 4, 8) if n <= size] + [size * k for k in range(2, len(topology.nodes_of(t)) + 1)]
        for n in counts:
            per_count[(t, n)] = synthetic_option(topology, t, n, base_s / (speed * n**0.85))
    options = tuple(per_count.values())  # strictly faster with more GPUs: all on the Pareto front
    return SimJob(
        id=job_id,
        arrival_s=arrival,
        weight=1.0,
        model="test",
        steps=steps,
        options=options,
        per_count=per_count,
        request=request,
        restart_s=30.0,
    )


@st.composite
def workloads(draw: st.DrawFn) -> tuple[Topology, list[SimJob]]:
    groups = [
        {"gpu": t, "num_nodes": draw(st.integers(1, 3)), "gpus_per_node": draw(st.sampled_from([2, 4]))}
        for t in GPU_TYPES
    ]
    topology = Topology(parse_cluster({"node_groups": groups}))
    jobs = []
    for i in range(draw(st.integers(1, 8))):
        gpu_type = draw(st.sampled_from(GPU_TYPES))
        request = Request(gpu_type=gpu_type, num_gpus=draw(st.sampled_from([1, 2])))
        jobs.append(
            _job(
                topology,
                f"j{i}",
                float(draw(st.integers(0, 20)) * 60),
                draw(st.integers(1, 400)),
                float(draw(st.integers(1, 30))),
                request,
            )
        )
    return topology, jobs


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from(["frenzy", "fifo", "sia", "gavel"]))
def test_every_policy_finishes_every_job_without_double_booking(
    workload: tuple[Topology, list[SimJob]], name: str
) -> None:
    topology, jobs = workload
    sim = Simulator(topology, jobs, make_policy(name))  # type: ignore[arg-type]
    result = sim.run()
    assert check_result(result, topology) == []
    assert sim.free == [n.num_gpus for n in topology.nodes]  # every GPU back in the ledger
    assert not sim.queue and not sim.running
    assert sorted(result.jobs) == sorted(j.id for j in jobs)
    for state in result.jobs.values():
        assert state.end_s is not None and state.end_s >= state.job.arrival_s
    m = result.metrics()
    assert m["num_finished"] == m["num_jobs"] == len(jobs)
    assert 0 < float(m["utilization"]) <= 1 + 1e-9


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from(["frenzy", "fifo", "sia", "gavel"]), st.integers(0, 1000))
def test_failures_lose_progress_but_every_job_still_finishes(
    workload: tuple[Topology, list[SimJob]], name: str, seed: int
) -> None:
    topology, jobs = workload
    failures = Failures(node_mtbf_h=0.5, repair_s=600.0, checkpoint_interval_s=300.0, seed=seed)
    sim = Simulator(topology, jobs, make_policy(name), failures=failures)  # type: ignore[arg-type]
    result = sim.run()
    assert check_result(result, topology) == []
    assert sim.free == [n.num_gpus for n in topology.nodes]


def test_optimal_replays_the_cpsat_schedule_and_is_no_worse_than_greedy() -> None:
    jobs, topology = sim_jobs(load_scenario())
    results = {}
    # The greedy CP-SAT is hinted with: the HAS without preemption (CP-SAT's model has none either).
    for name in ("frenzy", "cpsat-offline"):
        settings = {"time_limit_s": 20.0} if name == "cpsat-offline" else {"preempt": False}
        result = Simulator(topology, jobs, make_policy(name, **settings)).run()  # type: ignore[arg-type]
        assert check_result(result, topology) == []
        results[name] = result.metrics()
    # CP-SAT starts from the greedy schedule (hint) and durations are the same up to rounding to seconds.
    assert float(results["cpsat-offline"]["avg_jct_s"]) <= float(results["frenzy"]["avg_jct_s"]) * 1.001


def test_optimal_refuses_failures_and_oversized_scenarios() -> None:
    jobs, topology = sim_jobs(load_scenario())
    with pytest.raises(SimulationError, match="max_jobs"):
        Simulator(topology, jobs, make_policy("cpsat-offline", max_jobs=3)).run()  # type: ignore[arg-type]
    with pytest.raises(SimulationError, match="failures"):
        Simulator(topology, jobs, make_policy("cpsat-offline"), failures=Failures(node_mtbf_h=10)).run()  # type: ignore[arg-type]


class _Recorder:
    """A policy that logs the simulator's callbacks and starts jobs on a fixed node when it can."""

    name = "recorder"
    round_s: float | None = None

    def __init__(self) -> None:
        self.log: list[tuple[float, str]] = []
        self.sim: Simulator | None = None

    def attach(self, sim: Simulator) -> None:
        self.sim = sim

    def on_arrival(self, job: SimJob, now: float) -> None:
        self.log.append((now, f"arrive {job.id}"))

    def on_end(self, job: SimJob, now: float, finished: bool) -> None:
        self.log.append((now, f"{'finish' if finished else 'fail'} {job.id}"))

    def on_node(self, node: int, now: float, up: bool, until_s: float) -> None:
        self.log.append((now, f"node {node} {'up' if up else 'down'}"))

    def decide(self, now: float) -> list[Action]:
        assert self.sim is not None
        self.log.append((now, "decide"))
        actions: list[Action] = []
        free = list(self.sim.free)
        for job_id, state in sorted(self.sim.queue.items(), key=lambda kv: kv[1].job.arrival_s):
            option = state.job.per_count[(state.job.request.gpu_type, state.job.request.num_gpus)]
            nodes = place(self.sim, option, free)
            if nodes is not None:
                for n in nodes:
                    free[n] -= option.gpus_per_node
                actions.append(Start(job=job_id, option=option, nodes=nodes))
        return actions


def _one_node() -> Topology:
    return Topology(parse_cluster({"node_groups": [{"gpu": "A100-SXM4-80GB", "num_nodes": 1, "gpus_per_node": 2}]}))


def test_completions_come_before_arrivals_at_the_same_time_and_one_decision_follows() -> None:
    topology = _one_node()
    request = Request(gpu_type="A100-SXM4-80GB", num_gpus=2)
    first = _job(topology, "a", 0.0, 100, 2.0, request)
    step = first.per_count[("A100-SXM4-80GB", 2)].plan.step_time_s
    assert step is not None
    end = 100 * step
    second = replace(_job(topology, "b", end, 10, 2.0, request), arrival_s=end)
    recorder = _Recorder()
    result = Simulator(topology, [first, second], recorder).run()  # type: ignore[arg-type]
    at_end = [entry for t, entry in recorder.log if t == end]
    assert at_end == ["finish a", "arrive b", "decide"]  # the arrival sees the GPUs the completion freed
    assert result.jobs["b"].segments[0].start_s == end


def test_a_policy_cannot_double_book_a_gpu() -> None:
    topology = _one_node()
    request = Request(gpu_type="A100-SXM4-80GB", num_gpus=2)
    jobs = [_job(topology, j, 0.0, 10, 1.0, request) for j in ("a", "b")]

    class Greedy(_Recorder):
        def decide(self, now: float) -> list[Action]:
            assert self.sim is not None
            option = jobs[0].per_count[("A100-SXM4-80GB", 2)]
            return [Start(job=j, option=option, nodes=(0,)) for j in sorted(self.sim.queue)]

    with pytest.raises(SimulationError, match="free GPUs"):
        Simulator(topology, jobs, Greedy()).run()  # type: ignore[arg-type]


def test_a_job_that_never_fits_is_reported_not_looped_on() -> None:
    topology = _one_node()
    job = _job(topology, "a", 0.0, 10, 1.0, Request(gpu_type="A100-SXM4-80GB", num_gpus=2))

    class Never(_Recorder):
        def decide(self, now: float) -> list[Action]:
            return []

    with pytest.raises(SimulationError, match="never start"):
        Simulator(topology, [job], Never()).run()  # type: ignore[arg-type]


def test_preemptions_keep_progress_and_restarts_pay_their_cost() -> None:
    topology = Topology(
        parse_cluster(
            {
                "node_groups": [
                    {"gpu": "A100-SXM4-80GB", "num_nodes": 1, "gpus_per_node": 4},
                    {"gpu": "V100-SXM2-32GB", "num_nodes": 1, "gpus_per_node": 4},
                ]
            }
        )
    )
    jobs = [
        _job(topology, f"j{i}", 120.0 * i, 2000, 4.0, Request(gpu_type="V100-SXM2-32GB", num_gpus=1)) for i in range(6)
    ]
    result = Simulator(topology, jobs, make_policy("sia")).run()  # type: ignore[arg-type]
    assert check_result(result, topology) == []
    assert result.metrics()["restarts"] > 0  # Sia scales jobs up, which restarts them
    for state in result.jobs.values():
        restarts = [seg.restart_s for seg in state.segments[1:]]
        assert state.segments[0].restart_s == 0.0
        assert all(r == pytest.approx(30.0) or r < 30.0 for r in restarts)  # paid (or cut short by a stop)
        work = sum((seg.end_s - seg.start_s - seg.restart_s) / seg.step_s for seg in state.segments)
        assert work == pytest.approx(state.job.steps, rel=1e-9)  # no progress lost without failures


def test_metrics_follow_contract_3_and_percentiles_interpolate() -> None:
    jobs, topology = sim_jobs(load_scenario())
    metrics = Simulator(topology, jobs, make_policy("frenzy")).run().metrics()  # type: ignore[arg-type]
    for key in ("avg_jct_s", "p50_jct_s", "p99_jct_s", "makespan_s", "utilization", "mean_decision_ms",
                "p99_decision_ms", "num_jobs", "num_finished"):  # fmt: skip
        assert key in metrics
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert math.isnan(percentile([], 50))


def test_policy_registry_names_unknown_policies_and_bad_settings() -> None:
    assert {"frenzy", "fifo", "sia", "gavel", "cpsat-offline"} <= set(policy_names())
    with pytest.raises(ValueError, match=r"allowed: .*fifo"):
        make_policy("pollux")
    with pytest.raises(ValueError, match=r"policies\.sia"):
        make_policy("sia", rounds=3)


def test_a_policy_sees_the_cluster_read_only() -> None:
    """Policies get a ClusterView: the simulator's own state through read-only containers, no simulator."""
    seen: list[ClusterView] = []

    class Spy(FifoPolicy):  # a real policy that keeps the view it is given
        def attach(self, view: ClusterView) -> None:
            super().attach(view)
            seen.append(view)

    jobs, topology = sim_jobs(load_scenario())
    Simulator(topology, jobs, Spy()).run()
    (view,) = seen
    assert not isinstance(view, Simulator)
    with pytest.raises(TypeError):
        view.free[0] = 0  # type: ignore[index]
    with pytest.raises(TypeError):
        view.running["x"] = None  # type: ignore[index]
    assert len(view.free) == len(topology.nodes) and view.now > 0


def test_frenzy_corrects_a_prediction_with_the_jobs_own_measurements_first() -> None:
    """What ``frenzy`` expects of a job's speed on a count it has not run (FrenzyPolicy._correction): its own
    ratio measured / predicted at another count, carried over by its model's scaling between the counts,
    before another job's ratio; its model's ratio where the job has measured nothing on the type."""
    topology = Topology(parse_cluster({"node_groups": [{"gpu": "A100-SXM4-80GB", "num_nodes": 2, "gpus_per_node": 8}]}))
    a100 = "A100-SXM4-80GB"
    request = Request(gpu_type=a100, num_gpus=1)
    first, second, third = (_job(topology, f"j{i}", 0.0, 100, 8.0, request) for i in range(3))
    measured = {("j0", 2): 0.9, ("j1", 2): 1.2, ("j1", 4): 1.8}  # measured / predicted, per (job, count)

    class View:
        def observed_step_s(self, job_id: str, gpu_type: str, num_gpus: int) -> float | None:
            job = {"j0": first, "j1": second, "j2": third}[job_id]
            ratio = measured.get((job_id, num_gpus))
            return None if ratio is None else ratio * job.step_s(job.per_count[(gpu_type, num_gpus)])

    policy = FrenzyPolicy()
    policy.view = View()  # type: ignore[assignment]
    assert policy._correction(first, a100, 4) == 1.0  # nothing measured: the prediction
    policy._learn(first, a100, 2)
    assert policy._correction(first, a100, 4) == pytest.approx(0.9)  # its own, at the largest smaller count
    assert policy._correction(first, a100, 1) == 1.0  # nothing at or below 1: the prediction
    policy._learn(second, a100, 4)
    policy._learn(second, a100, 2)
    # j1 went 1.2 -> 1.8 from 2 to 4 GPUs: j0's own 0.9 scaled by 1.5, not j1's 1.8.
    assert policy._correction(first, a100, 4) == pytest.approx(1.35)
    assert policy._correction(first, a100, 2) == pytest.approx(0.9)
    # A job of the model that measured nothing on the type: the model's latest ratio there, or below.
    assert policy._correction(third, a100, 4) == pytest.approx(1.8)
    assert policy._correction(third, a100, 8) == pytest.approx(1.8)
    assert policy._correction(third, a100, 1) == 1.0
