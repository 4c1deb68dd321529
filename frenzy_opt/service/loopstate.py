"""The orchestrator's state (:class:`LoopState`), which every part of the loop reads and writes: the store, the
cluster and its executor, the GPU ledger (the greedy's state), one record per active job, the tenants' quotas,
the plan cache and the step-time model it plans with, the event queue and the submissions' waiters; and the
callbacks through which other threads (the intake, the executor) put events on the queue.

The loop's parts are mixins over this state, one concept a module: :mod:`frenzy_opt.service.learning` (the closed
loop), :mod:`frenzy_opt.service.transitions` (each job's state machine), :mod:`frenzy_opt.service.decisions`
(decisions, preemption, launches), :mod:`frenzy_opt.service.recovery` (recovery at start) and
:mod:`frenzy_opt.service.queries` (what other threads ask); :class:`frenzy_opt.service.orchestrator.Orchestrator`
joins them with the loop itself.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.launch.executors import Executor, ExitInfo
from frenzy_opt.planning.plans import DEFAULT_STEP_MODEL
from frenzy_opt.planning.problem import Option, OptionCache, SchedulingProblem
from frenzy_opt.prediction.calibrations import CalibrationStore
from frenzy_opt.prediction.closedloop import Sample
from frenzy_opt.service.events import Accepted, Event, Exited, Pending, Waiter
from frenzy_opt.service.intake import Intake
from frenzy_opt.service.jobs import Estimates, Job
from frenzy_opt.service.quotas import Quotas
from frenzy_opt.service.records import JobRecord
from frenzy_opt.service.store import Store
from frenzy_opt.solvers.greedy import GreedyState

log = logging.getLogger("frenzy_opt.service.orchestrator")
"""Every part of the loop logs as the orchestrator (one logger to configure, whichever module writes)."""


class LoopState:
    """The orchestrator's state (module docstring); callers construct
    :class:`frenzy_opt.service.orchestrator.Orchestrator`."""

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
        self.state = GreedyState(
            SchedulingProblem(topology=self.topology, jobs=()), patient=not self.preempt, max_restarts=max_restarts
        )
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
        self._estimates: tuple[float, tuple[int, int], Estimates] = (-math.inf, (-1, -1), Estimates({}, {}))
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

    def now(self) -> float:
        """Cluster seconds since start."""
        return (time.monotonic() - self._t0) * self.time_scale

    # --- called from other threads --------------------------------------------------------------------

    def _accepted(self, records: list[JobRecord]) -> None:
        """Rows the intake read (its thread)."""
        self._events.put(Accepted(tuple(records)))

    def _on_exit(self, job_id: str, attempt: int, info: ExitInfo) -> None:
        self._events.put(Exited(job_id, attempt, info))

    def _on_report(self, job_id: str, attempt: int, record: dict[str, Any]) -> None:
        """A running attempt's latest worker report (kept in memory; the summary is stored at its end)."""
        with self._lock:
            job = self.jobs.get(job_id)
            if job is not None and job.run is not None and job.run.attempt == attempt:
                job.progress = {"attempt": attempt, **record}

    # --- shared by the loop's parts ---------------------------------------------------------------------

    def _mark_decided(self, job_id: str) -> None:
        """Note that a decision considered the job; its waiter is woken once the batch is written."""
        with self._waiters:
            event = self._decided.pop(job_id, None)
        if event is not None:
            self._wake.append(event)

    def _flush(self, pending: Pending) -> None:
        if pending.transitions:
            self.store.apply(pending.transitions)
