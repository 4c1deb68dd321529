"""The orchestrator: one background loop that owns the GPU ledger and every job's state machine.

    queued -> scheduled -> running -> succeeded | failed | cancelled
    failed -> queued (retry, while failures <= max_retries)
    running -> queued (a move: preempted, grown or shrunk, lost to a restart of the service)

Three counters per job: ``attempts`` (launches of any kind), ``failures`` (attempts that failed on their own: a
rank's non-zero exit, a node failure under it; only these count against ``max_retries``) and ``moves`` (attempts
the scheduler stopped or lost; they never end a job).

Everything that changes state arrives as an event on one queue (:mod:`frenzy_opt.service.events`) — a job
accepted, an attempt ended (from the executor's thread), a cancel request, a stop — and the loop handles a batch
of them (:mod:`frenzy_opt.service.transitions`), then runs one greedy HAS decision
(:mod:`frenzy_opt.service.decisions`: :class:`frenzy_opt.solvers.greedy.GreedyState`, the same code the simulator
and ``frenzy solve`` run) and hands each placement to the executor. The ledger is the greedy state's free-GPU
index: GPUs are taken only by a decision and given back on every end of an attempt (success, failure,
cancel), so nothing is double-booked (property-tested). All state changes of a batch are written to the
store in one transaction before the executor is told to launch.

Per-tenant quotas per GPU type (Kueue's ClusterQueue nominal quotas, without borrowing) are enforced inside
the decision (:class:`frenzy_opt.service.quotas.Quotas`, the greedy's admission hook): a job over its
tenant's quota waits, with the reason.

Recovery (:meth:`Orchestrator.start`, :mod:`frenzy_opt.service.recovery`): queued jobs are queued again in
acceptance order; scheduled and running ones the executor still runs keep their GPUs; the others were lost with
the service's process and are queued again as a move.

Faults (:mod:`frenzy_opt.service.store`, :mod:`frenzy_opt.service.faults`): the loop never dies of one. A batch
whose state changes the store cannot write (a lock held past the busy timeout, a full disk, a deleted file, a
database server gone) is kept, with its launches held back, and written again with exponential back-off until the
store takes it; meanwhile :attr:`Orchestrator.store_fault` says why (the API answers 503 with ``Retry-After``)
and new events wait in the queue. An event whose handling raises is logged and its job failed with the reason,
not the loop. At start the service takes the store's writer lock before it recovers, and recovery quarantines
rows it cannot run (a model no longer in the catalogue, unreadable JSON, a node the cluster lacks, a state this
version does not know) as failed with the reason. A store that breaks for good because another server took it
over (fenced, :mod:`frenzy_opt.service.writer`) makes the loop step down: it cancels its runs, writes nothing more
and stops; ``/healthz`` says why.

Cluster time is wall time since start x ``time_scale`` (the simulated executor's scale), so predicted
durations and the scheduler's clock agree. The service speaks one clock, cluster time: every duration it
answers (a queued job's estimated start, the reasons it gives, GPU-hours of usage) is in cluster seconds,
and the answers carry ``time_scale`` so that a client can say what that is in wall time.

:class:`Orchestrator` is the loop itself (its lifecycle, a batch's handling and the back-off of its writes) over
mixins that each own one part, all over one state (:mod:`frenzy_opt.service.loopstate`): the closed loop
(:mod:`frenzy_opt.service.learning`), what other threads ask (:mod:`frenzy_opt.service.queries`), jobs' records
and ids (:mod:`frenzy_opt.service.jobs`).
"""

from __future__ import annotations

import queue
import threading

from frenzy_opt.service.decisions import Decisions
from frenzy_opt.service.events import (
    Accepted,
    Broken,
    CancelRequested,
    Event,
    Exited,
    Pending,
    Shutdown,
    Submitted,
    Tick,
)
from frenzy_opt.service.faults import describe_fault, is_store_fault
from frenzy_opt.service.loopstate import log
from frenzy_opt.service.queries import Queries
from frenzy_opt.service.recovery import Recovery
from frenzy_opt.service.schema import StoreFenced

RETRY_FIRST_S = 0.05
RETRY_MAX_S = 5.0
"""Back-off of a failed store write: doubling from 50 ms up to 5 s (the usual capped exponential back-off, as
in https://aws.amazon.com/builders-library/timeouts-retries-and-backoff-with-jitter/)."""
# Periodic reviews run at most this often in wall seconds, whatever the time scale (a design choice: at an
# hour of cluster time per second, a 60 s round would otherwise run 60 decisions a second on an idle queue).
MIN_REVIEW_WALL_S = 1.0


class Orchestrator(Queries, Recovery, Decisions):
    """The scheduling loop (module docstring)."""

    # --- clock and lifecycle --------------------------------------------------------------------------

    @property
    def store_fault(self) -> str | None:
        """Why the store cannot take the loop's writes now (None while it can)."""
        return self.stepped_down or self.store.broken or self._fault or self.store.fault

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

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

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

    def process(self, batch: list[Event]) -> bool:
        """Handle a batch of events and run one decision; False once a stop event was seen. Public so that
        tests can drive the orchestrator without its thread."""
        if self.store.fenced:
            self._step_down(self.store.broken or "another server took the store over")
            return False
        pending = Pending()
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

    def _write(self, pending: Pending) -> bool:
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
