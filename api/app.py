"""The HTTP service: submit LLM training jobs with no hardware named; frenzy-opt plans, queues, places,
launches and tracks them. Versioned under ``/v1``; OpenAPI at ``/openapi.json`` and ``/docs``.

Handlers are plain (threaded) functions that open a database session only inside each store call, so no
request holds a connection while it waits; the orchestrator's loop is the only writer of job state.

Faults answer in JSON, never a plain-text 500 or a dropped connection: while the store cannot write (or its
file is gone) every request that needs it gets 503 with ``Retry-After``, and ``/healthz`` says why. Plan
searches of the dry-run endpoint run in a worker process (:class:`PlanSearches`), off the request path: a
search of a large cluster holds the CPU and about 16 MB for up to seconds, so in the server's own threads a
burst of them starved every other client. Their results are cached by what changes the search (not the name
or the step count), bounded in bytes; each tenant has a limit on concurrent searches and a rate limit (429
with ``Retry-After``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import multiprocessing
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

from fastapi import FastAPI, Header, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from sqlalchemy.exc import IntegrityError

from frenzy_opt.api.auth import Principal, TenantConfig
from frenzy_opt.api.schemas import STATES, EventOut, JobIn, JobListOut, JobOut, PlanOut, PlansOut
from frenzy_opt.api.ui import mount_docs, ui_router
from frenzy_opt.core.protocols import Executor
from frenzy_opt.core.spec import JobSpec, parse_job
from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.planning.plans import NoFeasiblePlan, search_or_fail
from frenzy_opt.prediction.closedloop import memory_errors
from frenzy_opt.prediction.steptime import StepTimeModel
from frenzy_opt.service.accounting import Held, held, usage
from frenzy_opt.service.orchestrator import Orchestrator, new_job_id
from frenzy_opt.service.store import (
    BUSY_TIMEOUT_S,
    STORE_FAULTS,
    TERMINAL,
    JobRecord,
    Store,
    describe_fault,
    is_store_fault,
)

log = logging.getLogger(__name__)

API_VERSION = "v1"
# Module level: handler annotations are strings (``from __future__ import annotations``) that FastAPI resolves
# in this module's namespace.
Auth = Annotated[str | None, Header(description="`Bearer <token>`; not needed in local mode")]
JobIdPath = Annotated[str, PathParam(max_length=64)]
IdempotencyKey = Annotated[str | None, Header(max_length=200)]
Limit = Annotated[int, Query(ge=1, le=500)]
Since = Annotated[float, Query(ge=0, le=1e11, description="seconds since the epoch")]
Offset = Annotated[int, Query(ge=0, le=1_000_000_000)]
Top = Annotated[int, Query(ge=1, le=100)]
MAX_BODY_BYTES = 1 << 20
RETRY_AFTER_S = 5
"""What a 503 asks the client to wait: the orchestrator's write back-off tops out at 5 s."""
STORE_THREADS = 2
"""Threads that run a submission's store calls. Few on purpose: a submission waits for its decision on the
event loop, not in a thread, and every Python thread that wants the interpreter lock at once lengthens the
others' waits by its switch interval (5 ms, sys.getswitchinterval), which under concurrency delayed the
event loop by seconds."""
CANCEL_WAIT_S = 10.0
"""How long a cancel request waits for the scheduler to carry it out."""
MAX_TOP_PLANS = 100
"""The most plans the dry run lists (``top``'s bound): what its cache keeps per search."""


@dataclass
class ServiceConfig:
    cluster: ClusterSpec
    db_url: str
    executor: Executor
    tenants: TenantConfig = field(default_factory=TenantConfig)
    time_scale: float = 1.0
    decision_wait_s: float = 0.25
    """How long a submission waits for the scheduler's first decision on it before answering."""
    max_body_bytes: int = MAX_BODY_BYTES
    calibration: str | None = None
    """A step-time calibration profile (:mod:`frenzy_opt.prediction.calibrations`): plans use it, the closed loop
    writes into it."""
    busy_timeout_s: float = BUSY_TIMEOUT_S
    """How long a store write waits for another connection's lock (:data:`frenzy_opt.service.store.BUSY_TIMEOUT_S`)."""
    plan_workers: int = 1
    """Worker processes for the dry run's plan searches."""
    plan_cache_bytes: int = 64 << 20
    """Bound of the dry run's result cache (JSON bytes of the results kept)."""
    plan_searches_per_tenant: int = 2
    """Plan searches one tenant may have running at once; more get 429."""
    plans_per_minute: float = 60.0
    """Dry runs one tenant may request per minute (a token bucket of ``plans_burst``); more get 429."""
    plans_burst: int = 20


class Metrics:
    """Prometheus metrics of one service (its own registries, so several apps can live in one process).
    Per-tenant series live in a registry of their own, shown only to an admin when tokens are configured
    (tenant names and their activity are not public)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.tenant_registry = CollectorRegistry()
        self.queue = Gauge("frenzy_queue_length", "Jobs waiting in the scheduler's queue", registry=self.registry)
        self.gpus_used = Gauge("frenzy_gpus_used", "GPUs held by running jobs", ["gpu_type"], registry=self.registry)
        self.gpus_total = Gauge("frenzy_gpus_total", "GPUs in the cluster", ["gpu_type"], registry=self.registry)
        self.decisions = Counter("frenzy_decisions", "Scheduling decisions made", registry=self.registry)
        self.decision_seconds = Histogram(
            "frenzy_decision_seconds",
            "Wall time of one greedy HAS decision",
            buckets=(1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0),
            registry=self.registry,
        )
        self.submitted = Counter("frenzy_jobs_submitted", "Jobs accepted", ["tenant"], registry=self.tenant_registry)
        self.rejected = Counter("frenzy_jobs_rejected", "Submissions refused (422)", registry=self.registry)
        self.unavailable = Counter(
            "frenzy_store_unavailable", "Requests answered 503: the store could not write", registry=self.registry
        )
        self.throttled = Counter("frenzy_plans_throttled", "Dry runs answered 429", registry=self.registry)

    def on_decision(self, seconds: float, queued: int) -> None:
        self.decisions.inc()
        self.decision_seconds.observe(seconds)
        self.queue.set(queued)


class BodyLimit:
    """ASGI middleware: refuse bodies over ``limit`` bytes with 413, whether or not Content-Length says so."""

    def __init__(self, app: Callable[..., Awaitable[None]], limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._refuse(send)
            return
        if declared is not None:  # the server stops reading at the declared length
            await self.app(scope, receive, send)
            return
        # A chunked body: read it all (at most the limit) before the application sees it, so that one over
        # the limit is a 413 here rather than a body-parsing 400 inside the framework.
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.limit:
                await self._refuse(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Callable[[MutableMapping[str, Any]], Awaitable[None]]) -> None:
        body = json.dumps({"detail": f"request body over {self.limit} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


class TokenBucket:
    """A rate limit: ``rate`` per second with bursts of ``burst`` (the token bucket of RFC 2697's meters)."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.at = time.monotonic()

    def take(self) -> float:
        """0 if a token was taken, else the seconds until one is there."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate if self.rate > 0 else math.inf


def plan_summary(spec: JobSpec, cluster: ClusterSpec, step_model: StepTimeModel) -> dict[str, Any]:
    """The dry run's answer for one training step (worker process): plan count, fewest GPUs per type and the
    first :data:`MAX_TOP_PLANS` plans, fastest first. Raises :class:`NoFeasiblePlan`."""
    search = search_or_fail(spec, cluster, step_model=step_model)
    min_gpus: dict[str, int] = {}
    for plan in search.plans:
        min_gpus[plan.gpu_type] = min(min_gpus.get(plan.gpu_type, plan.num_gpus), plan.num_gpus)
    plans = [
        {
            "gpu_type": p.gpu_type,
            "num_gpus": p.num_gpus,
            "parallel": p.parallel.to_dict(),
            "micro_batch_size": p.micro_batch_size,
            "precision": p.precision,
            "peak_allocated_bytes": p.peak_allocated_bytes,
            "device_used_bytes": p.device_used_bytes,
            "step_time_s": p.step_time_s,
            "step_time_p10_s": p.step_time_p10_s,
            "step_time_p90_s": p.step_time_p90_s,
            "est_runtime_s": p.est_runtime_s,
            "memory_risk": p.memory_risk,
        }
        for p in search.plans[:MAX_TOP_PLANS]
    ]
    return {"num_plans": len(search.plans), "min_gpus_per_type": min_gpus, "plans": plans}


class Throttled(Exception):
    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PlanSearches:
    """The dry run's plan searches (module docstring): a worker pool, an LRU cache bounded in bytes keyed by
    the one-step spec, in-flight searches shared, per-tenant concurrency and rate limits."""

    def __init__(self, config: ServiceConfig, step_model: StepTimeModel) -> None:
        self.config, self.step_model = config, step_model
        self._pool: ProcessPoolExecutor | None = None
        self._cache: OrderedDict[JobSpec, tuple[dict[str, Any] | NoFeasiblePlan, int]] = OrderedDict()
        self.cache_bytes = 0
        self._running: dict[JobSpec, Future[dict[str, Any]]] = {}
        self._per_tenant: dict[str, int] = {}
        self._buckets: dict[str, TokenBucket] = {}
        self._lock = threading.RLock()  # a done callback may run at once, in the thread that holds it
        self.searches = 0
        """Searches run (cache misses), for tests and metrics."""

    @staticmethod
    def key(spec: JobSpec) -> JobSpec:
        """What changes the search: the spec without its name, step count and scheduling fields."""
        return replace(
            spec, name="", training=replace(spec.training, train_steps=1), scheduling=type(spec.scheduling)()
        )

    def __len__(self) -> int:
        """Results cached."""
        return len(self._cache)

    def admit(self, tenant: str) -> None:
        """Charge a dry run to the tenant's rate limit; :class:`Throttled` when it is spent."""
        with self._lock:
            bucket = self._buckets.setdefault(
                tenant, TokenBucket(self.config.plans_per_minute / 60.0, self.config.plans_burst)
            )
            wait = bucket.take()
        if wait > 0:
            raise Throttled(
                f"tenant {tenant!r} is over its rate of {self.config.plans_per_minute:g} plan requests per minute",
                wait,
            )

    async def summary(self, spec: JobSpec, tenant: str) -> dict[str, Any]:
        """The one-step summary of ``spec`` (cached, or searched in the pool); raises
        :class:`NoFeasiblePlan` or :class:`Throttled`."""
        key = self.key(spec)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                future = None
            else:
                future = self._running.get(key) or self._start(key, tenant)
        if future is None:
            assert cached is not None
            result = cached[0]
        else:
            try:
                result = await asyncio.wrap_future(future)
            except NoFeasiblePlan as err:
                result = err
        if isinstance(result, NoFeasiblePlan):
            raise result
        return result

    def _start(self, key: JobSpec, tenant: str) -> Future[dict[str, Any]]:
        """A new search charged to the tenant's concurrency (under ``_lock``)."""
        limit = self.config.plan_searches_per_tenant
        if self._per_tenant.get(tenant, 0) >= limit:
            raise Throttled(f"tenant {tenant!r} already has {limit} plan searches running", 1.0)
        self._per_tenant[tenant] = self._per_tenant.get(tenant, 0) + 1
        future = self._submit(key)
        self._running[key] = future

        def done(finished: Future[dict[str, Any]]) -> None:
            self._done(key, tenant, finished)

        future.add_done_callback(done)
        return future

    def _submit(self, key: JobSpec) -> Future[dict[str, Any]]:
        if self._pool is None:
            # spawn: a forked child of a threaded server can inherit a held lock
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(max_workers=self.config.plan_workers, mp_context=context)
        self.searches += 1
        return self._pool.submit(plan_summary, key, self.config.cluster, self.step_model)

    def _done(self, key: JobSpec, tenant: str, future: Future[dict[str, Any]]) -> None:
        with self._lock:
            self._running.pop(key, None)
            self._per_tenant[tenant] -= 1
            if future.cancelled():
                return
            error = future.exception()
            if error is not None and not isinstance(error, NoFeasiblePlan):
                return  # not cached: a crashed worker is retried by the next request
            value: dict[str, Any] | NoFeasiblePlan = error if isinstance(error, NoFeasiblePlan) else future.result()
            size = len(str(value)) if isinstance(value, NoFeasiblePlan) else len(json.dumps(value))
            self._cache[key] = (value, size)
            self.cache_bytes += size
            while self.cache_bytes > self.config.plan_cache_bytes and len(self._cache) > 1:
                _, (_, dropped) = self._cache.popitem(last=False)
                self.cache_bytes -= dropped

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


class _Decided:
    """Set from the orchestrator's thread once a decision considered the job; awaited on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()

    def set(self) -> None:
        self.loop.call_soon_threadsafe(self._done)

    def _done(self) -> None:
        if not self.future.done():
            self.future.set_result(None)


def _unavailable(reason: str) -> HTTPException:
    return HTTPException(
        503,
        f"the job store cannot serve now ({reason}); retry later",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def _job_out(
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
        reason=reason if reason is not None and record.state == "queued" else record.reason,
        attempts=record.attempts,
        max_retries=record.max_retries,
        created_at=record.created_at,
        updated_at=record.updated_at,
        plan=record.plan,
        placement=record.placement,
        predicted=record.predicted,
        measured=record.measured,
        progress=progress if record.state == "running" else None,
        history=history,
    )


def _unprocessable(message: str, field_path: tuple[str, ...] = ("body",)) -> HTTPException:
    return HTTPException(status_code=422, detail=[{"loc": list(field_path), "msg": message, "type": "value_error"}])


def create_app(config: ServiceConfig) -> FastAPI:
    """The FastAPI application of one service: its store, orchestrator and metrics start with it."""
    store = Store(config.db_url, busy_timeout_s=config.busy_timeout_s)
    metrics = Metrics()
    orchestrator = Orchestrator(
        store,
        config.cluster,
        config.executor,
        time_scale=config.time_scale,
        quotas=config.tenants.quotas,
        on_decision=metrics.on_decision,
        calibration=config.calibration,
    )
    for gpu in config.cluster.gpu_types():
        metrics.gpus_total.labels(gpu.name).set(config.cluster.num_gpus_of(gpu.name))
    feasibility_lock = threading.Lock()
    searches = PlanSearches(config, orchestrator.base_model)
    store_calls = ThreadPoolExecutor(max_workers=STORE_THREADS, thread_name_prefix="frenzy-store")
    # (threads start on first use; one pool for the app's life, also when it is called without its lifespan)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        orchestrator.start()
        try:
            yield
        finally:
            orchestrator.stop()
            searches.close()
            store.close()

    app = FastAPI(
        title="frenzy-opt",
        version="0.1.0",
        description="Serverless scheduling of LLM training jobs on heterogeneous GPU clusters: submit a job with "
        "no hardware named; MARP predicts its memory per parallel plan, the greedy HAS places it.",
        lifespan=lifespan,
        docs_url=None,  # served from local assets by mount_docs: nothing from a CDN
        redoc_url=None,
    )
    mount_docs(app)
    app.include_router(ui_router())
    app.state.store, app.state.orchestrator, app.state.metrics = store, orchestrator, metrics
    app.state.searches = searches

    def writable() -> None:
        """503 unless the store takes writes (module docstring)."""
        reason = orchestrator.store_fault or store.file_problem()  # a query per request would cost 0.3 ms
        if reason is not None:
            metrics.unavailable.inc()
            raise _unavailable(reason)

    def principal_of(authorization: str | None) -> Principal:
        principal = config.tenants.authenticate(authorization)
        if principal is None:
            raise HTTPException(401, "missing or unknown bearer token", headers={"WWW-Authenticate": "Bearer"})
        return principal

    def visible(record: JobRecord | None, who: Principal) -> JobRecord:
        if record is None or (not who.admin and record.tenant != who.tenant):
            raise HTTPException(404, "no such job")  # another tenant's job does not exist for you
        return record

    def parse_spec(body: JobIn) -> tuple[JobSpec, dict[str, Any]]:
        mapping = body.spec_mapping()
        try:
            return parse_job(mapping), mapping
        except ValueError as err:
            raise _unprocessable(str(err)) from None

    def check_feasible(spec: JobSpec) -> None:
        with feasibility_lock:
            if orchestrator.cache.per_step(spec):
                return
        try:
            search_or_fail(spec, config.cluster)
        except NoFeasiblePlan as err:
            raise _unprocessable(str(err)) from None
        raise _unprocessable(
            f"job {spec.name}: memory-feasible plans exist but none the placement rules of {config.cluster.name} "
            "admit (inside one node, or whole nodes)"
        )

    @app.post(
        f"/{API_VERSION}/jobs",
        status_code=202,
        response_model=JobOut,
        responses={
            400: {"description": "the body is not JSON"},
            401: {},
            409: {"description": "the Idempotency-Key was used for a different job"},
            413: {},
            422: {"description": "invalid spec, or no GPU type can hold the job"},
            503: {"description": "the job store cannot serve now; see Retry-After"},
        },
    )
    async def submit(
        body: JobIn,
        authorization: Auth = None,
        idempotency_key: IdempotencyKey = None,
    ) -> JobOut:
        """Submit a job (contract 1). Answers 202 with its id, state and the plan chosen, or the reason it
        waits. Re-posting with the same `Idempotency-Key` returns the same job."""
        who = principal_of(authorization)
        spec, mapping = parse_spec(body)
        writable()
        request_hash = hashlib.sha256(
            json.dumps([mapping, body.weight, body.max_retries], sort_keys=True).encode()
        ).hexdigest()
        loop = asyncio.get_running_loop()
        if idempotency_key is not None:
            existing = await loop.run_in_executor(store_calls, store.by_key, who.tenant, idempotency_key)
            if existing is not None:
                return _replay(existing, request_hash)
        # In the server's pool, not a store thread: a spec not seen before costs a plan search (up to seconds).
        await loop.run_in_executor(None, feasible, spec)
        accepted = await loop.run_in_executor(
            store_calls, accept, who, spec, mapping, body, request_hash, idempotency_key
        )
        if isinstance(accepted, JobOut):
            return accepted  # the same key, posted concurrently
        metrics.submitted.labels(who.tenant).inc()
        decided = _Decided(loop)
        orchestrator.submit(accepted, decided)
        with contextlib.suppress(TimeoutError):  # past the wait: answered with the reason it waits so far
            await asyncio.wait_for(decided.future, config.decision_wait_s)
        current = await loop.run_in_executor(store_calls, store.get, accepted.id)
        return _job_out(current or accepted, orchestrator.reason(accepted.id))

    def feasible(spec: JobSpec) -> None:
        """422 (counted as rejected) unless some GPU type of the cluster can hold the job."""
        try:
            check_feasible(spec)
        except HTTPException:
            metrics.rejected.inc()
            raise

    def accept(
        who: Principal,
        spec: JobSpec,
        mapping: dict[str, Any],
        body: JobIn,
        request_hash: str,
        idempotency_key: str | None,
    ) -> JobRecord | JobOut:
        """The store's part of a submission (a store thread): the new job, or the one the same key made
        concurrently."""
        try:
            return store.add_job(
                job_id=new_job_id(),
                tenant=who.tenant,
                name=spec.name,
                spec=mapping,
                request_hash=request_hash,
                idempotency_key=idempotency_key,
                max_retries=body.max_retries,
                weight=body.weight,
                predicted=None,
            )
        except IntegrityError:  # the same key posted concurrently: the first one won
            existing = store.by_key(who.tenant, idempotency_key or "")
            if existing is None:
                raise
            return _replay(existing, request_hash)

    def _replay(existing: JobRecord, request_hash: str) -> JobOut:
        if existing.request_hash != request_hash:
            raise HTTPException(409, "Idempotency-Key already used for a different job")
        return _job_out(existing, orchestrator.reason(existing.id))

    @app.get(f"/{API_VERSION}/jobs", response_model=JobListOut, responses={401: {}})
    def list_jobs(
        authorization: Auth = None,
        state: STATES | None = None,
        limit: Limit = 50,
        offset: Offset = 0,
    ) -> JobListOut:
        """Your jobs (an admin: everyone's) in submission order, optionally of one state, a page at a time."""
        who = principal_of(authorization)
        records, total = store.list_jobs(
            tenant=None if who.admin else who.tenant, state=state, limit=limit, offset=offset
        )
        items = [_job_out(r, orchestrator.reason(r.id)) for r in records]
        following = offset + len(items)
        return JobListOut(
            items=items, total=total, limit=limit, offset=offset, next_offset=following if following < total else None
        )

    @app.get(f"/{API_VERSION}/jobs/{{job_id}}", response_model=JobOut, responses={401: {}, 404: {}})
    def get_job(job_id: JobIdPath, authorization: Auth = None) -> JobOut:
        """One job with its state history, plan, placement, and predicted vs measured memory and step time."""
        who = principal_of(authorization)
        record = visible(store.get(job_id), who)
        history = [EventOut(at=e.at, state=e.state, detail=e.detail) for e in store.events(job_id)]
        return _job_out(record, orchestrator.reason(job_id), history, orchestrator.progress.get(job_id))

    @app.post(
        f"/{API_VERSION}/jobs/{{job_id}}/cancel",
        response_model=JobOut,
        responses={401: {}, 404: {}, 409: {"description": "the job already ended"}, 503: {}},
    )
    def cancel_job(job_id: JobIdPath, authorization: Auth = None) -> JobOut:
        """Cancel a queued or running job; its GPUs are released."""
        who = principal_of(authorization)
        record = visible(store.get(job_id), who)
        if record.state in TERMINAL:
            raise HTTPException(409, f"job already {record.state}")
        writable()
        done = orchestrator.cancel(job_id)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while True:
            try:
                done.result(timeout=0.05)
                break
            except FutureTimeout:
                # The loop waits for the store: the cancel is queued and happens once the store writes.
                if orchestrator.store_fault is not None or time.monotonic() > deadline:
                    reason = orchestrator.store_fault or f"the scheduler did not answer within {CANCEL_WAIT_S:g} s"
                    raise _unavailable(reason) from None
        return _job_out(visible(store.get(job_id), who), orchestrator.reason(job_id))

    @app.post(
        f"/{API_VERSION}/plans",
        response_model=PlansOut,
        responses={401: {}, 422: {}, 429: {"description": "over the tenant's plan-search limits; see Retry-After"}},
    )
    async def plans(body: JobIn, authorization: Auth = None, top: Top = 10) -> PlansOut:
        """A dry run: the memory-feasible plans of a job on this cluster, fastest first. Nothing is stored."""
        who = principal_of(authorization)
        spec, _ = parse_spec(body)
        try:
            searches.admit(who.tenant)
            summary = await searches.summary(spec, who.tenant)
        except Throttled as err:
            metrics.throttled.inc()
            retry = max(1, math.ceil(err.retry_after_s))
            raise HTTPException(429, str(err), headers={"Retry-After": str(retry)}) from None
        except NoFeasiblePlan as err:
            raise _unprocessable(str(err)) from None
        steps = spec.training.train_steps
        return PlansOut(
            cluster=config.cluster.name,
            num_plans=summary["num_plans"],
            min_gpus_per_type=summary["min_gpus_per_type"],
            plans=[
                PlanOut(
                    **{
                        **p,
                        "est_runtime_s": None if p["step_time_s"] is None else p["step_time_s"] * steps,
                    }
                )
                for p in summary["plans"][:top]
            ],
        )

    @app.get(f"/{API_VERSION}/cluster", responses={401: {}})
    def cluster(authorization: Auth = None) -> dict[str, Any]:
        """GPUs per type and node, free and used, and the running jobs (yours; an admin: all)."""
        who = principal_of(authorization)
        view = orchestrator.view()
        if not who.admin:
            view["running"] = [r for r in view["running"] if r["tenant"] == who.tenant]
        return view

    def stretches(since: float, who: Principal) -> list[Held]:
        history = store.history_since(since, None if who.admin else who.tenant)
        return [h for record, events in history for h in held(record, events)]

    @app.get(f"/{API_VERSION}/usage", responses={401: {}})
    def usage_of(authorization: Auth = None, since: Since = 0.0) -> dict[str, Any]:
        """GPU-hours per tenant and GPU type since ``since`` (seconds since the epoch) from the job history:
        yours (an admin: everyone's)."""
        who = principal_of(authorization)
        now = time.time()
        return {"since": since, "until": now, "rows": usage(stretches(since, who), since, now)}

    @app.get(f"/{API_VERSION}/timeline", responses={401: {}})
    def timeline(authorization: Auth = None, since: Since = 0.0) -> dict[str, Any]:
        """When each job held which GPUs since ``since`` (seconds since the epoch; ``end`` null while it
        runs), and the GPUs per type: the dashboard's occupancy chart and Gantt."""
        who = principal_of(authorization)
        view = orchestrator.view()
        return {
            "now": time.time(),
            "gpus_per_type": {t: c["gpus"] for t, c in view["gpu_types"].items()},
            "intervals": [h.to_dict() for h in stretches(since, who) if h.end is None or h.end >= since],
        }

    @app.get(f"/{API_VERSION}/calibration", responses={401: {}})
    def calibration(authorization: Auth = None) -> dict[str, Any]:
        """The closed loop: step-time efficiencies refitted from measured runs (per GPU@precision, with the
        prediction error before and after) and measured vs predicted peak memory of recent runs."""
        principal_of(authorization)
        with orchestrator._lock:
            samples = list(orchestrator.samples)
            report = dict(orchestrator.calibration_report)
        return {
            "efficiency": dict(orchestrator.step_model.efficiency),
            "report": report,
            "memory": memory_errors(samples)[-50:],
            "samples": len(samples),
        }

    @app.get("/healthz", responses={503: {"description": "the store or the scheduler cannot serve; see detail"}})
    def healthz() -> dict[str, Any]:
        """Health: the store answers and takes writes (its file is still the one opened), and the
        orchestrator's loop is alive."""
        reason = store.health() or (None if orchestrator.alive() else "the orchestrator loop is not running")
        reason = reason or orchestrator.store_fault
        if reason is not None:
            raise HTTPException(503, reason, headers={"Retry-After": str(RETRY_AFTER_S)})
        return {"status": "ok", "executor": config.executor.name, "cluster": config.cluster.name, "time": time.time()}

    @app.get("/metrics", response_class=PlainTextResponse)
    def prometheus(authorization: Auth = None) -> PlainTextResponse:
        """Prometheus text format: queue length, GPUs used per type, decisions, decision latency; the
        per-tenant series only for an admin token when tokens are configured."""
        view = orchestrator.view()
        for gpu_type, counts in view["gpu_types"].items():
            metrics.gpus_used.labels(gpu_type).set(counts["used"])
        metrics.queue.set(view["queued"])
        text = generate_latest(metrics.registry)
        who = config.tenants.authenticate(authorization)
        if who is not None and who.admin:
            text += generate_latest(metrics.tenant_registry)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        # Only where and what: the offending input is left out (a NaN in it made the answer itself invalid
        # JSON, and it need not be echoed back).
        detail = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in err.errors()]
        return JSONResponse(status_code=422, content={"detail": detail})

    @app.exception_handler(ValueError)
    async def value_error(_: Request, err: ValueError) -> JSONResponse:  # a bad value that slipped past the schema
        return JSONResponse(status_code=422, content={"detail": [{"loc": ["body"], "msg": str(err)}]})

    async def store_fault(_: Request, err: Exception) -> JSONResponse:
        if not is_store_fault(err):
            log.exception("request failed", exc_info=err)
            return JSONResponse(status_code=500, content={"detail": f"internal error: {err.__class__.__name__}"})
        metrics.unavailable.inc()
        refusal = _unavailable(describe_fault(err))
        return JSONResponse(
            status_code=refusal.status_code, content={"detail": refusal.detail}, headers=refusal.headers
        )

    for fault in STORE_FAULTS:
        app.add_exception_handler(fault, store_fault)

    app.add_middleware(BodyLimit, limit=config.max_body_bytes)  # type: ignore[arg-type]
    return app
