"""What other threads (the API's handlers) ask of the orchestrator: submit and cancel a job (events on the loop's
queue), and consistent read-outs under the loop's lock: the attempts running, a job's progress, a queued job's
place, estimated start and the reason it waits (in cluster seconds), the ledger's view, the closed loop's state.
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from frenzy_opt.core.readable import cluster_duration
from frenzy_opt.core.spec import JobSpec, parse_job
from frenzy_opt.planning.problem import Option, ProblemJob, Searched
from frenzy_opt.service.events import CancelRequested, Submitted, Waiter
from frenzy_opt.service.jobs import Estimates, QueueInfo, Run
from frenzy_opt.service.loopstate import LoopState
from frenzy_opt.service.records import JobRecord

ESTIMATED_JOBS = 500
"""How deep into the queue a job's start is estimated: the planning pass runs under the orchestrator's lock,
for every job up to this one."""
ESTIMATE_REFRESH_S = 1.0
"""Planned estimates are reused for this long (wall seconds) unless the job asked about is not among them, so
a burst of requests costs one planning pass a second, not one per decision."""


class Queries(LoopState):
    """What other threads ask (module docstring)."""

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

    def cancel(self, job_id: str) -> Future[str]:
        """Cancel a job; the future gives the state it ends in (``cancelled`` or its terminal state)."""
        result: Future[str] = Future()
        self._events.put(CancelRequested(job_id, result))
        return result

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

    def _estimated(self, job_id: str) -> Estimates:
        """The queue's positions and planned waits (:meth:`GreedyState.plan_waits` of the first
        :data:`ESTIMATED_JOBS` jobs), planned only when asked: again once decisions changed the queue and
        either :data:`ESTIMATE_REFRESH_S` passed or ``job_id`` is not among them (under ``_lock``)."""
        at, key, estimates = self._estimates
        now, current = time.monotonic(), (self.decisions, len(self.state.queue))
        if key != current and (now - at >= ESTIMATE_REFRESH_S or job_id not in estimates.positions):
            order, waits = self.state.plan_waits(self.now(), self.quotas, ESTIMATED_JOBS)
            estimates = Estimates({job.id: i for i, job in enumerate(order, start=1)}, waits)
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
