"""What the orchestrator loop knows of jobs: one :class:`Job` record per active job, the :class:`Run` it holds
GPUs for, where a queued job stands (:class:`QueueInfo`, planned as :class:`Estimates`), and new job ids."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, replace
from typing import Any

from frenzy_opt.core.spec import JobSpec
from frenzy_opt.planning.problem import Option


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


@dataclass(frozen=True, slots=True)
class Estimates:
    """Queue positions and planned waits (:meth:`Orchestrator.queue_info`)."""

    positions: dict[str, int]
    waits: dict[str, tuple[Option | None, float]]


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """Where a queued job stands (:meth:`Orchestrator.queue_info`)."""

    position: int | None
    """1 for the job the next decision considers first."""
    estimated_start_in_s: float | None
    """Cluster seconds until the GPUs it waits for are expected free (the greedy's plan of its wait, from the
    predicted ends of what runs and waits ahead); None past :data:`frenzy_opt.service.queries.ESTIMATED_JOBS`
    or when unknown."""
    waiting_for: str | None
    """The GPUs it waits for, e.g. ``16 x H100-SXM5-80GB``."""
    deadline_risk: bool | None = None
    """Whether the planned run ends after the job's deadline (None: no deadline, or no plan yet)."""


_IDS = random.Random(os.urandom(32))
"""Job ids: 64 random bits from a generator seeded by the operating system once per process (and again in a
forked child). An id per request from os.urandom cost a system call each, a fifth of a millisecond on this
virtual machine (issue 27). Ids need only be unique (tenants are kept apart by the ``tenant`` column, not by
unguessable ids): among a million jobs, two share an id with probability n^2 / 2^65 = 3e-8 (birthday bound)."""
os.register_at_fork(after_in_child=lambda: _IDS.seed(os.urandom(32)))


def new_job_id() -> str:
    return f"job-{_IDS.getrandbits(64):016x}"
