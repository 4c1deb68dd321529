"""The orchestrator: one background loop that owns the GPU ledger and every job's state machine.

    queued -> scheduled -> running -> succeeded | failed | cancelled
    failed -> queued (retry, while failures <= max_retries)
    running -> queued (a move: preempted, grown or shrunk, lost to a restart of the service)

Three counters per job: ``attempts`` (launches of any kind), ``failures`` (attempts that failed on their own: a
rank's non-zero exit, a node failure under it; only these count against ``max_retries``) and ``moves`` (attempts
the scheduler stopped or lost; they never end a job).

Everything that changes state arrives as an event on one queue — a job accepted, an attempt ended (from
the executor's thread), a cancel request, a stop — and the loop handles a batch of them, then runs one
greedy HAS decision (:class:`frenzy_opt.solvers.greedy.GreedyState`, the same code the simulator and
``frenzy solve`` run) and hands each placement to the executor. The ledger is the greedy state's free-GPU
index: GPUs are taken only by a decision and given back on every end of an attempt (success, failure,
cancel), so nothing is double-booked (property-tested). All state changes of a batch are written to the
store in one transaction before the executor is told to launch.

Per-tenant quotas per GPU type (Kueue's ClusterQueue nominal quotas, without borrowing) are enforced inside
the decision (:class:`Quotas`, the greedy's admission hook): a job over its tenant's quota waits, with the
reason.

Recovery (:meth:`Orchestrator.start`): queued jobs are queued again in acceptance order; scheduled and
running ones the executor still runs keep their GPUs; the others were lost with the service's process and
are queued again as a move.

Faults (:mod:`frenzy_opt.service.store`): the loop never dies of one. A batch whose state changes the store cannot
write (a lock held past the busy timeout, a full disk, a deleted file, a database server gone) is kept, with
its launches held back, and written again with exponential back-off until the store takes it; meanwhile
:attr:`Orchestrator.store_fault` says why (the API answers 503 with ``Retry-After``) and new events wait in
the queue. An event whose handling raises is logged and its job failed with the reason, not the loop. At
start the service takes the store's writer lock before it recovers, and recovery quarantines rows it cannot
run (a model no longer in the catalogue, unreadable JSON, a node the cluster lacks, a state this version does not
know) as failed with the reason. A store that breaks for good because another server took it over (fenced,
:mod:`frenzy_opt.service.writer`) makes the loop step down: it cancels its runs, writes nothing more and stops;
``/healthz`` says why.

Cluster time is wall time since start x ``time_scale`` (the simulated executor's scale), so predicted
durations and the scheduler's clock agree. The service speaks one clock, cluster time: every duration it
answers (a queued job's estimated start, the reasons it gives, GPU-hours of usage) is in cluster seconds,
and the answers carry ``time_scale`` so that a client can say what that is in wall time.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from frenzy_opt.core.enums import JobState
from frenzy_opt.core.readable import cluster_duration
from frenzy_opt.core.spec import JobSpec, parse_job
from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.launch.executors import Executor, ExitInfo, Launch
from frenzy_opt.planning.plans import DEFAULT_STEP_MODEL
from frenzy_opt.planning.problem import (
    Assignment,
    Option,
    OptionCache,
    ProblemJob,
    SchedulingProblem,
    Searched,
    no_option_message,
    problem_job,
)
from frenzy_opt.planning.restart import job_restart_s
from frenzy_opt.prediction.calibrations import CalibrationStore
from frenzy_opt.prediction.closedloop import Sample, recalibrate, sample_of
from frenzy_opt.service.accounting import placement_detail
from frenzy_opt.service.intake import Intake
from frenzy_opt.service.store import JobRecord, Store, StoreFenced, describe_fault, is_store_fault
from frenzy_opt.solvers.greedy import GreedyState

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.05
RETRY_MAX_S = 5.0
"""Back-off of a failed store write: doubling from 50 ms up to 5 s (the usual capped exponential back-off, as
in https://aws.amazon.com/builders-library/timeouts-retries-and-backoff-with-jitter/)."""
# Periodic reviews run at most this often in wall seconds, whatever the time scale (a design choice: at an
# hour of cluster time per second, a 60 s round would otherwise run 60 decisions a second on an idle queue).
MIN_REVIEW_WALL_S = 1.0


class Waiter(Protocol):
    """What :meth:`Orchestrator.submit` sets once a decision considered the job (a :class:`threading.Event`,
    or the API's bridge to its event loop)."""

    def set(self) -> None: ...


class Quotas:
    """Per-tenant GPU limits per type; a tenant with no entry for a type is unlimited there."""

    def __init__(self, limits: dict[str, dict[str, int]], tenant_of: Callable[[str], str]) -> None:
        self.limits = limits
        self.tenant_of = tenant_of
        self.used: dict[str, dict[str, int]] = {}
        self.held: dict[str, tuple[str, str, int]] = {}

    def limit(self, tenant: str, gpu_type: str) -> int | None:
        return self.limits.get(tenant, {}).get(gpu_type)

    def allows(self, job: str, option: Option) -> bool:
        tenant = self.tenant_of(job)
        limit = self.limit(tenant, option.gpu_type)
        return limit is None or self.used.get(tenant, {}).get(option.gpu_type, 0) + option.num_gpus <= limit

    def take(self, job: str, option: Option) -> None:
        tenant = self.tenant_of(job)
        per_type = self.used.setdefault(tenant, {})
        per_type[option.gpu_type] = per_type.get(option.gpu_type, 0) + option.num_gpus
        self.held[job] = (tenant, option.gpu_type, option.num_gpus)

    def release(self, job: str) -> None:
        held = self.held.pop(job, None)
        if held is not None:
            tenant, gpu_type, n = held
            self.used[tenant][gpu_type] -= n

    def explain(self, job: str, options: tuple[Option, ...]) -> str:
        tenant = self.tenant_of(job)
        parts = []
        for gpu_type in sorted({o.gpu_type for o in options}):
            limit = self.limit(tenant, gpu_type)
            fewest = min(o.num_gpus for o in options if o.gpu_type == gpu_type)
            used = self.used.get(tenant, {}).get(gpu_type, 0)
            if limit is not None:
                parts.append(f"{gpu_type}: needs {fewest}, quota {limit}, in use {used}")
        return f"over quota for tenant {tenant!r} ({'; '.join(parts)})"


@dataclass(slots=True)
class Run:
    """An attempt the ledger holds GPUs for."""

    job_id: str
    attempt: int
    option: Option
    nodes: tuple[int, ...]
    start_s: float
    end_s: float
    restart_s: float = 0.0
    """The part of the attempt that reloads a checkpoint before progressing (0 for a first attempt)."""

    def done_fraction(self, now: float) -> float:
        """How much of the attempt's work is done at ``now`` (by the predicted time: what the scheduler
        knows when the executor reports no steps)."""
        work = self.end_s - self.start_s - self.restart_s
        if work <= 0:
            return 1.0
        return min(max((now - self.start_s - self.restart_s) / work, 0.0), 1.0)


@dataclass(slots=True)
class _Pending:
    """State changes of one batch, written in one transaction."""

    transitions: list[tuple[str, JobState, str, dict[str, Any]]] = field(default_factory=list)

    def add(self, job_id: str, state: JobState, detail: str = "", **fields: Any) -> None:
        self.transitions.append((job_id, state, detail, fields))


@dataclass(frozen=True, slots=True)
class Submitted:
    """An accepted job (its spec parsed once, by whoever accepted it)."""

    record: JobRecord
    spec: JobSpec
    searched: Searched | None = None
    """Its plan search made elsewhere (a worker process), for the loop to adopt (:meth:`Orchestrator.submit`)."""


@dataclass(frozen=True, slots=True)
class Accepted:
    """Job rows other processes accepted, as the intake read them (:mod:`frenzy_opt.service.intake`)."""

    records: tuple[JobRecord, ...]


@dataclass(frozen=True, slots=True)
class Exited:
    """An attempt ended (from the executor's thread)."""

    job_id: str
    attempt: int
    info: ExitInfo


@dataclass(frozen=True, slots=True)
class CancelRequested:
    job_id: str
    done: Future[str]
    """Given the state the job ends in once the cancel is written."""


@dataclass(frozen=True, slots=True)
class Tick:
    """Nothing changed; decide anyway (after recovery)."""


@dataclass(frozen=True, slots=True)
class Shutdown:
    """End the loop (the service is stopping); not a preemption, which is a move of the HAS's review."""


@dataclass(frozen=True, slots=True)
class Broken:
    """The store broke for good (from the store's watch thread)."""

    reason: str


Event = Submitted | Accepted | Exited | CancelRequested | Tick | Shutdown | Broken


ESTIMATED_JOBS = 500
"""How deep into the queue a job's start is estimated: the planning pass runs under the orchestrator's lock,
for every job up to this one."""
ESTIMATE_REFRESH_S = 1.0
"""Planned estimates are reused for this long (wall seconds) unless the job asked about is not among them, so
a burst of requests costs one planning pass a second, not one per decision."""


@dataclass(frozen=True, slots=True)
class _Estimates:
    positions: dict[str, int]
    waits: dict[str, tuple[Option | None, float]]


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """Where a queued job stands (:meth:`Orchestrator.queue_info`)."""

    position: int | None
    """1 for the job the next decision considers first."""
    estimated_start_in_s: float | None
    """Cluster seconds until the GPUs it waits for are expected free (the greedy's plan of its wait, from the
    predicted ends of what runs and waits ahead); None past :data:`ESTIMATED_JOBS` or when unknown."""
    waiting_for: str | None
    """The GPUs it waits for, e.g. ``16 x H100-SXM5-80GB``."""
    deadline_risk: bool | None = None
    """Whether the planned run ends after the job's deadline (None: no deadline, or no plan yet)."""


@dataclass(slots=True)
class Job:
    """What the loop knows of one active job (queued, or holding GPUs); dropped once the job ends."""

    id: str
    tenant: str
    spec: JobSpec
    max_retries: int
    weight: float
    submitted_s: float
    """When it was first queued here (its deadline counts from then)."""
    attempts: int
    """Launches of any kind."""
    failures: int = 0
    """Attempts that failed on their own (bounded by ``max_retries``)."""
    moves: int = 0
    """Attempts the scheduler stopped or lost (never end the job)."""
    steps_left: int | None = None
    """Training steps still to run; None: the spec's (fewer after a preemption)."""
    run: Run | None = None
    reason: str | None = None
    """Why it waits, as the loop last wrote it (:meth:`Orchestrator.reason` adds the last decision's)."""
    progress: dict[str, Any] | None = None
    """The running attempt's latest worker report."""

    @property
    def steps(self) -> int:
        """Training steps the job still has to run."""
        return self.spec.training.train_steps if self.steps_left is None else self.steps_left

    def spec_with(self, steps: int | None) -> JobSpec:
        """The spec with ``steps`` training steps (None: the spec's own)."""
        if steps is None:
            return self.spec
        return replace(self.spec, training=replace(self.spec.training, train_steps=steps))

    def spec_now(self) -> JobSpec:
        """The spec with the steps the job still has to run."""
        return self.spec_with(self.steps_left)


class Orchestrator:
    """The scheduling loop (module docstring)."""

    def __init__(
        self,
        store: Store,
        cluster: ClusterSpec,
        executor: Executor,
        *,
        time_scale: float = 1.0,
        quotas: dict[str, dict[str, int]] | None = None,
        on_decision: Callable[[float, int], None] | None = None,
        cache: OptionCache | None = None,
        calibration: str | None = None,
        calibrations: CalibrationStore | None = None,
        preempt: bool | None = None,
        max_restarts: int = 20,
        review_every_s: float = 60.0,
        intake: bool = False,
    ) -> None:
        self.store, self.cluster, self.executor = store, cluster, executor
        self.review_every_s = review_every_s
        """Preemptive, a decision (and review) also runs this often in cluster seconds while jobs run, so a
        job that became movable since the last event can grow (:mod:`frenzy_opt.solvers.waterfill`); 0: only
        on events."""
        self.intake = Intake(store, self._accepted) if intake else None
        """Whether jobs come as rows other processes wrote (``frenzy serve --workers N``,
        :mod:`frenzy_opt.service.intake`) rather than by :meth:`submit`."""
        self._recovered_new: set[str] = set()
        """Jobs recovery read that the intake reads again (accepted while the service started)."""
        self.time_scale = time_scale
        self.topology = cache.topology if cache is not None else Topology(cluster)
        self._plan_filter = lambda plan, spec: executor.supports(plan, spec.model)
        self.calibration = calibration
        self.calibrations = calibrations or CalibrationStore()
        self.base_model = DEFAULT_STEP_MODEL
        if calibration and calibration in self.calibrations.names():
            self.base_model = self.calibrations.load(calibration)
        elif calibration:
            log.warning(
                "calibration profile %s does not exist in %s: planning with the shipped step-time parameters; "
                "the closed loop creates it from the first measured run",
                calibration,
                self.calibrations.root,
            )
        self.step_model = self.base_model
        for key, entry in store.calibration().items():  # efficiencies fitted by earlier runs
            gpu, _, precision = key.partition("@")
            self.step_model = self.step_model.with_efficiency(gpu, entry["efficiency_after"], precision or None)
        self.cache = cache or OptionCache(
            cluster, self.topology, plan_filter=self._plan_filter, step_model=self.step_model
        )
        self.samples: list[Sample] = []
        self.sample_tenants: dict[str, str] = {}
        """The tenant of each measured sample's job (``/v1/calibration`` shows a tenant only its own)."""
        self.calibration_report: dict[str, dict[str, Any]] = store.calibration()
        self.preempt = executor.preemptible if preempt is None else preempt
        """Whether the HAS may stop running jobs for shorter ones (:meth:`GreedyState.review`): only with an
        executor whose stopped attempts resume where they stopped."""
        self.max_restarts = max_restarts
        self.state = GreedyState(SchedulingProblem(topology=self.topology, jobs=()), patient=not self.preempt)
        self.jobs: dict[str, Job] = {}
        """The active jobs, one record each."""
        self.quotas = Quotas(quotas or {}, lambda job_id: self.jobs[job_id].tenant)
        self.decisions = 0
        self.on_decision = on_decision
        self._decided: dict[str, Waiter] = {}
        self._waiters = threading.Lock()
        """Guards ``_decided``: a submission registers its waiter without the loop's lock (held for a whole
        decision, which takes tens of milliseconds with thousands queued)."""
        self._wake: list[Waiter] = []
        self._fresh: set[str] = set()
        """Queued jobs no decision has considered yet."""
        self._estimates: tuple[float, tuple[int, int], _Estimates] = (-math.inf, (-1, -1), _Estimates({}, {}))
        """Queue positions and planned waits (:meth:`_estimated`): when (time.monotonic()) and at which
        (decision count, queue length) they were planned."""
        self._waiting: dict[str, tuple[Option | None, float]] = {}
        """What the last decision planned for the queued jobs it reached (the greedy's ``waiting``)."""
        self._events: queue.Queue[Event] = queue.Queue()
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._fault: str | None = None
        """Why the store did not take the loop's last write (None once it did)."""
        self.stepped_down: str | None = None
        """Why the loop stopped for good (another server took the store over)."""
        self._t0 = time.monotonic()

    # --- clock and lifecycle --------------------------------------------------------------------------

    @property
    def store_fault(self) -> str | None:
        """Why the store cannot take the loop's writes now (None while it can)."""
        return self.stepped_down or self.store.broken or self._fault or self.store.fault

    def now(self) -> float:
        """Cluster seconds since start."""
        return (time.monotonic() - self._t0) * self.time_scale

    def start(self) -> None:
        """Take the store's writer lock, recover from the store, then run the loop in a background thread."""
        if self.alive():
            return  # started already (e.g. by a harness, then by the app's lifespan)
        self._stopping.clear()  # an orchestrator stopped before may start again
        self.store.acquire_writer()
        self.store.on_broken.append(lambda reason: self._events.put(Broken(reason)))
        mark = self.store.last_seq() if self.intake is not None else 0  # before recovery: nothing falls between
        self.cache.claim()  # recovery here, then the loop: the cache's only writers, one after the other
        self.recover(after=None if self.intake is None else mark)
        self._thread = threading.Thread(target=self._loop, name="frenzy-orchestrator", daemon=True)
        self._thread.start()
        self._events.put(Tick())  # a first decision for what recovery queued
        if self.intake is not None:
            self.intake.start(mark)

    def stop(self, timeout: float = 10.0) -> None:
        if self.intake is not None:
            self.intake.stop()
        self._stopping.set()
        if self._thread is not None:
            self._events.put(Shutdown())
            self._thread.join(timeout)
            self._thread = None
        self.executor.shutdown()

    # --- called from other threads --------------------------------------------------------------------

    def submit(
        self,
        record: JobRecord,
        decided: Waiter | None = None,
        spec: JobSpec | None = None,
        *,
        searched: Searched | None = None,
    ) -> Waiter:
        """Queue an accepted job; ``decided`` (a new :class:`threading.Event` if not given) is set once a
        decision has considered it. ``spec`` is the record's spec as the caller parsed it (parsed here if
        not given). ``searched`` is its plan search made in a worker process (the API's admission) with the
        executor's ``plan_filter()``: the loop's own filter, a closure over the executor's ``supports``, does not
        pickle, and that function gives the same answers, so the search counts as made with the loop's filter;
        the loop adopts it (:meth:`OptionCache.adopt`) unless the step model changed meanwhile."""
        waiter: Waiter = threading.Event() if decided is None else decided
        if searched is not None and searched.plan_filter == self.executor.plan_filter():
            searched = replace(searched, plan_filter=self._plan_filter)
        with self._waiters:
            self._decided[record.id] = waiter
        if self.intake is None:  # else the intake reads the row (once: module docstring of intake)
            self._events.put(Submitted(record, parse_job(record.spec) if spec is None else spec, searched))
        return waiter

    def _accepted(self, records: list[JobRecord]) -> None:
        """Rows the intake read (its thread)."""
        self._events.put(Accepted(tuple(records)))

    def cancel(self, job_id: str) -> Future[str]:
        """Cancel a job; the future gives the state it ends in (``cancelled`` or its terminal state)."""
        result: Future[str] = Future()
        self._events.put(CancelRequested(job_id, result))
        return result

    def _on_exit(self, job_id: str, attempt: int, info: ExitInfo) -> None:
        self._events.put(Exited(job_id, attempt, info))

    def _on_report(self, job_id: str, attempt: int, record: dict[str, Any]) -> None:
        """A running attempt's latest worker report (kept in memory; the summary is stored at its end)."""
        with self._lock:
            job = self.jobs.get(job_id)
            if job is not None and job.run is not None and job.run.attempt == attempt:
                job.progress = {"attempt": attempt, **record}

    @property
    def running(self) -> dict[str, Run]:
        """The attempts the ledger holds GPUs for, by job."""
        with self._lock:
            return {j.id: j.run for j in self.jobs.values() if j.run is not None}

    def current_attempt(self, job_id: str) -> int | None:
        """The attempt the job runs now (None while it holds no GPUs)."""
        with self._lock:
            job = self.jobs.get(job_id)
            return None if job is None or job.run is None else job.run.attempt

    def progress(self, job_id: str) -> dict[str, Any] | None:
        """The running attempt's latest worker report, if any."""
        with self._lock:
            job = self.jobs.get(job_id)
            return None if job is None or job.progress is None else dict(job.progress)

    def reason(self, job_id: str) -> str | None:
        """Why a queued job waits (formatted on demand: a decision over a long queue does not build a sentence
        per job), in cluster seconds: from the estimates :meth:`queue_info` planned, else from the last
        decision (cheap: the answer to a submission plans nothing)."""
        with self._lock:
            record = self.jobs.get(job_id)
            reason = None if record is None else record.reason
            job = self.state.queue.get(job_id)
            if job is None or job_id in self._fresh:
                return reason
            estimates = self._estimates[2]
            planned = estimates.waits.get(job_id) or self._waiting.get(job_id)
            if planned is None:
                position = estimates.positions.get(job_id, 0)
                if position > ESTIMATED_JOBS:
                    return f"queued: behind the first {ESTIMATED_JOBS} jobs of the queue"
                return "queued: no GPU free for it at the last decision"
            option, start = planned
            if option is None:
                return self.quotas.explain(job_id, job.options)
            return self._why_waiting(job, option, start, estimates.positions.get(job_id))

    def _why_waiting(self, job: ProblemJob, option: Option, start: float, position: int | None) -> str:
        """One sentence: the GPUs it waits for, its place and estimated start, the types it could use, and its
        deadline when the planned run misses it."""
        eta = "unknown" if math.isinf(start) else cluster_duration(max(start - self.now(), 0.0), self.time_scale)
        fewest: dict[str, int] = {}
        for o in job.options:
            fewest[o.gpu_type] = min(fewest.get(o.gpu_type, o.num_gpus), o.num_gpus)
        types = ", ".join(f"{t} (from {n})" for t, n in sorted(fewest.items()))
        where = f"#{position} in the queue, " if position is not None else ""
        text = (
            f"waiting for {option.num_gpus} x {option.gpu_type} ({where}estimated start in {eta}); "
            f"it can run on {types}"
        )
        if job.deadline_s is not None and start + option.duration_s > job.deadline_s:
            late = cluster_duration(start + option.duration_s - job.deadline_s, self.time_scale)
            text += f"; deadline at risk: the planned run ends {late} past it"
        return text

    def queue_info(self, job_id: str) -> QueueInfo | None:
        """Where a queued job stands (None if it is not queued): its position in the order the next decision
        considers the queue, and when it is expected to start."""
        with self._lock:
            if job_id not in self.state.queue:
                return None
            estimates = self._estimated(job_id)
            option, start = estimates.waits.get(job_id, (None, math.inf))
            position = estimates.positions.get(job_id)
            if option is None or math.isinf(start):
                return QueueInfo(position, None, None)
            deadline = self.state.queue[job_id].deadline_s
            risk = None if deadline is None else start + option.duration_s > deadline
            wait = max(start - self.now(), 0.0)
            return QueueInfo(position, wait, f"{option.num_gpus} x {option.gpu_type}", risk)

    def _estimated(self, job_id: str) -> _Estimates:
        """The queue's positions and planned waits (:meth:`GreedyState.plan_waits` of the first
        :data:`ESTIMATED_JOBS` jobs), planned only when asked: again once decisions changed the queue and
        either :data:`ESTIMATE_REFRESH_S` passed or ``job_id`` is not among them (under ``_lock``)."""
        at, key, estimates = self._estimates
        now, current = time.monotonic(), (self.decisions, len(self.state.queue))
        if key != current and (now - at >= ESTIMATE_REFRESH_S or job_id not in estimates.positions):
            order, waits = self.state.plan_waits(self.now(), self.quotas, ESTIMATED_JOBS)
            estimates = _Estimates({job.id: i for i, job in enumerate(order, start=1)}, waits)
            self._estimates = (now, current, estimates)
        return estimates

    def calibration_snapshot(self) -> dict[str, Any]:
        """A consistent copy of the closed loop's state: the efficiencies planned with, the last refit's
        report per ``GPU@precision``, the measured samples and their jobs' tenants."""
        with self._lock:
            return {
                "efficiency": dict(self.step_model.efficiency),
                "report": dict(self.calibration_report),
                "samples": list(self.samples),
                "tenants": dict(self.sample_tenants),
            }

    def view(self) -> dict[str, Any]:
        """A consistent copy of the ledger: GPUs per type and node, free and used, running jobs."""
        with self._lock:
            nodes: list[dict[str, Any]] = []
            per_type: dict[str, dict[str, int]] = {}
            for node in self.topology.nodes:
                free = self.state.free[node.gpu.name].free[node.index]
                nodes.append({"name": node.name, "gpu_type": node.gpu.name, "gpus": node.num_gpus, "free": free})
                t = per_type.setdefault(node.gpu.name, {"gpus": 0, "free": 0, "used": 0})
                t["gpus"] += node.num_gpus
                t["free"] += free
                t["used"] += node.num_gpus - free
            running = [
                {
                    "job": j.id,
                    "tenant": j.tenant,
                    "gpu_type": j.run.option.gpu_type,
                    "num_gpus": j.run.option.num_gpus,
                    "nodes": [self.topology.nodes[i].name for i in j.run.nodes],
                    "attempt": j.run.attempt,
                }
                for j in self.jobs.values()
                if j.run is not None
            ]
            return {
                "name": self.cluster.name,
                "gpu_types": per_type,
                "nodes": nodes,
                "running": running,
                "queued": len(self.state.queue),
            }

    # --- the loop ---------------------------------------------------------------------------------------

    def _review_wait_s(self) -> float | None:
        """Wall seconds the loop waits for an event before a periodic review; None: no review is due."""
        if not self.preempt or self.review_every_s <= 0 or not self.state.by_job:
            return None
        return max(self.review_every_s / self.time_scale, MIN_REVIEW_WALL_S)

    def _loop(self) -> None:
        self.cache.claim()  # the loop is the plan cache's one writer: the API only reads it (OptionCache.cached)
        while not self._stopping.is_set():
            try:
                batch = [self._events.get(timeout=self._review_wait_s())]
            except queue.Empty:
                batch = []  # no event for a review period: a decision and review with nothing new
            while True:
                try:
                    batch.append(self._events.get_nowait())
                except queue.Empty:
                    break
            try:
                if not self.process(batch):
                    return
            except Exception:  # a defect in handling a batch must not stop scheduling for good
                log.exception("orchestrator: a batch of %d events failed; the loop goes on", len(batch))

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def process(self, batch: list[Event]) -> bool:
        """Handle a batch of events and run one decision; False once a stop event was seen. Public so that
        tests can drive the orchestrator without its thread."""
        if self.store.fenced:
            self._step_down(self.store.broken or "another server took the store over")
            return False
        pending = _Pending()
        cancels = [e for e in batch if isinstance(e, CancelRequested)]
        keep_going = not any(isinstance(e, Shutdown) for e in batch)
        with self._lock:
            for event in batch:
                if isinstance(event, Accepted):
                    for submitted in self._new(event.records, pending):
                        self._handle(submitted, pending)
                elif isinstance(event, Submitted | Exited | CancelRequested):
                    self._handle(event, pending)
            launches = self._decide(pending) if keep_going else []
        if not self._write(pending):
            return False  # stopped while the store could not write: recovery picks up from the store
        for launch in launches:
            self.executor.launch(launch, self._on_exit, self._on_report)
        # Waiters (a submission asking for its decision) hear of it once its launch is under way: an answer
        # that says "running" is followed by the attempt's logs, not by a 404 while the executor starts it.
        wake, self._wake = self._wake, []
        for waiter in wake:
            waiter.set()
        for cancel in cancels:
            try:
                record = self.store.get(cancel.job_id)
            except Exception as err:  # the cancel is written; only reading it back failed
                cancel.done.set_exception(err)
                continue
            cancel.done.set_result("unknown" if record is None else record.state)
        return keep_going

    def _new(self, records: tuple[JobRecord, ...], pending: _Pending) -> list[Submitted]:
        """The intake's rows this loop does not know yet, parsed; a row that does not parse is failed with
        the reason (module docstring)."""
        fresh: list[Submitted] = []
        for record in records:
            if record.id in self.jobs or record.id in self._recovered_new or record.state != JobState.QUEUED:
                self._recovered_new.discard(record.id)
                continue
            try:
                if record.problems:
                    raise ValueError("; ".join(record.problems))
                fresh.append(Submitted(record, parse_job(record.spec)))
            except Exception as err:
                log.error("intake: job %s quarantined: %s", record.id, err)
                self._drop(record.id, f"at intake: {err.__class__.__name__}: {err}", pending)
        return fresh

    def _handle(self, event: Submitted | Exited | CancelRequested, pending: _Pending) -> None:
        """One submit, exit or cancel event; one that raises fails its job with the reason (module
        docstring)."""
        job_id = event.record.id if isinstance(event, Submitted) else event.job_id
        try:
            if isinstance(event, Submitted):
                if event.searched is not None:  # searched in a worker: adopted, not searched again here
                    self.cache.adopt(event.spec, event.searched)
                self._enqueue(event.record, event.spec, pending)
            elif isinstance(event, Exited):
                self._exit(event.job_id, event.attempt, event.info, pending)
            else:
                self._cancel(event.job_id, pending)
        except Exception as err:
            kind = type(event).__name__.lower()
            log.exception("orchestrator: %s event of job %s failed", kind, job_id)
            self._drop(job_id, f"{kind} failed inside the scheduler: {err.__class__.__name__}: {err}", pending)

    def _end(self, job_id: str) -> None:
        """Forget a job that reached a terminal state (its GPUs released before); a submission still waiting
        for its first decision is answered."""
        self.jobs.pop(job_id, None)
        self.state.queue.pop(job_id, None)
        self._fresh.discard(job_id)
        self._mark_decided(job_id)

    def _step_down(self, reason: str) -> None:
        """Another server holds the store now: stop every run this one started (the new holder relaunches
        them as moves), write nothing more, stop the loop."""
        log.error("orchestrator: stepping down: %s", reason)
        self.stepped_down = reason
        self._stopping.set()
        with self._lock:
            for job in self.jobs.values():
                if job.run is not None:
                    self.executor.cancel(job.id)

    def _drop(self, job_id: str, reason: str, pending: _Pending) -> None:
        """Take a job out of the queue and the ledger and fail it with the reason (quarantine)."""
        job = self.jobs.get(job_id)
        if job is not None and job.run is not None:
            self.executor.cancel(job_id)
            self._release(job)
        self._end(job_id)
        pending.add(job_id, JobState.FAILED, f"quarantined: {reason}")

    def _write(self, pending: _Pending) -> bool:
        """Write a batch's state changes, retrying with back-off while the store is at fault (module
        docstring); False if the orchestrator was stopped before the store took them."""
        delay = RETRY_FIRST_S
        while True:
            try:
                self._flush(pending)
            except Exception as err:
                if not is_store_fault(err):
                    raise
                if self.store.fenced or isinstance(err, StoreFenced):
                    self._step_down(self.store.broken or str(err))
                    return False
                reason = describe_fault(err)
                if self._fault is None:
                    log.error("store: cannot write %d state changes (%s); retrying", len(pending.transitions), reason)
                self._fault = reason
                if self._stopping.wait(delay):
                    return False
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            if self._fault is not None:
                log.warning("store: the loop writes again after: %s", self._fault)
                self._fault = None
            return True

    def _flush(self, pending: _Pending) -> None:
        if pending.transitions:
            self.store.apply(pending.transitions)

    def _enqueue(self, record: JobRecord, spec: JobSpec, pending: _Pending) -> Job | None:
        """Queue an accepted (or recovered) job; None, with the job failed, when no plan fits the cluster."""
        options = self.cache.options(spec)
        if not options:
            pending.add(record.id, JobState.FAILED, no_option_message(record.id, spec, self.topology.cluster.name))
            self._mark_decided(record.id)
            return None
        job = self.jobs.get(record.id)
        if job is None:
            job = Job(
                id=record.id,
                tenant=record.tenant,
                spec=spec,
                max_retries=record.max_retries,
                weight=record.weight,
                submitted_s=self.now(),
                attempts=record.attempts,
                failures=record.failures,
                moves=record.moves,
            )
            self.jobs[record.id] = job
        self._queue(job, options, "queued: waiting for the next decision")
        return job

    def _queue(self, job: Job, options: tuple[Option, ...], reason: str) -> None:
        """Put the job in the HAS's queue with ``options``."""
        problem = problem_job(job.id, job.submitted_s, job.weight, options, job.spec)
        self.state.queue[job.id] = replace(problem, restart_s=self._restart_s(job))
        job.reason = reason
        self._fresh.add(job.id)

    def _restart_s(self, job: Job) -> float:
        """What one move of ``job`` costs (checkpoint save and load on the cluster's storage, start-up, warm-up:
        :mod:`frenzy_opt.planning.restart`)."""
        return job_restart_s(job.spec, self.cluster.storage, self.cache.per_step(job.spec))

    def _release(self, job: Job) -> Run | None:
        run, job.run, job.progress = job.run, None, None
        if run is not None:
            self.state.release(job.id)
            self.quotas.release(job.id)
        return run

    def _exit(self, job_id: str, attempt: int, info: ExitInfo, pending: _Pending) -> None:
        job = self.jobs.get(job_id)
        run = None if job is None else job.run
        if job is None or run is None or run.attempt != attempt:
            return  # a cancelled or superseded attempt
        self._release(job)
        if info.ok:
            measured, detail = info.measured, "completed"
            deadline = job.spec.scheduling.deadline_s
            if deadline is not None:
                ended = self.now() - job.submitted_s
                missed = ended - deadline if ended > deadline else None
                measured = replace(measured, deadline_s=deadline, end_after_submit_s=ended, deadline_missed_by_s=missed)
                if missed is not None:
                    detail = f"completed {cluster_duration(missed, self.time_scale)} after its deadline"
            pending.add(job_id, JobState.SUCCEEDED, detail, measured=measured.to_dict() or None)
            self._learn(job, run, info)
            self._end(job_id)
            return
        self._retry_or_fail(job, info.cause or "attempt failed", pending)

    def _learn(self, job: Job, run: Run, info: ExitInfo) -> None:
        """Closed loop: a measured run refits its GPU type's efficiency (:mod:`frenzy_opt.prediction.closedloop`);
        later plan searches use the refitted step-time model."""
        sample = sample_of(job.id, job.spec, run.option.plan, info.measured, self.cluster)
        if sample is None or info.measured.simulated:
            return
        self.samples.append(sample)
        self.sample_tenants[job.id] = job.tenant
        try:
            model, report = recalibrate([s for s in self.samples if s.key == sample.key], self.step_model)
        except ValueError:  # nothing the fitter can use (no measured run): keep the model
            return
        self.step_model = model
        self.calibration_report.update(report)
        try:
            self.store.save_calibration(report)
        except Exception as err:  # the fit lives on in memory; the next refit writes it again
            if not is_store_fault(err):
                raise
            log.warning("closed loop: cannot store the refitted efficiencies: %s", err)
        if self.calibration:  # the profile the service plans with learns from its runs
            try:
                self.calibrations.learn(self.calibration, model, report)
            except OSError as err:
                log.warning("closed loop: cannot write calibration profile %s: %s", self.calibration, err)
        self.cache = OptionCache(self.cluster, self.topology, plan_filter=self._plan_filter, step_model=self.step_model)
        self.cache.claim()

    def _retry_or_fail(self, job: Job, cause: str, pending: _Pending) -> None:
        """The attempt failed on its own: a failure, retried while failures <= max_retries."""
        job.failures += 1
        failures, limit = job.failures, job.max_retries
        if failures <= limit:
            pending.add(job.id, JobState.FAILED, f"attempt {job.attempts} failed: {cause}", failures=failures)
            pending.add(job.id, JobState.QUEUED, f"retry {failures} of {limit}")
            job.steps_left = None  # a failed attempt starts over
            self._queue(job, self.cache.options(job.spec), f"queued for retry {failures} of {limit} after: {cause}")
        else:
            why = f"attempt {job.attempts} failed: {cause}; {failures} failures, retry limit {limit} reached"
            pending.add(job.id, JobState.FAILED, why, failures=failures)
            self._end(job.id)

    def _lost(self, job: Job, cause: str, pending: _Pending) -> None:
        """The attempt was lost to the service, not to the job (a restart): a move; queued again, from the
        start (its progress is unknown)."""
        job.moves += 1
        job.steps_left = None
        why = f"moved: attempt {job.attempts} {cause}; queued again (move {job.moves})"
        pending.add(job.id, JobState.QUEUED, why, moves=job.moves)
        self._queue(job, self.cache.options(job.spec), f"queued again after a move: {cause}")

    def _cancel(self, job_id: str, pending: _Pending) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            return  # it ended already
        if job.run is not None:
            self.executor.cancel(job_id)
            self._release(job)
            pending.add(job_id, JobState.CANCELLED, "cancelled while running; GPUs released")
        elif job_id in self.state.queue:
            pending.add(job_id, JobState.CANCELLED, "cancelled while queued")
        self._end(job_id)

    def _steps_at(self, job: Job, now: float) -> int:
        """Steps the job still has to run if its attempt stopped at ``now``."""
        done = 0.0 if job.run is None else job.run.done_fraction(now)
        return max(1, math.ceil(job.steps * (1.0 - done)))

    def _resumed(self, job: Job, now: float) -> tuple[Option, ...]:
        """The job's options if it stopped now and resumed: the steps it has left, plus its restart cost."""
        spec = job.spec_with(self._steps_at(job, now) if job.run is not None else job.steps_left)
        restart = math.ceil(self._restart_s(job))
        return tuple(replace(o, duration_s=o.duration_s + restart) for o in self.cache.options(spec))

    def _preempt(self, now: float, pending: _Pending) -> None:
        """Stop the running jobs the HAS's review chose (module docstring): for a shorter job, or to grow
        into idle GPUs. They rejoin the queue with the steps they have left and their restart cost, and
        resume from their checkpoint."""
        moves = self.state.review(
            now,
            max_restarts=self.max_restarts,
            options_now=lambda j: self._resumed(self.jobs[j], now),
            admit=self.quotas,
        )
        for move in moves:
            job = self.jobs[move.job]
            before, left = job.steps, self._steps_at(job, now)
            options = self._resumed(job, now)
            # The review released its GPUs in the ledger already: only the quota and the executor are left.
            job.run, job.progress = None, None
            self.quotas.release(move.job)
            kind = "preempted" if move.reason == "preempt" else "grown"
            self.executor.cancel(move.job, f"{kind} by the scheduler, {move.why}" if move.why else kind)
            job.steps_left = left
            job.moves += 1
            options = move.cut(options)  # a growth: only the plans the review's division allows
            why = "for a shorter job" if move.reason == "preempt" else "to grow into idle GPUs"
            pending.add(
                move.job,
                JobState.QUEUED,
                f"moved ({kind}): stopped {why} after {before - left} of {before} steps"
                + (f", {move.why}" if move.why else "")
                + f"; resumes from its checkpoint (move {job.moves})",
                moves=job.moves,
            )
            self._queue(job, options, "queued: stopped, waiting to resume")

    def _decide(self, pending: _Pending) -> list[Launch]:
        now = self.now()
        tick = time.perf_counter()
        assignments = self.state.decide(now, admit=self.quotas)
        waiting = self.state.waiting
        if self.preempt:
            self._preempt(now, pending)
            if self.state.queue:
                assignments += self.state.decide(now, admit=self.quotas)
                waiting = {**waiting, **self.state.waiting}
        elapsed = time.perf_counter() - tick
        self.decisions += 1
        if self.on_decision is not None:
            self.on_decision(elapsed, len(self.state.queue))
        launches = [self._start(self.jobs[a.job], a, now, pending) for a in assignments]
        # Every queued job was considered: O(waiters) here, not O(queue) (a decision with a long queue spent
        # more time noting this per job than deciding).
        self._waiting = waiting
        self._fresh.clear()
        with self._waiters:
            considered = [j for j in self._decided if j in self.state.queue]
        for job_id in considered:
            self._mark_decided(job_id)
        return launches

    def _start(self, job: Job, a: Assignment, now: float, pending: _Pending) -> Launch:
        """Record one assignment of the decision (the ledger took its GPUs) and what to launch."""
        job.attempts += 1
        resumed = job.steps_left is not None
        restart = self._restart_s(job) if resumed else 0.0
        job.run = Run(
            job_id=job.id,
            attempt=job.attempts,
            option=a.option,
            nodes=a.nodes,
            start_s=now,
            end_s=a.end_s,
            restart_s=restart,
        )
        job.reason = None
        names = tuple(self.topology.nodes[i].name for i in a.nodes)
        plan = replace(a.option.plan, est_runtime_s=a.option.duration_s).to_dict()
        placement = {"nodes": list(names), "gpus_per_node": a.option.gpus_per_node, "start_s": now}
        detail = placement_detail(a.option.num_gpus, a.option.gpu_type, names)
        p = a.option.plan
        predicted = {
            "gpu_type": a.option.gpu_type,
            "peak_allocated_bytes": p.peak_allocated_bytes,
            "peak_reserved_bytes": p.peak_reserved_bytes,
            "device_used_bytes": p.device_used_bytes,
            "step_time_s": p.step_time_s,
            "runtime_s": a.option.duration_s,
        }
        deadline = job.spec.scheduling.deadline_s
        if deadline is not None:
            ends_in = a.end_s - job.submitted_s
            predicted |= {"deadline_s": deadline, "end_after_submit_s": ends_in, "deadline_risk": ends_in > deadline}
            if ends_in > deadline:
                late = cluster_duration(ends_in - deadline, self.time_scale)
                detail += f"; deadline at risk: predicted to end {late} past it"
                log.warning("decision: %s is predicted to end %s past its deadline", job.id, late)
        pending.add(
            job.id,
            JobState.SCHEDULED,
            detail,
            plan=plan,
            placement=placement,
            attempts=job.attempts,
            predicted=predicted,
        )
        pending.add(job.id, JobState.RUNNING, f"attempt {job.attempts} launched ({self.executor.name})")
        log.info("decision: %s attempt %d on %s (est. %.0f s)", job.id, job.attempts, detail, a.option.duration_s)
        self._mark_decided(job.id)
        return Launch(
            job_id=job.id,
            attempt=job.attempts,
            spec=job.spec_now(),
            option=a.option,
            nodes=names,
            gpus_per_node=a.option.gpus_per_node,
            duration_s=a.option.duration_s,
        )

    def _mark_decided(self, job_id: str) -> None:
        """Note that a decision considered the job; its waiter is woken once the batch is written."""
        with self._waiters:
            event = self._decided.pop(job_id, None)
        if event is not None:
            self._wake.append(event)

    # --- recovery ---------------------------------------------------------------------------------------

    def recover(self, after: int | None = None) -> dict[str, int]:
        """Rebuild the queue and the ledger from the store (module docstring); counts per outcome. ``after``:
        the intake's first mark (jobs accepted after it are read by both, and skipped by the intake)."""
        pending = _Pending()
        alive = self.executor.running()
        counts = {"queued": 0, "kept": 0, "moved": 0, "failed": 0, "quarantined": 0}
        with self._lock:
            for record in self.store.active():
                if after is not None and record.seq > after:
                    self._recovered_new.add(record.id)
                try:
                    counts[self._recover_one(record, alive, pending)] += 1
                except Exception as err:  # a row this service cannot run must not stop its start
                    reason = f"at start-up: {err.__class__.__name__}: {err}"
                    log.error("recovery: job %s quarantined %s", record.id, reason)
                    if record.id in alive:
                        self.executor.cancel(record.id)
                    self._drop(record.id, reason, pending)
                    counts["quarantined"] += 1
        self._flush(pending)
        return counts

    def _recover_one(self, record: JobRecord, alive: set[str], pending: _Pending) -> str:
        """Recover one active job; the outcome (a key of :meth:`recover`'s counts)."""
        if record.problems:
            raise ValueError("; ".join(record.problems))
        job = self._enqueue(record, parse_job(record.spec), pending)
        if record.state == JobState.QUEUED:
            return "queued"
        if job is None:  # no option on this cluster: failed with the reason
            if record.id in alive:
                self.executor.cancel(record.id)
            return "failed"
        del self.state.queue[record.id]
        self._fresh.discard(record.id)
        if record.id in alive and record.placement is not None and record.plan is not None:
            self._reattach(job, record)
            self.executor.adopt(record.id, record.attempts, self._on_exit)
            return "kept"
        self._lost(job, "lost on restart: the executor no longer runs it", pending)
        return "moved"

    def _reattach(self, job: Job, record: JobRecord) -> None:
        assert record.placement is not None and record.plan is not None
        by_name = {n.name: n.index for n in self.topology.nodes}
        missing = [name for name in record.placement["nodes"] if name not in by_name]
        if missing:
            raise ValueError(
                f"it runs on {', '.join(missing)}, which cluster {self.cluster.name} does not have "
                f"(nodes: {', '.join(sorted(by_name)[:8])}{', ...' if len(by_name) > 8 else ''})"
            )
        nodes = tuple(by_name[name] for name in record.placement["nodes"])
        options = self.cache.options(job.spec)
        option = next(
            (o for o in options if o.gpu_type == record.plan["gpu_type"] and o.num_gpus == record.plan["num_gpus"]),
            None,
        )
        if option is None:  # the plan is no longer among the options (e.g. a new catalogue): keep its shape
            option = options[0]
        per_node = int(record.placement["gpus_per_node"])
        end = self.now() + float(record.plan.get("est_runtime_s") or option.duration_s)
        self.state.occupy(record.id, nodes, per_node, end)
        self.quotas.take(record.id, option)
        job.reason = None
        job.run = Run(
            job_id=record.id, attempt=record.attempts, option=option, nodes=nodes, start_s=self.now(), end_s=end
        )


_IDS = random.Random(os.urandom(32))
"""Job ids: 64 random bits from a generator seeded by the operating system once per process (and again in a
forked child). An id per request from os.urandom cost a system call each, a fifth of a millisecond on this
virtual machine (issue 27). Ids need only be unique (tenants are kept apart by the ``tenant`` column, not by
unguessable ids): among a million jobs, two share an id with probability n^2 / 2^65 = 3e-8 (birthday bound)."""
os.register_at_fork(after_in_child=lambda: _IDS.seed(os.urandom(32)))


def new_job_id() -> str:
    return f"job-{_IDS.getrandbits(64):016x}"
