"""What every route of one service shares: its configuration, store, orchestrator, metrics and plan
searches (:class:`Service`, kept on ``app.state.service``), the request dependencies that reach them
(:data:`Svc`, :data:`Who`), and the answers common to several routes (404, 422, 429, 503, a job's JSON).

Handlers are plain (threaded) functions that open a database session only inside each store call, so no
request holds a connection while it waits; the orchestrator's loop is the only writer of job state.
"""

from __future__ import annotations

import asyncio
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Header, HTTPException, Request

from frenzy_opt.api.auth import Principal
from frenzy_opt.api.metrics import Metrics
from frenzy_opt.api.plansearch import PlanSearches, Throttled
from frenzy_opt.api.schemas import EventOut, JobIn, JobOut
from frenzy_opt.core.enums import JobState
from frenzy_opt.core.spec import JobSpec, parse_job
from frenzy_opt.planning.plans import NoFeasiblePlan
from frenzy_opt.planning.problem import Searched
from frenzy_opt.service.orchestrator import Orchestrator
from frenzy_opt.service.records import JobRecord
from frenzy_opt.service.store import Store

if TYPE_CHECKING:
    from frenzy_opt.api.app import ServiceConfig

RETRY_AFTER_S = 5
"""What a 503 asks the client to wait: the orchestrator's write back-off tops out at 5 s."""
STORE_THREADS = 2
"""Threads that run a submission's store calls. Few on purpose: a submission waits for its decision on the
event loop, not in a thread, and every Python thread that wants the interpreter lock at once lengthens the
others' waits by its switch interval (5 ms, sys.getswitchinterval), which under concurrency delayed the
event loop by seconds."""


@dataclass
class Service:
    """One service's parts (module docstring)."""

    config: ServiceConfig
    store: Store
    orchestrator: Orchestrator
    metrics: Metrics
    searches: PlanSearches
    store_calls: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=STORE_THREADS, thread_name_prefix="frenzy-store")
    )
    """Threads that run a submission's store calls (start on first use; one pool for the app's life)."""

    def writable(self, *, file: bool = True) -> None:
        """503 unless the store takes writes (no query: the store's and the loop's last word, and, unless
        ``file`` is False because the write that follows checks it, the file's identity)."""
        reason = self.orchestrator.store_fault or (self.store.file_problem() if file else None)
        if reason is not None:
            self.metrics.unavailable.inc()
            raise unavailable(reason, permanent=self.permanent())

    def permanent(self) -> bool:
        """Whether the store's fault is one no retry clears (a damaged database, another server took over)."""
        return self.store.broken is not None or self.orchestrator.stepped_down is not None

    def principal_of(self, authorization: str | None) -> Principal:
        principal = self.config.tenants.authenticate(authorization)
        if principal is None:
            raise HTTPException(401, "missing or unknown bearer token", headers={"WWW-Authenticate": "Bearer"})
        return principal

    async def feasible(self, spec: JobSpec, tenant: str) -> Searched | None:
        """422 (counted as rejected) unless some GPU type of the cluster can hold the job under its placement
        rules; 429 (counted as throttled) when its search is over the tenant's limits.

        A job shape the scheduler's option cache holds is answered from it, before any lock or thread hop
        (None: nothing to hand over). Another is searched in a worker process with the scheduler's step model
        and the executor's plan filter (:meth:`PlanSearches.admission`), and the search returned: the
        submission hands it to the scheduler, whose loop adopts it rather than search again."""
        cache = self.orchestrator.cache
        known = cache.cached(spec)
        if known is not None and known.options:
            return None
        try:
            return await self.searches.admission(
                spec, tenant, cache.step_model, self.config.executor.plan_filter(), cache.max_options_per_type
            )
        except Throttled as err:
            self.metrics.throttled.inc()
            raise too_many(err) from None
        except NoFeasiblePlan as err:
            self.metrics.rejected.inc()
            raise unprocessable(str(err)) from None

    def job_out(
        self, record: JobRecord, history: list[EventOut] | None = None, *, progress: bool = False, queue: bool = True
    ) -> JobOut:
        """A job's JSON: the store's record with what only the scheduler knows (why it waits, where it stands
        in the queue, its progress). ``queue=False`` (a submission's answer) leaves the queue position and
        start estimate out: planning them costs the scheduler a pass over the queue."""
        info = self.orchestrator.queue_info(record.id) if queue and record.state == JobState.QUEUED else None
        out = job_out(
            record,
            self.orchestrator.reason(record.id),
            history,
            self.orchestrator.progress(record.id) if progress else None,
        )
        out.time_scale = self.orchestrator.time_scale
        predicted, measured = record.predicted or {}, record.measured or {}
        # queued: the planned wait and run (a stopped attempt's prediction no longer holds); else the placement's
        out.deadline_risk = predicted.get("deadline_risk") if record.state != JobState.QUEUED else None
        out.deadline_missed_by_s = measured.get("deadline_missed_by_s")
        if info is not None:
            out.queue_position = info.position
            out.estimated_start_in_s = info.estimated_start_in_s
            out.waiting_for = info.waiting_for
            out.deadline_risk = info.deadline_risk
        return out


async def service_of(request: Request) -> Service:
    """(Dependencies are ``async``: FastAPI runs a plain function dependency in its thread pool, a thread hop
    per request on the submission path.)"""
    service: Service = request.app.state.service
    return service


Svc = Annotated[Service, Depends(service_of)]
Auth = Annotated[str | None, Header(description="`Bearer <token>`; not needed in local mode")]


async def principal(service: Svc, authorization: Auth = None) -> Principal:
    """The caller (401 unless its bearer token is known, or the service has no tokens)."""
    return service.principal_of(authorization)


Who = Annotated[Principal, Depends(principal)]


def visible(record: JobRecord | None, who: Principal) -> JobRecord:
    if record is None or (not who.admin and record.tenant != who.tenant):
        raise HTTPException(404, "no such job")  # another tenant's job does not exist for you
    return record


def parse_spec(body: JobIn) -> tuple[JobSpec, dict[str, Any]]:
    """The one parse of a submitted spec (:func:`frenzy_opt.core.spec.parse_job`): the spec, and the mapping
    the store keeps; 422 with the reason."""
    mapping = body.spec_mapping()
    try:
        return parse_job(mapping), mapping
    except ValueError as err:
        raise unprocessable(str(err)) from None


class Decided:
    """Set from the orchestrator's thread once a decision considered the job; awaited on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()

    def set(self) -> None:
        self.loop.call_soon_threadsafe(self._done)

    def _done(self) -> None:
        if not self.future.done():
            self.future.set_result(None)


def unavailable(reason: str, *, permanent: bool = False) -> HTTPException:
    """503: with ``Retry-After`` for a fault that clears by itself; without it, and saying what to do, for one
    that needs an operator."""
    if permanent:
        return HTTPException(503, f"the job store cannot serve ({reason})")
    return HTTPException(
        503,
        f"the job store cannot serve now ({reason}); retry later",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def too_many(err: Throttled) -> HTTPException:
    """429 with ``Retry-After`` (whole seconds, at least 1): over the tenant's plan-search limits."""
    return HTTPException(429, str(err), headers={"Retry-After": str(max(1, math.ceil(err.retry_after_s)))})


def unprocessable(message: str, field_path: tuple[str, ...] = ("body",)) -> HTTPException:
    return HTTPException(status_code=422, detail=[{"loc": list(field_path), "msg": message, "type": "value_error"}])


def job_out(
    record: JobRecord,
    reason: str | None,
    history: list[EventOut] | None = None,
    progress: dict[str, Any] | None = None,
) -> JobOut:
    return JobOut(
        id=record.id,
        name=record.name,
        tenant=record.tenant,
        state=record.state,
        reason=reason if reason is not None and record.state == JobState.QUEUED else record.reason,
        attempts=record.attempts,
        failures=record.failures,
        moves=record.moves,
        max_retries=record.max_retries,
        created_at=record.created_at,
        updated_at=record.updated_at,
        plan=record.plan,
        placement=record.placement,
        predicted=record.predicted,
        measured=record.measured,
        progress=progress if record.state == JobState.RUNNING else None,
        history=history,
    )
