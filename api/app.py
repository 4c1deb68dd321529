"""The HTTP service: submit LLM training jobs with no hardware named; frenzy-opt plans, queues, places,
launches and tracks them. Versioned under ``/v1``; OpenAPI at ``/openapi.json`` and ``/docs``.

:func:`create_app` builds one service's parts (:class:`frenzy_opt.api.service.Service`) and includes the
routers of :mod:`frenzy_opt.api.routes`: jobs, the dry run, the cluster and its history, operations; the
dashboard and the offline docs come from :mod:`frenzy_opt.api.ui`.

Faults answer in JSON, never a plain-text 500 or a dropped connection: while the store cannot write (or its
file is gone) every request that needs it gets 503 with ``Retry-After``, and ``/healthz`` says why. The dry
run's plan searches run in a worker process (:mod:`frenzy_opt.api.plansearch`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from frenzy_opt.api.auth import TenantConfig
from frenzy_opt.api.metrics import Metrics
from frenzy_opt.api.middleware import MAX_BODY_BYTES, BodyLimit
from frenzy_opt.api.plansearch import PlanSearches
from frenzy_opt.api.routes import cluster, jobs, ops, plans
from frenzy_opt.api.service import Service, unavailable
from frenzy_opt.api.ui import mount_docs, ui_router
from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.launch.executors import Executor
from frenzy_opt.service.database import BUSY_TIMEOUT_S
from frenzy_opt.service.faults import STORE_FAULTS, describe_fault, is_store_fault
from frenzy_opt.service.orchestrator import Orchestrator
from frenzy_opt.service.store import Store

log = logging.getLogger(__name__)


@dataclass
class ServiceConfig:
    cluster: ClusterSpec
    db_url: str
    executor: Executor
    tenants: TenantConfig = field(default_factory=TenantConfig)
    time_scale: float = 1.0
    decision_wait_s: float = 0.0
    """How long a submission without ``?wait`` waits for the scheduler's first decision on it before answering
    (0: it is answered once stored, the decision follows)."""
    max_body_bytes: int = MAX_BODY_BYTES
    calibration: str | None = None
    """A step-time calibration profile (:mod:`frenzy_opt.prediction.calibrations`): plans use it, the closed loop
    writes into it."""
    create_store: bool = True
    """Create the store when it does not exist; ``frenzy serve`` asks for it with ``--create`` only, so a
    volume that is not mounted is refused rather than replaced by an empty store."""
    busy_timeout_s: float = BUSY_TIMEOUT_S
    """How long a store write waits for another connection's lock
    (:data:`frenzy_opt.service.database.BUSY_TIMEOUT_S`)."""
    plan_workers: int = 1
    """Worker processes for the dry run's plan searches."""
    plan_cache_bytes: int = 64 << 20
    """Bound of the dry run's result cache (JSON bytes of the results kept)."""
    plan_searches_per_tenant: int = 2
    """Plan searches (dry runs and submissions of a new job shape) one tenant may have running at once; more
    get 429."""
    plans_per_minute: float = 60.0
    """Dry runs one tenant may request per minute (a token bucket of ``plans_burst``), and, in a bucket of its
    own, submissions of a job shape the scheduler has not planned yet; more get 429."""
    plans_burst: int = 20
    intake: bool = False
    """Jobs arrive as rows other processes commit (``frenzy serve --workers N``, :mod:`frenzy_opt.api.workers`):
    the orchestrator reads them from the store (:mod:`frenzy_opt.service.intake`)."""


def create_app(config: ServiceConfig) -> FastAPI:
    """The FastAPI application of one service: its store, orchestrator and metrics start with it."""
    store = Store(config.db_url, busy_timeout_s=config.busy_timeout_s, create=config.create_store)
    metrics = Metrics()
    orchestrator = Orchestrator(
        store,
        config.cluster,
        config.executor,
        time_scale=config.time_scale,
        quotas=config.tenants.quotas,
        on_decision=metrics.on_decision,
        calibration=config.calibration,
        intake=config.intake,
    )
    for gpu in config.cluster.gpu_types():
        metrics.gpus_total.labels(gpu.name).set(config.cluster.num_gpus_of(gpu.name))
    service = Service(config, store, orchestrator, metrics, PlanSearches(config, orchestrator.base_model))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        orchestrator.start()
        try:
            yield
        finally:
            orchestrator.stop()
            service.searches.close()
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
    app.state.service = service
    mount_docs(app)
    app.include_router(ui_router())
    for module in (jobs, plans, cluster, ops):
        app.include_router(module.router)
    _add_error_handlers(app, metrics)
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)  # type: ignore[arg-type]
    return app


def _add_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        # Only where and what: the offending input is left out (a NaN in it made the answer itself invalid
        # JSON, and it need not be echoed back).
        detail = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in err.errors()]
        return JSONResponse(status_code=422, content={"detail": detail})

    @app.exception_handler(ValueError)
    async def value_error(_: Request, err: ValueError) -> JSONResponse:  # a bad value that slipped past the schema
        return JSONResponse(status_code=422, content={"detail": [{"loc": ["body"], "msg": str(err)}]})

    async def store_fault(request: Request, err: Exception) -> JSONResponse:
        if not is_store_fault(err):
            log.exception("request failed", exc_info=err)
            return JSONResponse(status_code=500, content={"detail": f"internal error: {err.__class__.__name__}"})
        metrics.unavailable.inc()
        service: Service = request.app.state.service
        permanent = service.permanent()
        reason = service.orchestrator.store_fault if permanent else None
        refusal = unavailable(reason or describe_fault(err), permanent=permanent)
        return JSONResponse(
            status_code=refusal.status_code, content={"detail": refusal.detail}, headers=refusal.headers
        )

    for fault in STORE_FAULTS:
        app.add_exception_handler(fault, store_fault)
