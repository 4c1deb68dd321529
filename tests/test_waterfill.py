"""The division of idle GPUs among running jobs by marginal gain per GPU (solvers/waterfill.py), in the HAS's
review and in the simulator's periodic review."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from factories import synthetic_plan
from hypothesis import given, settings
from hypothesis import strategies as st
from test_has import ResumingExecutor, _sim_job

from frenzy_opt.core.spec import parse_job
from frenzy_opt.hardware.cluster import parse_cluster
from frenzy_opt.hardware.placement import FreeIndex
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.planning.problem import Option, ProblemJob, SchedulingProblem
from frenzy_opt.service.events import Submitted
from frenzy_opt.service.orchestrator import Orchestrator
from frenzy_opt.service.store import Store
from frenzy_opt.simulation.simulator import Simulator
from frenzy_opt.solvers.base import make_policy
from frenzy_opt.solvers.greedy import GreedyState
from frenzy_opt.solvers.greedy_review import Move
from frenzy_opt.solvers.waterfill import Candidate, divide

GPU = "A100-SXM4-80GB"


def _option(num_gpus: int, duration_s: float, gpu_type: str = GPU) -> Option:
    plan = synthetic_plan(gpu_type, num_gpus, duration_s)
    return Option(gpu_type=gpu_type, num_gpus=num_gpus, whole_nodes=num_gpus // 8, duration_s=duration_s, plan=plan)


def _index(nodes: int, free_per_node: int) -> FreeIndex:
    index = FreeIndex({n: 8 for n in range(nodes)})
    for n in range(nodes):
        index.change(n, free_per_node - 8)
    return index


def _candidate(job: str, node: int, left_s: float, options: tuple[Option, ...], restart_s: float = 10.0) -> Candidate:
    return Candidate(
        job=job,
        weight=1.0,
        gpu_type=GPU,
        nodes=(node,),
        per_node=2,
        left_s=left_s,
        restart_s=restart_s,
        options=options,
    )


def test_idle_gpus_go_where_a_gpu_saves_most_and_the_index_is_left_as_it_was() -> None:
    # Two jobs on 2 GPUs each, 4 idle GPUs on node 0 and 2 on node 1 (nodes 0 and 1 hold the jobs).
    index = FreeIndex({0: 8, 1: 8})
    index.change(0, -4)
    index.change(1, -6)
    before = dict(index.free)
    # "scales" saves 6,000 s with 2 more GPUs; "flat" saves 1,500 s with 2 more: "scales" gets them first.
    scales = _candidate("scales", 0, 10_000.0, (_option(4, 4_000.0), _option(6, 3_000.0)))
    flat = _candidate("flat", 1, 10_000.0, (_option(4, 8_500.0),))
    grants = divide([flat, scales], {GPU: index}, grow_gain=0.1, margin=1.5)
    assert index.free == before
    by_job = {g.job: g for g in grants}
    # steps by gain per GPU: scales +2 (3,000 s/GPU), flat +2 (750), scales +2 more (500); then none is idle
    assert by_job["scales"].option.num_gpus == 6 and by_job["scales"].gain == 7_000.0
    assert by_job["flat"].option.num_gpus == 4 and by_job["flat"].gain == 1_500.0


def test_a_step_that_does_not_pay_its_restart_is_not_taken() -> None:
    index = _index(2, 4)
    # 9,000 -> 8,950 s saves 50 s, under 1.5 restarts of 100 s: no move at all.
    small = _candidate("small", 0, 9_000.0, (_option(6, 8_950.0),), restart_s=100.0)
    assert divide([small], {GPU: index}, grow_gain=0.0, margin=1.5) == []
    # the same saving with a 10 s restart pays
    cheap = _candidate("cheap", 0, 9_000.0, (_option(6, 8_950.0),), restart_s=10.0)
    (grant,) = divide([cheap], {GPU: index}, grow_gain=0.0, margin=1.5)
    assert grant.option.num_gpus == 6 and grant.limit_s == 9_000.0 - 15.0


def test_diminishing_returns_split_the_idle_gpus() -> None:
    # 4 idle GPUs, 2 beside each of two 2-GPU jobs with the same ladder: +2 GPUs saves 4,000 s (2,000 s per
    # GPU), +4 saves 4,500 s (1,125 per GPU). The fastest plan for one job would take all 4; the division
    # gives each job its first step instead, which saves 8,000 s in all against 4,500.
    index = FreeIndex({0: 8, 1: 8})
    index.change(0, -6)
    index.change(1, -6)
    ladder = (_option(4, 6_000.0), _option(6, 5_500.0))
    a, b = _candidate("a", 0, 10_000.0, ladder), _candidate("b", 1, 10_000.0, ladder)
    grants = divide([a, b], {GPU: index}, grow_gain=0.1, margin=1.5)
    assert sorted((g.job, g.option.num_gpus, g.gain) for g in grants) == [("a", 4, 4_000.0), ("b", 4, 4_000.0)]


def test_a_step_goes_to_the_job_whose_nodes_can_take_it() -> None:
    # Two 8-GPU nodes: "a" and "b" fill node 0 with 4 GPUs each, "c" holds 4 of node 1 beside 4 idle ones.
    # Each would halve its time on 8 GPUs (whole node); "a" has the most left, so a division by GPU counts
    # alone gave the idle 4 to "a", whose node is full, and nobody moved (Sia's philly workload 1, for hours).
    index = FreeIndex({0: 8, 1: 8})
    index.change(0, -8)
    index.change(1, -4)
    eight = (_option(8, 5_000.0),)
    jobs = [
        Candidate(job, 1.0, GPU, (node,), 4, left, 10.0, eight)
        for job, node, left in (("a", 0, 10_400.0), ("b", 0, 10_200.0), ("c", 1, 10_000.0))
    ]
    (grant,) = divide(jobs, {GPU: index}, grow_gain=0.1, margin=1.5)
    assert grant.job == "c" and grant.nodes == (1,) and grant.option.num_gpus == 8


def test_a_job_that_leaves_a_type_gives_its_gpus_to_the_next_step() -> None:
    # "slow" holds all of node 0 of the A100s and is faster on the 8 idle GPUs of another type; once it
    # leaves, "wide" (4 GPUs of node 1) takes node 0 whole, a step no GPU was idle for before.
    other = "H100-SXM5-80GB"
    a100, h100 = FreeIndex({0: 8, 1: 8}), FreeIndex({0: 8})
    a100.change(0, -8)
    a100.change(1, -8)  # node 1: "wide" on 4, 4 taken by a job the division may not move
    slow = Candidate("slow", 1.0, GPU, (0,), 8, 20_000.0, 10.0, (_option(8, 6_000.0, other),))
    wide = Candidate("wide", 1.0, GPU, (1,), 4, 10_000.0, 10.0, (_option(8, 5_000.0),))
    before = (dict(a100.free), dict(h100.free))
    grants = divide([slow, wide], {GPU: a100, other: h100}, grow_gain=0.1, margin=1.5)
    assert (dict(a100.free), dict(h100.free)) == before
    by_job = {g.job: g for g in grants}
    assert by_job["slow"].option.gpu_type == other and by_job["slow"].nodes == (0,)
    assert by_job["wide"].option.num_gpus == 8 and by_job["wide"].nodes == (0,)


@settings(max_examples=60, deadline=None)
@given(
    free=st.lists(st.integers(0, 6), min_size=2, max_size=4),
    ladders=st.lists(
        st.lists(st.tuples(st.sampled_from([2, 4, 6, 8, 16]), st.floats(100.0, 20_000.0)), min_size=1, max_size=4),
        min_size=1,
        max_size=4,
    ),
)
def test_grants_never_take_more_than_is_idle(free: list[int], ladders: list[list[tuple[int, float]]]) -> None:
    """Applied in order, the grants fit the index (each on GPUs idle or its own), and every grant saves time."""
    nodes = len(free)
    index = _index(nodes, 0)
    for n, left in enumerate(free):
        index.change(n, left)
    candidates = []  # jobs that hold no GPU of the type (moving over from another): every GPU taken is idle
    for i, ladder in enumerate(ladders):
        options = tuple(_option(g, d) for g, d in ladder)
        candidates.append(Candidate(f"j{i}", 1.0, "V100-SXM2-32GB", (i,), 1, 10_000.0, 5.0, options))
    before = dict(index.free)
    grants = divide(candidates, {GPU: index}, grow_gain=0.0, margin=1.0)
    assert index.free == before
    for grant in grants:
        assert grant.option.duration_s < 10_000.0 - 5.0
        for node in grant.nodes:
            index.change(node, -grant.option.gpus_per_node)
            assert index.free[node] >= 0


def test_review_leaves_the_idle_gpus_of_a_type_a_queued_job_waits_for() -> None:
    topology = Topology(parse_cluster({"node_groups": [{"gpu": GPU, "num_nodes": 2, "gpus_per_node": 8}]}))
    state = GreedyState(SchedulingProblem(topology=topology, jobs=()), patient=False)
    # priority 1: the queued job below (priority 0) may not preempt it
    runner = ProblemJob(
        id="run", arrival_s=0.0, weight=1.0, options=(_option(4, 40_000.0),), restart_s=10.0, priority=1
    )
    state.queue["run"] = runner
    assert [a.job for a in state.decide(0.0)] == ["run"]
    faster = (_option(8, 10_000.0),)
    # a queued job needing 16 GPUs waits for this type: the running job may not grow into its idle GPUs
    state.queue["big"] = ProblemJob(id="big", arrival_s=0.0, weight=1.0, options=(_option(16, 1_000.0),))
    state.decide(1_000.0)
    assert "big" in state.waiting
    assert [m for m in state.review(1_000.0, max_restarts=3, options_now=lambda _: faster) if m.reason == "grow"] == []
    del state.queue["big"]
    state.decide(1_000.0)
    (move,) = state.review(1_000.0, max_restarts=3, options_now=lambda _: faster)
    assert move.reason == "grow" and move.min_duration_s == 10_000.0


def test_the_periodic_review_grows_a_job_no_event_would_revisit() -> None:
    """A long job starts on 8 GPUs while a short one holds the other 8; when the short one ends the long one
    has not yet run past its hysteresis and restart budget, and no later event comes: only the periodic
    review lets it grow."""
    topology = Topology(parse_cluster({"node_groups": [{"gpu": GPU, "num_nodes": 2, "gpus_per_node": 8}]}))
    # seconds per step: 1.8 on 8 GPUs, 1.0 on 16 (the short job has only the 8-GPU plan)
    one_step = (_option(8, 1.8), _option(16, 1.0))
    jobs = [_sim_job("short", 0.0, 20, one_step[:1]), _sim_job("long", 0.0, 50_000, one_step)]
    ends = {}
    for every in (60.0, 0.0):
        policy = make_policy("frenzy", review_every_s=every)
        result = Simulator(topology, jobs, policy).run()  # type: ignore[arg-type]
        ends[every] = result.jobs["long"].end_s
    assert ends[60.0] is not None and ends[0.0] is not None
    assert ends[60.0] < 0.75 * ends[0.0]


def _service_with_long_job(tmp_path: Path) -> tuple[Store, ResumingExecutor, Orchestrator, list[float]]:
    """An orchestrator on two 8-GPU nodes, on a clock the test moves, running a long job on node 0 (node 1 was
    held when it started, and still is)."""
    cluster = parse_cluster({"name": "two", "node_groups": [{"gpu": GPU, "num_nodes": 2, "gpus_per_node": 8}]})
    store = Store(f"sqlite:///{tmp_path / 'ledger.db'}")
    executor = ResumingExecutor()
    orch = Orchestrator(store, cluster, executor, time_scale=10.0)
    clock = [0.0]
    orch.now = lambda: clock[0]  # type: ignore[method-assign]
    assert orch._review_wait_s() is None  # nothing runs: the loop blocks until an event
    orch.state.hold("maintenance", 1, 8, 1e9)  # node 1 is away when the job starts
    record = store.add_job(
        job_id="long", tenant="t", name="j", request_hash="h", idempotency_key=None, max_retries=1, weight=1.0,
        predicted=None, spec={"model": "gpt3-125m", "training": {"seq_len": 1024, "global_batch_size": 64,
                                                                  "train_steps": 400_000}},
    )  # fmt: skip
    orch.process([Submitted(record, parse_job(record.spec))])
    assert orch.running["long"].option.num_gpus == 8
    return store, executor, orch, clock


def test_the_service_reviews_without_an_event_and_grows_a_running_job(tmp_path: Path) -> None:
    """The orchestrator's loop waits at most a review period for an event while jobs run; an empty batch (the
    period passed) runs a decision and review, and a job that became movable grows into idle GPUs."""
    store, executor, orch, clock = _service_with_long_job(tmp_path)
    assert orch._review_wait_s() == orch.review_every_s / 10.0
    orch.state.release("maintenance")
    clock[0] = 0.2 * orch.running["long"].end_s  # past its hysteresis and restart budget
    orch.process([])
    assert executor.cancelled == ["long"]
    assert orch.running["long"].option.num_gpus == 16
    history = [e.detail for e in store.events("long")]
    assert any("to grow into idle GPUs" in detail for detail in history)
    store.close()


def test_a_grown_job_another_job_beat_to_its_gpus_waits_with_all_its_plans_again() -> None:
    """A review's growth cuts the grown job's plans to the one it was given (16 GPUs here); when the decision
    that follows cannot start it there ("other" holds node 1 until 20,000 s), the cut must not outlive that
    decision: with every plan back the job resumes on 8 GPUs at the next decision, not at 20,000 s."""
    topology = Topology(parse_cluster({"node_groups": [{"gpu": GPU, "num_nodes": 2, "gpus_per_node": 8}]}))
    per_step = (_option(8, 2.0), _option(16, 1.0))  # seconds per step
    jobs = [_sim_job("other", 0.0, 10_000, per_step[:1]), _sim_job("long", 10.0, 10_000, per_step)]
    review = GreedyState.review
    moved: list[float] = []

    def grow_once(state: GreedyState, now: float, **kwargs: Any) -> list[Move]:
        if moved or now < 1_000.0 or "long" not in state.by_job:
            return review(state, now, **kwargs)
        moved.append(now)
        state.release("long")
        # ~9,500 steps left: about 9,500 s on 16 GPUs, 19,000 s on 8; the cut keeps the 16-GPU plan alone
        return [Move(job="long", reason="grow", max_duration_s=12_000.0)]

    GreedyState.review = grow_once  # type: ignore[method-assign]
    try:
        result = Simulator(topology, jobs, make_policy("frenzy", review_every_s=60.0)).run()  # type: ignore[arg-type]
    finally:
        GreedyState.review = review  # type: ignore[method-assign]
    (at,) = moved
    first, second = result.jobs["long"].segments
    assert first.num_gpus == 8 and first.end_s == at
    assert second.num_gpus == 8 and second.start_s <= at + 120.0


def test_the_service_gives_a_grown_job_all_its_plans_back_when_the_growth_did_not_start(tmp_path: Path) -> None:
    """The service's side of the test above: a growth to 16 GPUs that the decision after the review cannot start
    (node 1 is held) leaves the job queued with every plan, and the next decision resumes it on 8."""
    store, _, orch, clock = _service_with_long_job(tmp_path)
    review = GreedyState.review

    def grow_once(state: GreedyState, now: float, **kwargs: Any) -> list[Move]:
        options = kwargs["options_now"]("long")
        sixteen = next(o for o in options if o.num_gpus == 16)
        state.release("long")
        return [Move(job="long", reason="grow", min_duration_s=sixteen.duration_s,
                     max_duration_s=sixteen.duration_s + 1.0)]  # fmt: skip

    clock[0] = 1_000.0
    GreedyState.review = grow_once  # type: ignore[method-assign]
    try:
        orch.process([])
    finally:
        GreedyState.review = review  # type: ignore[method-assign]
    assert "long" in orch.state.queue and "long" not in orch.running
    assert {o.num_gpus for o in orch.state.queue["long"].options} >= {8, 16}
    orch.process([])
    assert orch.running["long"].option.num_gpus == 8
    store.close()
