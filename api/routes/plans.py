"""``POST /v1/plans``: the dry run (:mod:`frenzy_opt.api.plansearch`)."""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from frenzy_opt.api.plansearch import MAX_TOP_PLANS, Throttled
from frenzy_opt.api.schemas import JobIn, MicroBatchOut, PlanOut, PlansOut
from frenzy_opt.api.service import Svc, Who, parse_spec, unprocessable
from frenzy_opt.planning.candidates import micro_batch_summary
from frenzy_opt.planning.plans import NoFeasiblePlan

Top = Annotated[int, Query(ge=1, le=MAX_TOP_PLANS)]

router = APIRouter(prefix="/v1", tags=["plans"])


@router.post(
    "/plans",
    response_model=PlansOut,
    responses={
        400: {"description": "the body is not JSON"},
        401: {},
        413: {},
        422: {"description": "invalid spec, or no GPU type can hold the job"},
        429: {"description": "over the tenant's plan-search limits; see Retry-After"},
    },
)
async def plans(body: JobIn, service: Svc, who: Who, top: Top = 10) -> PlansOut:
    """A dry run: the memory-feasible plans of a job on this cluster, fastest first. Nothing is stored."""
    spec, _ = parse_spec(body)
    try:
        service.searches.admit(who.tenant)
        summary = await service.searches.summary(spec, who.tenant)
    except Throttled as err:
        service.metrics.throttled.inc()
        retry = max(1, math.ceil(err.retry_after_s))
        raise HTTPException(429, str(err), headers={"Retry-After": str(retry)}) from None
    except NoFeasiblePlan as err:
        raise unprocessable(str(err)) from None
    steps = spec.training.train_steps
    return PlansOut(
        cluster=service.config.cluster.name,
        num_plans=summary["num_plans"],
        min_gpus_per_type=summary["min_gpus_per_type"],
        micro_batch=MicroBatchOut(**micro_batch_summary(spec)),
        plans=[
            PlanOut(**{**p, "est_runtime_s": None if p["step_time_s"] is None else p["step_time_s"] * steps})
            for p in summary["plans"][:top]
        ],
    )
