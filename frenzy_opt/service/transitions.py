"""Each job's state machine in the orchestrator, driven by the loop's events:

    queued -> scheduled -> running -> succeeded | failed | cancelled
    failed -> queued (retry, while failures <= max_retries)

An accepted (or recovered) job is queued with its plan options, or failed when none fits the cluster. An
attempt's end releases its GPUs and succeeds the job (a measured run feeds the closed loop,
:mod:`frenzy_opt.service.learning`), or fails it: retried while failures <= max_retries, else failed for good.
A cancel releases its GPUs and ends it. An event whose handling raises is logged and its job failed with the
reason (quarantined), not the loop; so is an intake row that does not parse. (Moves, ``running -> queued``:
:mod:`frenzy_opt.service.decisions` and :mod:`frenzy_opt.service.recovery`.)
"""

from __future__ import annotations

from dataclasses import replace

from frenzy_opt.core.enums import JobState
from frenzy_opt.core.readable import cluster_duration
from frenzy_opt.core.spec import JobSpec, parse_job
from frenzy_opt.launch.executors import ExitInfo
from frenzy_opt.planning.problem import Option, no_option_message, problem_job
from frenzy_opt.planning.restart import job_restart_s
from frenzy_opt.service.events import CancelRequested, Exited, Pending, Submitted
from frenzy_opt.service.jobs import Job, Run
from frenzy_opt.service.learning import Learning
from frenzy_opt.service.loopstate import log
from frenzy_opt.service.records import JobRecord


class Transitions(Learning):
    """Each job's state machine (module docstring)."""

    def _new(self, records: tuple[JobRecord, ...], pending: Pending) -> list[Submitted]:
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

    def _handle(self, event: Submitted | Exited | CancelRequested, pending: Pending) -> None:
        """One submit, exit or cancel event; one that raises fails its job with the reason (module
        docstring)."""
        job_id = event.record.id if isinstance(event, Submitted) else event.job_id
        try:
            if isinstance(event, Submitted):
                if event.searched is not None:  # searched in a worker: adopted, not searched again here
                    self.cache.adopt(event.spec, event.searched)
                if self._enqueue(event.record, event.spec, pending) is not None:
                    # a submission (not a job recovered or queued again): the arrival rate the HAS prices
                    self.state.note_arrival(self.now(), event.record.weight)
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

    def _drop(self, job_id: str, reason: str, pending: Pending) -> None:
        """Take a job out of the queue and the ledger and fail it with the reason (quarantine)."""
        job = self.jobs.get(job_id)
        if job is not None and job.run is not None:
            self.executor.cancel(job_id)
            self._release(job)
        self._end(job_id)
        pending.add(job_id, JobState.FAILED, f"quarantined: {reason}")

    def _enqueue(self, record: JobRecord, spec: JobSpec, pending: Pending) -> Job | None:
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

    def _exit(self, job_id: str, attempt: int, info: ExitInfo, pending: Pending) -> None:
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

    def _retry_or_fail(self, job: Job, cause: str, pending: Pending) -> None:
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

    def _cancel(self, job_id: str, pending: Pending) -> None:
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
