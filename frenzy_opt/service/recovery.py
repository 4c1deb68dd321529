"""The orchestrator's recovery at start (:meth:`Recovery.recover`): the store's active jobs against what the
executor still runs. Queued jobs are queued again in acceptance order; scheduled and running ones the executor
still runs keep their GPUs (taken again in the ledger and the quotas); the others were lost with the service's
process and are queued again as a move. A row this service cannot run (a model no longer in the catalogue,
unreadable JSON, a node the cluster lacks, a state this version does not know) is quarantined: failed with the
reason.
"""

from __future__ import annotations

from frenzy_opt.core.enums import JobState
from frenzy_opt.core.spec import parse_job
from frenzy_opt.service.events import Pending
from frenzy_opt.service.jobs import Job, Run
from frenzy_opt.service.loopstate import log
from frenzy_opt.service.records import JobRecord
from frenzy_opt.service.transitions import Transitions


class Recovery(Transitions):
    """Recovery at start (module docstring)."""

    def recover(self, after: int | None = None) -> dict[str, int]:
        """Rebuild the queue and the ledger from the store (module docstring); counts per outcome. ``after``:
        the intake's first mark (jobs accepted after it are read by both, and skipped by the intake)."""
        pending = Pending()
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

    def _recover_one(self, record: JobRecord, alive: set[str], pending: Pending) -> str:
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

    def _lost(self, job: Job, cause: str, pending: Pending) -> None:
        """The attempt was lost to the service, not to the job (a restart): a move; queued again, from the
        start (its progress is unknown)."""
        job.moves += 1
        job.steps_left = None
        why = f"moved: attempt {job.attempts} {cause}; queued again (move {job.moves})"
        pending.add(job.id, JobState.QUEUED, why, moves=job.moves)
        self._queue(job, self.cache.options(job.spec), f"queued again after a move: {cause}")
