"""The orchestrator without its thread: the GPU ledger under random submit / finish / fail / cancel sequences
(nothing double-booked, GPUs back on every end, store and memory agree), retries, quotas, recovery."""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frenzy_opt.core.spec import parse_job
from frenzy_opt.hardware.cluster import parse_cluster
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.launch.executors import ExitInfo, Launch, OnExit
from frenzy_opt.planning.problem import OptionCache
from frenzy_opt.planning.scenario import load_cluster_ref
from frenzy_opt.service.events import CancelRequested, Exited, Submitted, Tick
from frenzy_opt.service.orchestrator import Orchestrator
from frenzy_opt.service.store import Store

CLUSTER = load_cluster_ref("paper-3type")
CACHE = OptionCache(CLUSTER, Topology(CLUSTER))  # plan searches shared by every example
SPECS = [
    {"model": "gpt3-125m", "training": {"seq_len": 1024, "global_batch_size": 32, "train_steps": 50}},
    {"model": "gpt3-1.3b", "training": {"seq_len": 2048, "global_batch_size": 64, "train_steps": 500}},
    {"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 256, "train_steps": 5000}},
]
COUNTER = itertools.count()


class FakeExecutor:
    """Runs nothing: the test decides when each attempt ends."""

    name = "fake"
    preemptible = False

    def __init__(self, alive: set[str] | None = None) -> None:
        self.launched: dict[str, Launch] = {}
        self.alive = alive or set()
        self.adopted: list[tuple[str, int]] = []

    def launch(self, launch: Launch, on_exit: OnExit, on_report: object = None) -> None:
        self.launched[launch.job_id] = launch

    def cancel(self, job_id: str, why: str | None = None) -> None:
        self.launched.pop(job_id, None)

    def running(self) -> set[str]:
        return set(self.launched) | self.alive

    def shutdown(self) -> None:
        self.launched.clear()

    def supports(self, plan: object, arch: object) -> bool:
        return True

    def adopt(self, job_id: str, attempt: int, on_exit: OnExit) -> None:
        self.adopted.append((job_id, attempt))


def _orchestrator(
    tmp_path: Path, quotas: dict[str, dict[str, int]] | None = None, preempt: bool = False
) -> Orchestrator:
    store = Store(f"sqlite:///{tmp_path / f'ledger-{next(COUNTER)}.db'}")
    return Orchestrator(store, CLUSTER, FakeExecutor(), time_scale=1000.0, quotas=quotas, cache=CACHE, preempt=preempt)


def _submit(orch: Orchestrator, spec: dict[str, object], tenant: str = "t", retries: int = 1) -> str:
    record = orch.store.add_job(
        job_id=f"job-{next(COUNTER)}", tenant=tenant, name="j", spec=spec, request_hash="h", idempotency_key=None,
        max_retries=retries, weight=1.0, predicted=None,
    )  # fmt: skip
    orch.process([Submitted(record, parse_job(record.spec))])
    return record.id


def _check_ledger(orch: Orchestrator) -> None:
    held = {n.index: 0 for n in orch.topology.nodes}
    for run in orch.running.values():
        for node in run.nodes:
            held[node] += run.option.gpus_per_node
    for node in orch.topology.nodes:
        free = orch.state.free[node.gpu.name].free[node.index]
        assert free >= 0 and free + held[node.index] == node.num_gpus
    assert not set(orch.running) & set(orch.state.queue)
    states = {r.id: r.state for r in orch.store.list_jobs(tenant=None, state=None, limit=10_000, offset=0)[0]}
    assert {j for j, s in states.items() if s == "running"} == set(orch.running)
    assert {j for j, s in states.items() if s == "queued"} == set(orch.state.queue)
    for tenant, per_type in orch.quotas.used.items():
        for gpu_type, used in per_type.items():
            expected = sum(
                r.option.num_gpus
                for r in orch.running.values()
                if orch.jobs[r.job_id].tenant == tenant and r.option.gpu_type == gpu_type
            )
            assert used == expected


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(0, len(SPECS) - 1), st.sampled_from(["a", "b"])),
        st.tuples(st.just("finish"), st.integers(0, 50), st.booleans()),
        st.tuples(st.just("cancel"), st.integers(0, 50), st.just(False)),
        st.tuples(st.just("tick"), st.integers(0, 50), st.just(False)),
    ),
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(OPS)
@pytest.mark.parametrize("preempt", [False, True])
def test_the_ledger_never_double_books_and_gets_every_gpu_back(
    tmp_path: Path, preempt: bool, ops: list[tuple[str, int, object]]
) -> None:
    """With preemption on, the HAS also stops and resumes running jobs (``tick`` moves the clock on by up to
    50 h so that jobs become long-running and preemptible)."""
    orch = _orchestrator(tmp_path, quotas={"b": {"A100-SXM4-80GB": 8}}, preempt=preempt)
    clock = [0.0]
    orch.now = lambda: clock[0]  # type: ignore[method-assign]
    executor = orch.executor
    assert isinstance(executor, FakeExecutor)
    submitted: list[str] = []
    for op, k, arg in ops:
        if op == "submit":
            submitted.append(_submit(orch, SPECS[k], tenant=str(arg)))
        elif op == "finish" and orch.running:
            job = sorted(orch.running)[k % len(orch.running)]
            launch = executor.launched.pop(job)
            orch.process([Exited(job, launch.attempt, ExitInfo(ok=bool(arg), cause="test"))])
        elif op == "cancel" and submitted:
            from concurrent.futures import Future

            orch.process([CancelRequested(submitted[k % len(submitted)], Future())])
        elif op == "tick":
            clock[0] += 3600.0 * k
        _check_ledger(orch)
    # End everything: every GPU comes back.
    while orch.running or orch.state.queue:
        # One at a time, reading the running jobs afresh: ending one may let the review stop another (it
        # rejoins the queue without a launch) or start queued ones.
        job = min(orch.running)  # nothing running with jobs queued would be a stuck ledger: fail here
        launch = executor.launched.pop(job)
        orch.process([Exited(job, launch.attempt, ExitInfo(ok=True))])
        _check_ledger(orch)
    assert all(index.count == sum(index.free.values()) for index in orch.state.free.values())
    assert sum(index.count for index in orch.state.free.values()) == CLUSTER.num_gpus
    orch.store.close()


def test_failed_attempts_are_retried_up_to_the_limit(tmp_path: Path) -> None:
    orch = _orchestrator(tmp_path)
    executor = orch.executor
    assert isinstance(executor, FakeExecutor)
    job = _submit(orch, SPECS[0], retries=1)
    for _ in range(2):
        launch = executor.launched.pop(job)
        orch.process([Exited(job, launch.attempt, ExitInfo(ok=False, cause="rank 1 exited with code 9"))])
    record = orch.store.get(job)
    assert record is not None and record.state == "failed" and record.attempts == 2
    history = [(e.state, e.detail) for e in orch.store.events(job)]
    assert [s for s, _ in history] == [
        "queued",
        "scheduled",
        "running",
        "failed",
        "queued",
        "scheduled",
        "running",
        "failed",
    ]
    assert "retry limit 1 reached" in history[-1][1] and "code 9" in history[-1][1]
    _check_ledger(orch)


def test_stale_exits_of_cancelled_attempts_are_ignored(tmp_path: Path) -> None:
    from concurrent.futures import Future

    orch = _orchestrator(tmp_path)
    executor = orch.executor
    assert isinstance(executor, FakeExecutor)
    job = _submit(orch, SPECS[1])
    attempt = executor.launched[job].attempt
    done: Future[str] = Future()
    orch.process([CancelRequested(job, done)])
    assert done.result() == "cancelled"
    orch.process([Exited(job, attempt, ExitInfo(ok=True))])
    record = orch.store.get(job)
    assert record is not None and record.state == "cancelled"
    _check_ledger(orch)


def test_recovery_keeps_live_runs_and_moves_lost_ones(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'recover.db'}"
    first = Orchestrator(Store(db), CLUSTER, FakeExecutor(), time_scale=1000.0, cache=CACHE)
    jobs = [_submit(first, SPECS[2]) for _ in range(4)]
    running = sorted(first.running)
    queued = sorted(first.state.queue)
    assert running and queued
    # "Restart": a new orchestrator on the same database; the executor still runs only the first job.
    survivor = running[0]
    survivors = FakeExecutor(alive={survivor})
    second = Orchestrator(Store(db), CLUSTER, survivors, time_scale=1000.0, cache=CACHE)
    counts = second.recover()
    assert counts == {"queued": len(queued), "kept": 1, "moved": len(running) - 1, "failed": 0, "quarantined": 0}
    assert set(second.running) == {survivor}
    assert [job for job, _ in survivors.adopted] == [survivor]  # the executor takes the live run over
    assert set(second.state.queue) == set(jobs) - {survivor}
    lost = [j for j in running if j != survivor]
    for job in lost:
        details = [e.detail for e in second.store.events(job)]
        assert any("lost on restart" in d for d in details)
        record = second.store.get(job)
        assert record is not None and (record.moves, record.failures) == (1, 0)  # a move, not a failure
    _check_ledger(second)


def test_quota_blocks_with_the_reason_and_frees_with_the_job(tmp_path: Path) -> None:
    orch = _orchestrator(tmp_path, quotas={"a": {"A100-SXM4-80GB": 0, "V100-SXM2-32GB": 0, "RTX-3090": 0}})
    job = _submit(orch, SPECS[0], tenant="a")
    assert job in orch.state.queue
    reason = orch.reason(job)
    assert reason is not None and "over quota for tenant 'a'" in reason and "quota 0" in reason
    other = _submit(orch, SPECS[0], tenant="b")
    assert other in orch.running


@pytest.mark.parametrize("bad", ["finished", ""])
def test_store_refuses_unknown_states(tmp_path: Path, bad: str) -> None:
    orch = _orchestrator(tmp_path)
    job = _submit(orch, SPECS[0])
    with pytest.raises(ValueError, match="state must be one of"):
        orch.store.transition(job, bad)


def test_each_decision_is_logged_at_info(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    orch = _orchestrator(tmp_path)
    with caplog.at_level("INFO", logger="frenzy_opt.service.orchestrator"):
        job = _submit(orch, SPECS[0])
    decided = [r.getMessage() for r in caplog.records if r.getMessage().startswith("decision: ")]
    assert any(job in m and " on " in m for m in decided), decided


def test_queued_jobs_get_their_position_and_the_reservations_start_estimate(tmp_path: Path) -> None:
    orch = _orchestrator(tmp_path)
    jobs = [_submit(orch, SPECS[2]) for _ in range(6)]
    queued = [j for j in jobs if j in orch.state.queue]
    assert queued and orch.running
    asked = time.monotonic()
    infos = {j: orch.queue_info(j) for j in queued}
    positions = sorted(i.position for i in infos.values() if i is not None and i.position is not None)
    assert positions == list(range(1, len(queued) + 1))
    assert all(orch.queue_info(j) is None for j in orch.running)  # only queued jobs have a place in the queue
    first = next(j for j, i in infos.items() if i is not None and i.position == 1)
    info = infos[first]
    assert info is not None and info.estimated_start_in_s is not None and info.waiting_for is not None
    count, gpu_type = info.waiting_for.split(" x ")
    assert gpu_type in {g.name for g in CLUSTER.gpu_types()} and int(count) > 0
    # The estimate is when GPUs of that type free up: no later than the last running job there ends.
    ends = [r.end_s for r in orch.running.values() if r.option.gpu_type == gpu_type]
    # In cluster seconds (the service's one clock), however fast the cluster's clock runs.
    latest_s = max(ends) - orch.now()
    assert 0.0 <= info.estimated_start_in_s <= latest_s + orch.time_scale * (time.monotonic() - asked)
    assert "of cluster time" in orch.reason(first) or orch.time_scale == 1.0


def test_a_submission_cancelled_before_any_decision_is_answered_and_forgotten(tmp_path: Path) -> None:
    orch = _orchestrator(tmp_path)
    record = orch.store.add_job(
        job_id=f"job-{next(COUNTER)}", tenant="t", name="j", spec=SPECS[0], request_hash="h", idempotency_key=None,
        max_retries=0, weight=1.0, predicted=None,
    )  # fmt: skip
    waiter = orch.submit(record)  # queues a Submitted event; the test hands the loop its batch itself
    done: Future[str] = Future()
    orch.process([Submitted(record, parse_job(record.spec)), CancelRequested(record.id, done)])
    assert done.result(timeout=1) == "cancelled"
    assert isinstance(waiter, threading.Event) and waiter.is_set()  # the submission does not wait it out
    assert record.id not in orch.jobs and record.id not in orch.state.queue


ONE_NODE = parse_cluster(
    {"name": "one-node", "node_groups": [{"gpu": "A100-SXM4-80GB", "num_nodes": 1, "gpus_per_node": 8}]}
)
LONG = {"model": "gpt3-1.3b", "training": {"seq_len": 2048, "global_batch_size": 64, "train_steps": 20000}}


def _preemptible(db: str, alive: set[str] | None = None) -> tuple[Orchestrator, list[float]]:
    """An orchestrator on one 8-GPU node whose executor resumes stopped attempts, on a clock the test moves."""
    executor = FakeExecutor(alive)
    executor.preemptible = True
    orch = Orchestrator(Store(db), ONE_NODE, executor, preempt=True)
    # These tests count moves: without the jobs to come in the marginal cost, the stopped long job waits for
    # the whole node again (with them, one arrival an hour makes it resume beside the short one at once).
    orch.state.arrival_share = 0.0
    clock = [0.0]
    orch.now = lambda: clock[0]  # type: ignore[method-assign]
    return orch, clock


def _preempt_once(orch: Orchestrator, clock: list[float], job: str) -> None:
    """A short job arrives an hour later and the long one is stopped for it; the short one then ends."""
    clock[0] += 3600
    short = _submit(orch, SPECS[0])
    assert job in orch.state.queue and short in orch.running, orch.store.events(job)[-1]
    orch.process([Exited(short, orch.running[short].attempt, ExitInfo(ok=True))])
    assert job in orch.running  # resumed


def _fail(orch: Orchestrator, job: str) -> None:
    orch.process([Exited(job, orch.running[job].attempt, ExitInfo(ok=False, cause="rank 3 exited with code 1"))])


def test_submissions_and_not_moves_feed_the_arrival_rate(tmp_path: Path) -> None:
    """The HAS prices the jobs still to come from the submissions it has seen (GreedyState.note_arrival): a
    submission counts once; a preemption that queues the same job again does not."""
    orch, clock = _preemptible(f"sqlite:///{tmp_path / 'arrivals.db'}")
    job = _submit(orch, LONG)
    assert orch.state._arrived_weight == 1.0
    _preempt_once(orch, clock, job)  # one more submission (the short job), an hour later
    assert orch.state._arrived_weight == 1.0  # the first left the hour's window; the move added nothing
    assert [t for t, _ in orch.state._arrivals] == [3600.0]


def test_moves_never_spend_the_retry_budget(tmp_path: Path) -> None:
    """Issue 23: two preemptions, a restart of the service and one real failure; with one retry allowed, the
    job still succeeds, and the three counters say what happened."""
    db = f"sqlite:///{tmp_path / 'moves.db'}"
    orch, clock = _preemptible(db)
    job = _submit(orch, LONG, retries=1)
    _preempt_once(orch, clock, job)
    _preempt_once(orch, clock, job)
    orch.store.close()
    restarted, clock = _preemptible(db)  # the executor no longer runs it: lost on restart
    assert restarted.recover()["moved"] == 1
    restarted.process([Tick()])
    _fail(restarted, job)
    record = restarted.store.get(job)
    assert record is not None and record.state == "running"  # one failure of one allowed: retried
    restarted.process([Exited(job, restarted.running[job].attempt, ExitInfo(ok=True))])
    record = restarted.store.get(job)
    assert record is not None and record.state == "succeeded"
    assert (record.attempts, record.failures, record.moves) == (5, 1, 3)
    details = [e.detail for e in restarted.store.events(job)]
    assert sum("stopped for a shorter job" in d for d in details) == 2
    assert any("lost on restart" in d for d in details) and any("retry 1 of 1" in d for d in details)


def test_a_job_fails_after_max_retries_plus_one_real_failures_moves_or_not(tmp_path: Path) -> None:
    orch, clock = _preemptible(f"sqlite:///{tmp_path / 'fails.db'}")
    job = _submit(orch, LONG, retries=2)
    for failure in range(1, 4):
        _preempt_once(orch, clock, job)  # a move between failures changes nothing
        _fail(orch, job)
        record = orch.store.get(job)
        assert record is not None and record.failures == failure
        assert record.state == ("failed" if failure == 3 else "running")
    assert record.moves == 3 and record.attempts == 6
    assert "3 failures, retry limit 2 reached" in orch.store.events(job)[-1].detail
    _check_ledger(orch)
