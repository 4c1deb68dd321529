"""Operations: ``/healthz`` and ``/metrics`` (Prometheus)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi.responses import PlainTextResponse
from prometheus_client import generate_latest

from frenzy_opt.api.service import RETRY_AFTER_S, Auth, Svc

router = APIRouter(tags=["operations"])


@router.get("/healthz", responses={503: {"description": "the store or the scheduler cannot serve; see detail"}})
def healthz(service: Svc) -> dict[str, Any]:
    """Health: the store answers and takes writes (its file is still the one opened, no store call failed
    since the last successful write probe, no write has waited too long for a lock, it is not damaged and
    this server still holds it), and the orchestrator's loop is alive. 503 with the reason otherwise, with
    ``Retry-After`` only when the fault clears by itself."""
    orchestrator = service.orchestrator
    reason = service.store.health() or orchestrator.store_fault
    reason = reason or (None if orchestrator.alive() else "the orchestrator loop is not running")
    if reason is not None:
        if service.permanent():  # no retry clears it: no Retry-After
            raise HTTPException(503, orchestrator.store_fault or reason)
        raise HTTPException(503, reason, headers={"Retry-After": str(RETRY_AFTER_S)})
    config = service.config
    return {"status": "ok", "executor": config.executor.name, "cluster": config.cluster.name, "time": time.time()}


@router.get("/metrics", response_class=PlainTextResponse)
def prometheus(service: Svc, authorization: Auth = None) -> PlainTextResponse:
    """Prometheus text format: queue length, GPUs used per type, decisions, decision latency; the
    per-tenant series only for an admin token when tokens are configured."""
    metrics = service.metrics
    view = service.orchestrator.view()
    for gpu_type, counts in view["gpu_types"].items():
        metrics.gpus_used.labels(gpu_type).set(counts["used"])
    metrics.queue.set(view["queued"])
    text = generate_latest(metrics.registry)
    who = service.config.tenants.authenticate(authorization)
    if who is not None and who.admin:
        text += generate_latest(metrics.tenant_registry)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")
