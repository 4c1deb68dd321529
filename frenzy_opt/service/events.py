"""The orchestrator loop's typed events, and the batch of state changes that handling them produces.

Everything that changes a job's state arrives on the loop's one queue as an :data:`Event` (a job accepted, an
attempt ended, a cancel request, a stop); the loop handles a batch of them and writes their state changes
(:class:`Pending`) in one transaction before the executor is told to launch
(:mod:`frenzy_opt.service.orchestrator`).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from frenzy_opt.core.enums import JobState
from frenzy_opt.core.spec import JobSpec
from frenzy_opt.launch.executors import ExitInfo
from frenzy_opt.planning.problem import Searched
from frenzy_opt.service.records import JobRecord


class Waiter(Protocol):
    """What :meth:`Orchestrator.submit` sets once a decision considered the job (a :class:`threading.Event`,
    or the API's bridge to its event loop)."""

    def set(self) -> None: ...


@dataclass(slots=True)
class Pending:
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
