"""The orchestrator's decisions: one greedy HAS decision per batch of events
(:class:`frenzy_opt.solvers.greedy.GreedyState`, the same code the simulator and ``frenzy solve`` run), with
per-tenant quotas as its admission hook. With a preemptive executor the HAS's review then stops running jobs, for
a shorter job or to grow into idle GPUs: a move (``running -> queued``) that never ends a job; a moved job rejoins
the queue with the steps it has left and its restart cost, and resumes from its checkpoint. Each assignment
becomes the job's scheduled and running transitions and the :class:`Launch` handed to the executor once the batch
is written.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from frenzy_opt.core.enums import JobState
from frenzy_opt.core.readable import cluster_duration
from frenzy_opt.launch.executors import Launch
from frenzy_opt.planning.problem import Assignment, Option
from frenzy_opt.service.accounting import placement_detail
from frenzy_opt.service.events import Pending
from frenzy_opt.service.jobs import Job, Run
from frenzy_opt.service.loopstate import log
from frenzy_opt.service.transitions import Transitions


class Decisions(Transitions):
    """Decisions, preemption and launches (module docstring)."""

    def _steps_at(self, job: Job, now: float) -> int:
        """Steps the job still has to run if its attempt stopped at ``now``."""
        done = 0.0 if job.run is None else job.run.done_fraction(now)
        return max(1, math.ceil(job.steps * (1.0 - done)))

    def _resumed(self, job: Job, now: float) -> tuple[Option, ...]:
        """The job's options if it stopped now and resumed: the steps it has left, plus its restart cost."""
        spec = job.spec_with(self._steps_at(job, now) if job.run is not None else job.steps_left)
        restart = math.ceil(self._restart_s(job))
        return tuple(replace(o, duration_s=o.duration_s + restart) for o in self.cache.options(spec))

    def _preempt(self, now: float, pending: Pending) -> dict[str, tuple[Option, ...]]:
        """Stop the running jobs the HAS's review chose (module docstring): for a shorter job, or to grow
        into idle GPUs. They rejoin the queue with the steps they have left and their restart cost, and
        resume from their checkpoint. Returns the grown jobs' options before the review's cut."""
        grown: dict[str, tuple[Option, ...]] = {}
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
            if move.reason == "grow":
                grown[move.job] = options
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
        return grown

    def _decide(self, pending: Pending) -> list[Launch]:
        now = self.now()
        tick = time.perf_counter()
        assignments = self.state.decide(now, admit=self.quotas)
        waiting = self.state.waiting
        if self.preempt:
            grown = self._preempt(now, pending)
            if self.state.queue:
                assignments += self.state.decide(now, admit=self.quotas)
                waiting = {**waiting, **self.state.waiting}
            # A growth's cut holds for that decision only: a grown job it did not start (another job took the
            # GPUs it was divided) waits with all its plans again (kept cut, it could wait for hours).
            started = {a.job for a in assignments}
            for job_id, options in grown.items():
                if job_id not in started and job_id in self.state.queue:
                    self._queue(self.jobs[job_id], options, "queued: stopped, waiting to resume")
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

    def _start(self, job: Job, a: Assignment, now: float, pending: Pending) -> Launch:
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
