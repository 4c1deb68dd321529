"""The HTTP service: submit LLM training jobs with no hardware named; frenzy-opt plans, queues, places,
launches and tracks them. Versioned under ``/v1``; OpenAPI at ``/openapi.json`` and ``/docs``.

Handlers are plain (threaded) functions that open a database session only inside each store call, so no
request holds a connection while it waits; the orchestrator's loop is the only writer of job state.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import FastAPI, Header, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from sqlalchemy.exc import IntegrityError

from frenzy_opt.api.auth import Principal, TenantConfig
from frenzy_opt.api.schemas import STATES, EventOut, JobIn, JobListOut, JobOut, PlanOut, PlansOut
from frenzy_opt.closedloop import memory_errors
from frenzy_opt.cluster import ClusterSpec
from frenzy_opt.executors import Executor
from frenzy_opt.orchestrator import Orchestrator, new_job_id
from frenzy_opt.plans import NoFeasiblePlan, PlanSearch, search_or_fail
from frenzy_opt.spec import JobSpec, parse_job
from frenzy_opt.store import TERMINAL, JobRecord, Store

API_VERSION = "v1"
# Module level: handler annotations are strings (``from __future__ import annotations``) that FastAPI resolves
# in this module's namespace.
Auth = Annotated[str | None, Header(description="`Bearer <token>`; not needed in local mode")]
JobIdPath = Annotated[str, PathParam(max_length=64)]
IdempotencyKey = Annotated[str | None, Header(max_length=200)]
Limit = Annotated[int, Query(ge=1, le=500)]
Offset = Annotated[int, Query(ge=0, le=1_000_000_000)]
Top = Annotated[int, Query(ge=1, le=100)]
MAX_BODY_BYTES = 1 << 20


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
    """A step-time calibration profile (:mod:`frenzy_opt.calibrations`): plans use it, the closed loop
    writes into it."""


class Metrics:
    """Prometheus metrics of one service (its own registry, so several apps can live in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
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
        self.submitted = Counter("frenzy_jobs_submitted", "Jobs accepted", ["tenant"], registry=self.registry)
        self.rejected = Counter("frenzy_jobs_rejected", "Submissions refused (422)", registry=self.registry)

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
        seen = 0

        async def limited() -> MutableMapping[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._refuse(send)

    async def _refuse(self, send: Callable[[MutableMapping[str, Any]], Awaitable[None]]) -> None:
        body = json.dumps({"detail": f"request body over {self.limit} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass


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
    store = Store(config.db_url)
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

    @functools.lru_cache(maxsize=256)
    def cached_search(spec: JobSpec) -> PlanSearch:
        """Plan searches of the dry-run endpoint, remembered per spec (a search takes 0.1-1 s)."""
        return search_or_fail(spec, config.cluster, step_model=orchestrator.base_model)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        orchestrator.start()
        try:
            yield
        finally:
            orchestrator.stop()
            store.close()

    app = FastAPI(
        title="frenzy-opt",
        version="0.1.0",
        description="Serverless scheduling of LLM training jobs on heterogeneous GPU clusters: submit a job with "
        "no hardware named; MARP predicts its memory per parallel plan, the greedy HAS places it.",
        lifespan=lifespan,
    )
    app.state.store, app.state.orchestrator, app.state.metrics = store, orchestrator, metrics

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
        responses={401: {}, 413: {}, 422: {"description": "invalid spec, or no GPU type can hold the job"}},
    )
    def submit(
        body: JobIn,
        authorization: Auth = None,
        idempotency_key: IdempotencyKey = None,
    ) -> JobOut:
        """Submit a job (contract 1). Answers 202 with its id, state and the plan chosen, or the reason it
        waits. Re-posting with the same `Idempotency-Key` returns the same job."""
        who = principal_of(authorization)
        spec, mapping = parse_spec(body)
        request_hash = hashlib.sha256(
            json.dumps([mapping, body.weight, body.max_retries], sort_keys=True).encode()
        ).hexdigest()
        if idempotency_key is not None:
            existing = store.by_key(who.tenant, idempotency_key)
            if existing is not None:
                return _replay(existing, request_hash)
        try:
            check_feasible(spec)
        except HTTPException:
            metrics.rejected.inc()
            raise
        try:
            record = store.add_job(
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
        metrics.submitted.labels(who.tenant).inc()
        orchestrator.submit(record).wait(config.decision_wait_s)
        current = store.get(record.id) or record
        return _job_out(current, orchestrator.reason(record.id))

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

    @app.post(f"/{API_VERSION}/jobs/{{job_id}}/cancel", response_model=JobOut, responses={401: {}, 404: {}, 409: {}})
    def cancel_job(job_id: JobIdPath, authorization: Auth = None) -> JobOut:
        """Cancel a queued or running job; its GPUs are released."""
        who = principal_of(authorization)
        record = visible(store.get(job_id), who)
        if record.state in TERMINAL:
            raise HTTPException(409, f"job already {record.state}")
        orchestrator.cancel(job_id).result(timeout=10)
        return _job_out(visible(store.get(job_id), who), orchestrator.reason(job_id))

    @app.post(f"/{API_VERSION}/plans", response_model=PlansOut, responses={401: {}, 422: {}})
    def plans(body: JobIn, authorization: Auth = None, top: Top = 10) -> PlansOut:
        """A dry run: the memory-feasible plans of a job on this cluster, fastest first. Nothing is stored."""
        principal_of(authorization)
        spec, _ = parse_spec(body)
        try:
            search = cached_search(spec)
        except NoFeasiblePlan as err:
            raise _unprocessable(str(err)) from None
        with feasibility_lock:
            orchestrator.cache.per_step(spec)  # the scheduler's options too: a later submission finds them ready
        min_gpus: dict[str, int] = {}
        for plan in search.plans:
            min_gpus[plan.gpu_type] = min(min_gpus.get(plan.gpu_type, plan.num_gpus), plan.num_gpus)
        return PlansOut(
            cluster=config.cluster.name,
            num_plans=len(search.plans),
            min_gpus_per_type=min_gpus,
            plans=[
                PlanOut(
                    gpu_type=p.gpu_type,
                    num_gpus=p.num_gpus,
                    parallel=p.parallel.to_dict(),
                    micro_batch_size=p.micro_batch_size,
                    precision=p.precision,
                    peak_allocated_bytes=p.peak_allocated_bytes,
                    device_used_bytes=p.device_used_bytes,
                    step_time_s=p.step_time_s,
                    step_time_p10_s=p.step_time_p10_s,
                    step_time_p90_s=p.step_time_p90_s,
                    est_runtime_s=p.est_runtime_s,
                    memory_risk=p.memory_risk,
                )
                for p in search.plans[:top]
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

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        """Liveness: the store answers and the orchestrator's loop is alive."""
        store.ping()
        alive = orchestrator._thread is not None and orchestrator._thread.is_alive()
        if not alive:
            raise HTTPException(503, "orchestrator loop is not running")
        return {"status": "ok", "executor": config.executor.name, "cluster": config.cluster.name, "time": time.time()}

    @app.get("/metrics", response_class=PlainTextResponse)
    def prometheus() -> PlainTextResponse:
        """Prometheus text format: queue length, GPUs used per type, decisions, decision latency."""
        view = orchestrator.view()
        for gpu_type, counts in view["gpu_types"].items():
            metrics.gpus_used.labels(gpu_type).set(counts["used"])
        metrics.queue.set(view["queued"])
        return PlainTextResponse(generate_latest(metrics.registry), media_type="text/plain; version=0.0.4")

    @app.exception_handler(ValueError)
    async def value_error(_: Request, err: ValueError) -> JSONResponse:  # a bad value that slipped past the schema
        return JSONResponse(status_code=422, content={"detail": [{"loc": ["body"], "msg": str(err)}]})

    app.add_middleware(BodyLimit, limit=config.max_body_bytes)  # type: ignore[arg-type]
    return app
