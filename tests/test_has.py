"""The HAS's decisions: marginal-cost plan choice, priority classes, deadlines, max_gpus, preemption and
elastic growth (solvers/greedy.py), in the simulator's frenzy policy and in the service's orchestrator."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from factories import synthetic_plan
from hypothesis import given, settings
from hypothesis import strategies as st

from frenzy_opt.core.spec import parse_job
from frenzy_opt.hardware.cluster import parse_cluster
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.launch.executors import ExitInfo, Launch, OnExit
from frenzy_opt.planning.problem import Option, OptionCache, ProblemJob, SchedulingProblem
from frenzy_opt.planning.scenario import Request, load_cluster_ref
from frenzy_opt.service.events import Exited, Submitted
from frenzy_opt.service.orchestrator import Orchestrator
from frenzy_opt.service.store import Store
from frenzy_opt.simulation.simulator import SimJob, Simulator
from frenzy_opt.solvers.base import make_policy
from frenzy_opt.solvers.greedy import GreedyState
from frenzy_opt.solvers.greedy_review import MAX_OVERHEAD, MOVE_MARGIN, PREEMPT_RATIO

GPU = "A100-SXM4-80GB"
# One type, two 8-GPU nodes (16 GPUs).
TOPOLOGY = Topology(parse_cluster({"node_groups": [{"gpu": GPU, "num_nodes": 2, "gpus_per_node": 8}]}))


def _option(num_gpus: int, duration_s: float, gpu_type: str = GPU) -> Option:
    plan = synthetic_plan(gpu_type, num_gpus, duration_s)
    return Option(gpu_type=gpu_type, num_gpus=num_gpus, whole_nodes=num_gpus // 8, duration_s=duration_s, plan=plan)


def _job(job_id: str, options: tuple[Option, ...], **fields: object) -> ProblemJob:
    return ProblemJob(id=job_id, arrival_s=0.0, weight=1.0, options=options, **fields)  # type: ignore[arg-type]


# 1 GPU for 1,000 s or 8 GPUs for 400 s: 2.5x faster for 8x the GPUs (3,200 GPU-seconds against 1,000).
SCALING = (_option(1, 1000.0), _option(8, 400.0))


def test_alone_a_job_takes_its_fastest_plan_behind_a_queue_its_most_efficient() -> None:
    alone = GreedyState(SchedulingProblem(topology=TOPOLOGY, jobs=()))
    alone.queue["a"] = _job("a", SCALING)
    (started,) = alone.decide(0.0)
    assert started.option.num_gpus == 8
    # 30 longer jobs queued behind it: 8 GPUs for 400 s delay them more than 600 s of its own time saves.
    busy = GreedyState(SchedulingProblem(topology=TOPOLOGY, jobs=()))
    busy.queue["a"] = _job("a", SCALING)
    for i in range(30):
        busy.queue[f"long-{i}"] = _job(f"long-{i}", (_option(1, 50_000.0),))
    first = next(a for a in busy.decide(0.0) if a.job == "a")
    assert first.option.num_gpus == 1
    # queue_price 0 restores "fastest now" behind the same queue
    blind = GreedyState(SchedulingProblem(topology=TOPOLOGY, jobs=()), queue_price=0.0)
    blind.queue = dict(busy.queue) | {"a": _job("a", SCALING)}
    assert next(a for a in blind.decide(0.0) if a.job == "a").option.num_gpus == 8


def test_jobs_seen_arriving_price_a_wide_plan_like_a_queue_until_they_stop() -> None:
    # One job every 6 s over the last hour: the ~67 to come while 8 GPUs run 400 s would each wait behind part
    # of their 3,200 GPU-seconds, more than the 600 s 8 GPUs save "a" (1 GPU: ~167 to come over 1,000 s, but
    # behind a fifth of the work). An hour with no arrival later, the rate is 0 and "a" takes its fastest plan.
    state = GreedyState(SchedulingProblem(topology=TOPOLOGY, jobs=()))
    for i in range(600):
        state.note_arrival(6.0 * i, 1.0)
    state.queue["a"] = _job("a", SCALING)
    (started,) = state.decide(3600.0)
    assert started.option.num_gpus == 1
    state.release("a")
    state.queue["b"] = _job("b", SCALING)
    (later,) = state.decide(2 * 3600.0 + 1.0)
    assert later.option.num_gpus == 8


def test_a_higher_priority_class_goes_first_even_when_longer() -> None:
    state = GreedyState(SchedulingProblem(topology=TOPOLOGY, jobs=()))
    state.queue["short"] = _job("short", (_option(16, 100.0),))
    state.queue["urgent"] = _job("urgent", (_option(16, 5000.0),), priority=1)
    (started,) = state.decide(0.0)
    assert started.job == "urgent"


def test_a_near_deadline_goes_first_and_picks_a_plan_that_meets_it() -> None:
    state = GreedyState(SchedulingProblem(topology=TOPOLOGY, jobs=()))
    state.queue["short"] = _job("short", (_option(16, 100.0),))
    state.queue["due"] = _job("due", (_option(16, 1000.0),), deadline_s=1500.0)
    (started,) = state.decide(0.0)
    assert started.job == "due"  # WSPT alone would start the shorter job first
    # Behind a long queue the efficient 1-GPU plan (1,000 s) would be chosen; with a deadline at 500 s
    # only the 8-GPU plan (400 s) is on time.
    late = GreedyState(SchedulingProblem(topology=TOPOLOGY, jobs=()))
    late.queue["due"] = _job("due", SCALING, deadline_s=500.0)
    for i in range(30):
        late.queue[f"long-{i}"] = _job(f"long-{i}", (_option(1, 50_000.0),))
    assert next(a for a in late.decide(0.0) if a.job == "due").option.num_gpus == 8


def test_max_gpus_caps_every_option_and_is_checked() -> None:
    cluster = load_cluster_ref("paper-3type")
    cache = OptionCache(cluster, Topology(cluster))
    base = {"model": "gpt3-1.3b", "training": {"seq_len": 2048, "global_batch_size": 64, "train_steps": 100}}
    free = cache.options(parse_job(base))
    capped = cache.options(parse_job({**base, "scheduling": {"max_gpus": 4}}))
    assert max(o.num_gpus for o in free) > 4 >= max(o.num_gpus for o in capped)
    spec = parse_job({**base, "scheduling": {"priority": 3, "max_gpus": 4, "deadline_s": 7200}})
    assert parse_job(spec.to_mapping()) == spec
    for bad, field in (({"max_gpus": 0}, "scheduling.max_gpus"), ({"priority": 1000}, "scheduling.priority")):
        with pytest.raises(ValueError, match=field):
            parse_job({**base, "scheduling": bad})
    with pytest.raises(ValueError, match="scheduling: unknown field"):
        parse_job({**base, "scheduling": {"gpus": 2}})


def _running(state: GreedyState, job: ProblemJob, now: float) -> None:
    state.queue[job.id] = job
    assert [a.job for a in state.decide(now)] == [job.id]


def test_a_short_job_preempts_a_long_one_within_the_restart_bounds() -> None:
    long = _job("long", (_option(16, 100_000.0),), restart_s=60.0)
    short = _job("short", (_option(16, 500.0),), restart_s=60.0)
    for max_restarts, expected in ((1, ["long"]), (0, [])):
        state = GreedyState(SchedulingProblem(topology=TOPOLOGY, jobs=()), patient=False)
        _running(state, long, 0.0)
        state.queue["short"] = short
        assert state.decide(5000.0) == []  # nothing free
        moves = state.review(5000.0, max_restarts=max_restarts)
        assert [m.job for m in moves] == expected
        if expected:
            assert [a.job for a in state.decide(5000.0)] == ["short"]
            assert state.restarts == {"long": 1}
    # Not a job of a higher class, nor one that has not yet run past its hysteresis
    for running, at in ((_job("vip", long.options, restart_s=60.0, priority=1), 5000.0), (long, 150.0)):
        state = GreedyState(SchedulingProblem(topology=TOPOLOGY, jobs=()), patient=False)
        _running(state, running, 0.0)
        state.queue["short"] = short
        state.decide(at)
        assert state.review(at, max_restarts=5) == []
    # Nor one whose restarts, this one included, would exceed MAX_OVERHEAD of its time since its first start
    # (moved twice, first started at 0, running again since 100 s: past its hysteresis from 280 s).
    at_budget = 3 * 60.0 / MAX_OVERHEAD
    for at, moved in ((at_budget - 1.0, []), (at_budget + 1.0, ["long"])):
        assert _moved_before(long, short, restarts=2, since=100.0, at=at) == moved


def test_a_preemption_must_save_more_than_the_margin_times_its_cost() -> None:
    # A 1-second job waits for a long one's end; stopping the long one costs it its 60-s restart plus that second.
    # It is stopped only when the wait it saves is over MOVE_MARGIN times that cost.
    cost = 60.0 + 1.0
    threshold = MOVE_MARGIN * cost
    short = _job("short", (_option(16, 1.0),), restart_s=60.0)
    for left, moved in ((threshold + 2.0, ["long"]), (max(threshold - 2.0, 0.0), [])):
        assert left > PREEMPT_RATIO * 1.0  # long enough to preempt for: only the margin decides
        long = _job("long", (_option(16, 1000.0 + left),), restart_s=60.0)
        state = GreedyState(SchedulingProblem(topology=TOPOLOGY, jobs=()), patient=False)
        _running(state, long, 0.0)
        state.queue["short"] = short
        assert state.decide(1000.0) == []  # nothing free
        assert [m.job for m in state.review(1000.0, max_restarts=5)] == moved


def test_a_job_its_spec_keeps_in_place_is_never_preempted() -> None:
    long = _job("long", (_option(16, 100_000.0),), restart_s=60.0)
    short = _job("short", (_option(16, 500.0),), restart_s=60.0)
    for fields, moved in (({}, ["long"]), ({"preemptible": False}, []), ({"max_moves": 0}, [])):
        state = GreedyState(SchedulingProblem(topology=TOPOLOGY, jobs=()), patient=False)
        _running(state, _job("long", long.options, restart_s=60.0, **fields), 0.0)
        state.queue["short"] = short
        state.decide(5000.0)
        assert [m.job for m in state.review(5000.0, max_restarts=5)] == moved


def test_a_job_just_moved_waits_out_the_hysteresis_before_it_moves_again() -> None:
    # Moved once already (first started at 0, restarted at 20,000 s), 600 s per restart: the overhead budget
    # allows a second move long before (2 x 600 s / MAX_OVERHEAD of age), the hysteresis only once it has run
    # 3 x 600 s again.
    long = _job("long", (_option(16, 100_000.0),), restart_s=600.0)
    short = _job("short", (_option(16, 500.0),), restart_s=60.0)
    for at, moved in ((21_500.0, []), (22_000.0, ["long"])):
        assert _moved_before(long, short, restarts=1, since=20_000.0, at=at) == moved


def _moved_before(long: ProblemJob, short: ProblemJob, *, restarts: int, since: float, at: float) -> list[str]:
    """The jobs a review at ``at`` stops for ``short`` when ``long``, first started at 0 and moved ``restarts``
    times, has run again since ``since``."""
    state = GreedyState(SchedulingProblem(topology=TOPOLOGY, jobs=()), patient=False)
    state.restarts[long.id] = restarts
    state._first_start[long.id] = 0.0
    _running(state, long, since)
    state.queue[short.id] = short
    state.decide(at)
    return [m.job for m in state.review(at, max_restarts=5)]


def test_a_running_job_grows_into_idle_gpus_when_it_saves_enough() -> None:
    state = GreedyState(SchedulingProblem(topology=TOPOLOGY, jobs=()), patient=False)
    _running(state, _job("grow", (_option(8, 40_000.0),), restart_s=60.0), 0.0)
    faster = (_option(16, 20_000.0),)
    slower = (_option(16, 35_000.0),)  # saves under GROW_GAIN of the 30,000 s left at 10,000 s
    assert state.review(10_000.0, max_restarts=3, options_now=lambda _: slower) == []
    (move,) = state.review(10_000.0, max_restarts=3, options_now=lambda _: faster)
    assert move.job == "grow" and move.reason == "grow" and move.max_duration_s < 30_000.0
    assert state.free[GPU].count == 16  # its GPUs were given back for the move


def _sim_job(job_id: str, arrival_s: float, steps: int, options: tuple[Option, ...]) -> SimJob:
    return SimJob(
        id=job_id,
        arrival_s=arrival_s,
        weight=1.0,
        model="m",
        steps=steps,
        options=options,
        per_count={(o.gpu_type, o.num_gpus): o for o in options},
        request=Request(gpu_type=GPU, num_gpus=16),
        restart_s=30.0,
    )


def test_simulated_frenzy_preempts_for_a_short_arrival_and_not_without_it() -> None:
    one_step = (_option(16, 1.0),)  # 1 s per step on the whole cluster
    jobs = [_sim_job("long", 0.0, 100_000, one_step), _sim_job("short", 5000.0, 300, one_step)]
    results = {}
    for preempt in (True, False):
        policy = make_policy("frenzy", preempt=preempt)
        results[preempt] = Simulator(TOPOLOGY, jobs, policy).run()  # type: ignore[arg-type]
    short = {p: r.jobs["short"].end_s - 5000.0 for p, r in results.items() if r.jobs["short"].end_s is not None}
    assert short[True] < 2 * 300 + 30  # it ran (almost) at once, not after the long job's 100,000 s
    assert short[False] > 90_000
    assert results[True].metrics()["restarts"] == 1 and results[False].metrics()["restarts"] == 0


class ResumingExecutor:
    """Runs nothing; stopped attempts resume (the orchestrator may preempt)."""

    name = "fake-resuming"
    preemptible = True

    def __init__(self) -> None:
        self.launched: dict[str, Launch] = {}
        self.cancelled: list[str] = []

    def launch(self, launch: Launch, on_exit: OnExit, on_report: object = None) -> None:
        self.launched[launch.job_id] = launch

    def cancel(self, job_id: str, why: str | None = None) -> None:
        self.cancelled.append(job_id)
        self.launched.pop(job_id, None)

    def running(self) -> set[str]:
        return set(self.launched)

    def shutdown(self) -> None:
        self.launched.clear()

    def supports(self, plan: object, arch: object) -> bool:
        return True

    def adopt(self, job_id: str, attempt: int, on_exit: OnExit) -> None:
        raise AssertionError("nothing survives a restart here")


COUNTER = itertools.count()


def test_the_service_preempts_a_long_job_for_a_short_one_and_resumes_it(tmp_path: Path) -> None:
    cluster = parse_cluster({"name": "one-node", "node_groups": [{"gpu": GPU, "num_nodes": 1, "gpus_per_node": 8}]})
    store = Store(f"sqlite:///{tmp_path / 'ledger.db'}")
    executor = ResumingExecutor()
    orch = Orchestrator(store, cluster, executor)
    clock = [0.0]
    orch.now = lambda: clock[0]  # type: ignore[method-assign]
    training = {"seq_len": 1024, "global_batch_size": 64}
    spec_long = {"model": "gpt3-125m", "training": {**training, "train_steps": 200_000}}
    spec_short = {"model": "gpt3-125m", "training": {**training, "train_steps": 200}}

    def submit(spec: dict[str, object]) -> str:
        record = store.add_job(
            job_id=f"job-{next(COUNTER)}", tenant="t", name="j", spec=spec, request_hash="h", idempotency_key=None,
            max_retries=1, weight=1.0, predicted=None,
        )  # fmt: skip
        orch.process([Submitted(record, parse_job(record.spec))])
        return record.id

    long = submit(spec_long)
    assert long in orch.running
    total = orch.running[long].end_s
    clock[0] = total / 2
    short = submit(spec_short)
    assert executor.cancelled == [long] and short in orch.running and long in orch.state.queue
    history = [(e.state, e.detail) for e in store.events(long)]
    assert history[-1][0] == "queued" and "resumes from its checkpoint" in history[-1][1]
    left = orch.jobs[long].steps_left
    assert 0.4 * 200_000 < left < 0.6 * 200_000  # about half its steps were done
    clock[0] = orch.running[short].end_s
    orch.process([Exited(short, executor.launched[short].attempt, ExitInfo(ok=True))])
    assert long in orch.running and executor.launched[long].spec.training.train_steps == left
    store.close()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["put", "del", "pop", "order"]), st.integers(0, 30), st.integers(1, 5)),
        max_size=120,
    )
)
def test_the_incremental_queue_order_is_the_full_sort(steps: list[tuple[str, int, int]]) -> None:
    """The decision order kept up to date from the queue's changes (GreedyState._ranked) equals a sort of
    the whole queue after any sequence of puts (new jobs and replaced ones), deletions and orders."""
    state = GreedyState(SchedulingProblem(topology=TOPOLOGY, jobs=()))
    for op, n, size in steps:
        job_id = f"j{n}"
        if op == "put":
            weight = 1.0 + (n * 7 + size) % 5
            state.queue[job_id] = ProblemJob(
                id=job_id, arrival_s=float(n % 4), weight=weight, options=(_option(size, 100.0 * size + n),)
            )
        elif op == "del" and job_id in state.queue:
            del state.queue[job_id]
        elif op == "pop":
            state.queue.pop(job_id, None)
        else:
            assert state._ranked().jobs == sorted(state.queue.values(), key=state._rank)
    assert state._ranked().jobs == sorted(state.queue.values(), key=state._rank)


def test_the_option_cache_is_bounded_and_keeps_what_is_used() -> None:
    cluster = load_cluster_ref("paper-3type")
    cache = OptionCache(cluster, Topology(cluster), max_searches=2)
    specs = [
        parse_job({"model": "gpt3-125m", "training": {"seq_len": n, "global_batch_size": 32}}) for n in (512, 1024)
    ]
    first = cache.per_step(specs[0])
    cache.per_step(specs[1])
    assert cache.per_step(specs[0]) is first  # a hit, now the most recently used
    cache.per_step(parse_job({"model": "gpt3-125m", "training": {"seq_len": 2048, "global_batch_size": 32}}))
    assert len(cache._searches) == 2
    assert cache.per_step(specs[0]) is first  # kept; the 1024 search was the one dropped
    assert cache.per_step(specs[1]) is not None and len(cache._searches) == 2


def test_an_unplanned_wait_is_not_reported_as_refused_by_admission() -> None:
    """Impatient, the HAS plans the waits of the first IMPATIENT_WAITS jobs only; the others have no entry
    in ``waiting`` (the service then says no GPU was free), not the None that means admission (a quota)
    ruled every option out."""
    state = GreedyState(SchedulingProblem(topology=TOPOLOGY, jobs=()), patient=False)
    state.occupy("big", (0,), 8, 10_000.0)
    state.occupy("most", (1,), 7, 10_000.0)  # one GPU free
    for i in range(12):
        state.queue[f"j{i}"] = _job(f"j{i}", (_option(8, 100.0 + i),))
    assert state.decide(0.0) == []
    assert state.waiting and all(option is not None for option, _ in state.waiting.values())
    assert len(state.waiting) < 12


class _Swapper:
    """A round-based policy that wants whichever job arrived last on the whole cluster (the move a
    re-dividing policy makes), through the shared apply_allocations."""

    name = "swapper"
    round_s: float | None = None

    def __init__(self) -> None:
        self.sim: Simulator | None = None
        self.latest: SimJob | None = None
        self.stops: list[str] = []

    def attach(self, sim: Simulator) -> None:
        self.sim = sim

    def on_arrival(self, job: SimJob, now: float) -> None:
        self.latest = job

    def on_end(self, job: SimJob, now: float, finished: bool) -> None:
        if self.latest is job:
            self.latest = None

    def on_node(self, node: int, now: float, up: bool, until_s: float) -> None:
        pass

    def decide(self, now: float) -> list[object]:
        from frenzy_opt.simulation.simulator import Stop
        from frenzy_opt.solvers.roundbased import apply_allocations

        assert self.sim is not None
        wanted = {}
        if self.latest is not None:
            wanted[self.latest.id] = self.latest.options[0]
        elif self.sim.queue:
            job = self.sim.jobs[sorted(self.sim.queue)[0]].job
            wanted[job.id] = job.options[0]
        actions = apply_allocations(self.sim, wanted)
        self.stops += [a.job for a in actions if isinstance(a, Stop)]
        return actions


def test_round_based_policies_leave_a_job_its_spec_keeps_in_place() -> None:
    from dataclasses import replace

    one_step = (_option(16, 1.0),)
    for preemptible in (True, False):
        first = replace(_sim_job("first", 0.0, 1000, one_step), preemptible=preemptible)
        jobs = [first, _sim_job("second", 100.0, 10, one_step)]
        policy = _Swapper()
        result = Simulator(TOPOLOGY, jobs, policy).run()  # type: ignore[arg-type]
        assert set(policy.stops) == ({"first"} if preemptible else set())
        assert result.jobs["first"].end_s is not None and result.jobs["second"].end_s is not None


def test_impatient_a_job_that_can_still_grow_starts_now_and_one_that_cannot_waits_for_its_cheapest() -> None:
    """Impatient, a job that fits now starts now unless a wait costs under WAIT_GAIN of that start (it may grow
    later); a job review can no longer move (not preemptible, or at its bound on stops) chooses as if patient."""
    options = (_option(16, 100.0), _option(8, 2_000.0))  # all 16 GPUs after the 1,000 s run: 1,100 s; 8 now: 2,000 s

    def chosen(**fields: object) -> int | None:
        state = GreedyState(SchedulingProblem(topology=TOPOLOGY, jobs=()), patient=False, max_restarts=2)
        state.occupy("busy", (0,), 8, 1_000.0)
        state.restarts["x"] = int(fields.pop("restarts", 0))  # type: ignore[call-overload]
        state.queue["x"] = _job("x", options, **fields)
        started = state.decide(0.0)
        return started[0].option.num_gpus if started else None

    assert chosen() == 8  # 1,100 s waited is not under half of 2,000 s: it starts now (and may grow)
    assert chosen(preemptible=False) is None  # it waits for the 16 GPUs, its cheapest
    assert chosen(restarts=2) is None  # at max_restarts
    assert chosen(restarts=1, max_moves=1) is None  # at its spec's max_moves
    assert chosen(restarts=1) == 8


def test_impatient_a_job_whose_wait_is_not_planned_does_not_start_a_plan_a_wait_could_beat() -> None:
    """Past the jobs whose waits a decision plans, a job starts now only on a plan within 1 / WAIT_GAIN of the
    least any of its options would cost started now (on cluster2048-llm, 13B jobs took 4 GPUs for 29 h when 64
    would have run them in 0.9 h)."""
    state = GreedyState(SchedulingProblem(topology=TOPOLOGY, jobs=()), patient=False)
    state.occupy("busy", (0,), 8, 10_000.0)
    # A higher class first: it waits for all 16 GPUs and reserves the type, so later waits go unplanned.
    state.queue["first"] = _job("first", (_option(16, 1_000.0),), priority=1)
    state.queue["x"] = _job("x", (_option(16, 10.0), _option(1, 9_000.0)))  # 1 GPU ends before the reservation
    assert state.decide(0.0) == []
    assert "x" not in state.waiting  # unplanned: the next decision looks again
    # The same job with a plan now within 1 / WAIT_GAIN of its 16-GPU run starts on it.
    state.queue["y"] = _job("y", (_option(16, 10.0), _option(1, 15.0)))
    assert [(a.job, a.option.num_gpus) for a in state.decide(0.0)] == [("y", 1)]
