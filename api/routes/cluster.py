"""The cluster now and its history: ``/v1/cluster``, ``/v1/usage``, ``/v1/timeline``, ``/v1/calibration``."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query

from frenzy_opt.api.auth import Principal
from frenzy_opt.api.service import Service, Svc, Who
from frenzy_opt.prediction.closedloop import memory_errors
from frenzy_opt.service.accounting import Held, held, usage

Since = Annotated[float, Query(ge=0, le=1e11, description="seconds since the epoch")]

router = APIRouter(prefix="/v1", tags=["cluster"], responses={401: {}})


@router.get("/cluster")
def cluster(service: Svc, who: Who) -> dict[str, Any]:
    """GPUs per type and node, free and used, and the running jobs (yours; an admin: all)."""
    view = service.orchestrator.view()
    if not who.admin:
        view["running"] = [r for r in view["running"] if r["tenant"] == who.tenant]
    return view


def _stretches(service: Service, since: float, who: Principal) -> list[Held]:
    history = service.store.history_since(since, None if who.admin else who.tenant)
    return [h for record, events in history for h in held(record, events)]


@router.get("/usage")
def usage_of(service: Svc, who: Who, since: Since = 0.0) -> dict[str, Any]:
    """GPU-hours of cluster time per tenant and GPU type since ``since`` (seconds since the epoch) from the
    job history: yours (an admin: everyone's). The service's one clock is cluster time: a stretch held for
    ``w`` wall seconds counts ``w x time_scale`` (the simulated executor's scale; 1 on real GPUs)."""
    now = time.time()
    scale = service.orchestrator.time_scale
    rows = usage(_stretches(service, since, who), since, now, time_scale=scale)
    return {"since": since, "until": now, "time_scale": scale, "rows": rows}


@router.get("/timeline")
def timeline(service: Svc, who: Who, since: Since = 0.0) -> dict[str, Any]:
    """When each job held which GPUs since ``since`` (seconds since the epoch; ``end`` null while it
    runs), and the GPUs per type: the dashboard's occupancy chart and Gantt."""
    view = service.orchestrator.view()
    return {
        "now": time.time(),
        "gpus_per_type": {t: c["gpus"] for t, c in view["gpu_types"].items()},
        "intervals": [h.to_dict() for h in _stretches(service, since, who) if h.end is None or h.end >= since],
    }


@router.get("/calibration")
def calibration(service: Svc, who: Who) -> dict[str, Any]:
    """The closed loop: step-time efficiencies refitted from measured runs (per GPU@precision, with the
    prediction error before and after; aggregates, no job named) and measured vs predicted peak memory of
    recent runs: yours (an admin: everyone's)."""
    snapshot = service.orchestrator.calibration_snapshot()
    samples = snapshot["samples"]
    if not who.admin:
        samples = [s for s in samples if snapshot["tenants"].get(s.job_id) == who.tenant]
    return {
        "efficiency": snapshot["efficiency"],
        "report": snapshot["report"],
        "memory": memory_errors(samples)[-50:],
        "samples": len(samples),
    }
