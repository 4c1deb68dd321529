"""``frenzy serve --workers N``: N API worker processes in front of one scheduler (issue 27).

One interpreter acknowledges a few hundred submissions a second; past that the acknowledgement path is
CPU-bound. With ``--workers N`` (N >= 2):

- the **scheduler process** (the one started) takes the store's writer lock, recovers, and runs the
  orchestrator with its intake (:mod:`frenzy_opt.service.intake`): it reads the job rows the workers commit.
  It serves the whole API on a private port on 127.0.0.1 (:func:`run_scheduler`);
- **N worker processes** (uvicorn's supervisor, spawned) share the public port. A worker answers ``POST
  /v1/jobs`` itself: validation, the plan-feasibility check (its own option cache, new shapes searched in its
  own plan-search process under the tenant's limits), the group-committed insert, then 202 with the job
  queued. The store is the only channel for submissions: a worker never tells the scheduler anything, it
  writes the row; the scheduler is the only writer of state changes (the single-writer rules of
  :mod:`frenzy_opt.service.writer` hold: workers do not take the writer lock, insert rows only, and never
  update one). Every other request (reads, cancels, dry runs, a submission with ``?wait``, health, metrics,
  the dashboard) is forwarded to the scheduler process, which knows the queue and the ledger.

A worker exits once the process that started it is gone (a ``kill -9`` of the scheduler takes its workers
with it within :data:`ORPHAN_CHECK_S`): no worker acknowledges jobs for a scheduler that no longer runs.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.process
import os
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from frenzy_opt.api.auth import load_tenants
from frenzy_opt.api.httplimits import HttpLimits, uvicorn_options
from frenzy_opt.api.metrics import Metrics
from frenzy_opt.api.middleware import BodyLimit
from frenzy_opt.api.plansearch import PlanSearches
from frenzy_opt.api.routes import jobs
from frenzy_opt.api.schemas import JobIn
from frenzy_opt.api.service import Service
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.launch.executors import make_executor
from frenzy_opt.planning.problem import OptionCache, Searched
from frenzy_opt.planning.scenario import load_cluster_ref
from frenzy_opt.service.faults import STORE_FAULTS, describe_fault
from frenzy_opt.service.store import Store

log = logging.getLogger(__name__)

MAX_WORKERS = 64
"""The most ``--workers`` (a design choice: far more processes than the CPUs of one machine only add memory)."""
ORPHAN_CHECK_S = 0.5
"""How often a worker checks that the process that started it still runs (a design choice: a worker orphaned
by a kill -9 of the scheduler stops acknowledging within half a second)."""
FORWARD_TIMEOUT_S = 120.0
"""How long a forwarded request may take (a design choice: longer than any wait a request may ask for, 60 s)."""
MAX_KEY_CHARS = 200
"""The longest ``Idempotency-Key`` (the bound of the scheduler's route: ``IdempotencyKey`` in
:mod:`frenzy_opt.api.routes.jobs`)."""
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "content-length", "host"}
"""Hop-by-hop headers (RFC 9110, section 7.6.1) and the ones httpx sets itself: not forwarded."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSettings:
    db_url: str
    cluster: str
    """A cluster file or shipped name (as ``--cluster``)."""
    executor: str
    tokens: str | None
    scheduler_url: str
    parent_pid: int


class WorkerScheduler:
    """What a worker's submission route needs of a scheduler: an option cache for the feasibility check, the
    store's faults, and a :meth:`submit` that only keeps the worker's cache warm (the row is the message)."""

    def __init__(self, store: Store, cache: OptionCache) -> None:
        self.store, self.cache = store, cache
        self.stepped_down: str | None = None

    @property
    def store_fault(self) -> str | None:
        return self.store.broken or self.store.fault

    def submit(self, record: object, decided: object, spec: Any, *, searched: Searched | None = None) -> None:
        if searched is not None:
            self.cache.adopt(spec, searched)

    def reason(self, job_id: str) -> str | None:
        return None


def run_workers(settings: WorkerSettings, num_workers: int, host: str, port: int, limits: HttpLimits) -> None:
    """Serve ``host:port`` with ``num_workers`` worker processes (spawned; each a uvicorn server with the HTTP
    ``limits`` on the one listening socket) until SIGTERM or SIGINT; a worker that dies is started again."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.set_inheritable(True)
    context = multiprocessing.get_context("spawn")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())

    def start() -> multiprocessing.process.BaseProcess:
        process = context.Process(target=_worker_main, args=(settings, listener, limits), name="frenzy-worker")
        process.start()
        return process

    processes = [start() for _ in range(num_workers)]
    log.info("frenzy serve: %d API workers on http://%s:%d", num_workers, host, port)
    while not stop.wait(ORPHAN_CHECK_S):
        for i, process in enumerate(processes):
            if not process.is_alive():
                log.error("worker %d exited (%s); starting another", process.pid, process.exitcode)
                processes[i] = start()
    for process in processes:
        process.terminate()  # SIGTERM: uvicorn finishes the requests under way
    for process in processes:
        process.join(30)
    listener.close()


def _worker_main(settings: WorkerSettings, listener: socket.socket, limits: HttpLimits) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_worker_app(settings)
    config = uvicorn.Config(app, log_level="warning", **uvicorn_options(limits))
    uvicorn.Server(config).run(sockets=[listener])


def create_worker_app(settings: WorkerSettings) -> FastAPI:
    """The ASGI app of one worker process (module docstring)."""
    _exit_when_orphaned(settings.parent_pid)
    from frenzy_opt.api.app import ServiceConfig

    cluster = load_cluster_ref(settings.cluster)
    executor = make_executor(settings.executor)
    config = ServiceConfig(
        cluster=cluster,
        db_url=settings.db_url,
        executor=executor,
        tenants=load_tenants(settings.tokens, [g.name for g in cluster.gpu_types()]),
        create_store=False,
    )
    store = Store(settings.db_url, create=False)
    cache = OptionCache(cluster, Topology(cluster), plan_filter=lambda plan, spec: executor.supports(plan, spec.model))
    scheduler = WorkerScheduler(store, cache)
    service = Service(config, store, scheduler, Metrics(), PlanSearches(config, cache.step_model))  # type: ignore[arg-type]
    forward = httpx.AsyncClient(base_url=settings.scheduler_url, timeout=FORWARD_TIMEOUT_S)
    app = FastAPI(title="frenzy-opt worker", openapi_url=None, docs_url=None, redoc_url=None)
    app.state.service = service

    @app.post("/v1/jobs", status_code=202)
    async def submit(request: Request) -> Any:
        wait = request.query_params.get("wait")
        if wait not in (None, "0", "0.0"):  # the decision is the scheduler's: it answers, from the row it reads
            return await _forward(forward, request)
        return await _submit_here(request)

    async def _submit_here(request: Request) -> Any:
        who = service.principal_of(request.headers.get("authorization"))
        try:
            body = JobIn.model_validate_json(await request.body())
        except ValidationError as err:  # the answer the scheduler's app gives (its RequestValidationError)
            detail = [{"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in err.errors()]
            return JSONResponse(status_code=422, content={"detail": detail})
        key = request.headers.get("idempotency-key")
        if key is not None and len(key) > MAX_KEY_CHARS:
            detail = [{"loc": ["header", "idempotency-key"], "msg": f"at most {MAX_KEY_CHARS} characters"}]
            return JSONResponse(status_code=422, content={"detail": detail})
        return await jobs.submit(body, service, who, key, 0.0)

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
    async def elsewhere(request: Request) -> Response:
        return await _forward(forward, request)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        detail = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in err.errors()]
        return JSONResponse(status_code=422, content={"detail": detail})

    async def store_fault(_: Request, err: Exception) -> JSONResponse:
        reason = f"the job store cannot serve now ({describe_fault(err)}); retry later"
        return JSONResponse(status_code=503, content={"detail": reason}, headers={"Retry-After": "5"})

    for fault in STORE_FAULTS:
        app.add_exception_handler(fault, store_fault)
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)  # type: ignore[arg-type]
    app.router.on_shutdown.append(lambda: _close(service, store))
    return app


def _close(service: Service, store: Store) -> None:
    service.searches.close()
    store.close()


async def _forward(client: httpx.AsyncClient, request: Request) -> Response:
    """The scheduler process's answer to ``request`` (streamed: a followed log goes on as it is written)."""
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_HEADERS]
    outgoing = client.build_request(
        request.method, request.url.path, params=request.query_params, headers=headers, content=await request.body()
    )
    try:
        answer = await client.send(outgoing, stream=True)
    except httpx.TransportError as err:
        reason = f"the scheduler process does not answer ({err.__class__.__name__}); retry later"
        return JSONResponse(status_code=503, content={"detail": reason}, headers={"Retry-After": "5"})
    kept = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_HEADERS}

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in answer.aiter_raw():
                yield chunk
        finally:
            await answer.aclose()

    return StreamingResponse(body(), status_code=answer.status_code, headers=kept)


def _exit_when_orphaned(parent: int) -> None:
    def watch() -> None:
        while True:
            time.sleep(ORPHAN_CHECK_S)
            if os.getppid() != parent and not _alive(parent):
                log.error("worker: the scheduler process %d is gone; exiting", parent)
                os._exit(3)

    threading.Thread(target=watch, name="frenzy-orphan-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
