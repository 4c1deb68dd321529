"""``/v1/jobs``: submit, list, read and cancel jobs (contract 1)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import AsyncIterator
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query
from fastapi import Path as PathParam
from fastapi.responses import Response, StreamingResponse
from sqlalchemy.exc import IntegrityError

from frenzy_opt.api.schemas import STATES, EventOut, JobIn, JobListOut, JobOut
from frenzy_opt.api.service import Decided, Service, Svc, Who, job_out, parse_spec, unavailable, visible
from frenzy_opt.core.enums import TERMINAL_STATES
from frenzy_opt.launch.executors import LogChunk
from frenzy_opt.service.jobs import new_job_id
from frenzy_opt.service.records import JobRecord, job_values

JobIdPath = Annotated[str, PathParam(max_length=64)]
IdempotencyKey = Annotated[str | None, Header(max_length=200)]
Limit = Annotated[int, Query(ge=1, le=500)]
Offset = Annotated[int, Query(ge=0, le=1_000_000_000)]
MAX_WAIT_S = 60.0
"""The longest a submission may wait for its first decision (``?wait``; the bound ``--decision-wait-s`` had)."""
Wait = Annotated[
    float | None,
    Query(
        ge=0,
        le=MAX_WAIT_S,
        description="seconds to wait for the scheduler's first decision before answering (default: the "
        "service's --decision-wait-s, 0: answer once the job is stored)",
    ),
]
CANCEL_WAIT_S = 10.0
"""How long a cancel request waits for the scheduler to carry it out."""
MAX_LOG_BYTES = 4 << 20
"""The most one logs request (or one streamed piece) returns."""
FOLLOW_POLL_S = 0.5
"""How often a followed log is read again while its attempt runs."""
Attempt = Annotated[int | None, Query(ge=1, le=1_000_000, description="default: the latest attempt")]
LogOffset = Annotated[
    int | None, Query(ge=0, le=1 << 50, description="byte to start at; default: the last `limit` bytes")
]
LogLimit = Annotated[int, Query(ge=1, le=MAX_LOG_BYTES)]
TEXT = "text/plain; charset=utf-8"

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.post(
    "",
    status_code=202,
    response_model=JobOut,
    responses={
        400: {"description": "the body is not JSON"},
        401: {},
        409: {"description": "the Idempotency-Key was used for a different job"},
        413: {},
        422: {"description": "invalid spec, or no GPU type can hold the job"},
        429: {"description": "a new job shape's plan search is over the tenant's limits; see Retry-After"},
        503: {"description": "the job store cannot serve now; see Retry-After"},
    },
)
async def submit(
    body: JobIn, service: Svc, who: Who, idempotency_key: IdempotencyKey = None, wait: Wait = None
) -> JobOut:
    """Submit a job (contract 1). Answers 202 once the job is stored, with its id and state `queued`; the
    scheduler's first decision follows (read it with `GET /v1/jobs/{id}`). With `?wait=SECONDS` the answer
    waits up to that long for the first decision and carries the plan chosen, or the reason it waits.
    Re-posting with the same `Idempotency-Key` returns the same job. A job shape the scheduler has not
    planned yet costs a plan search, charged to your plan-search limits (429 with `Retry-After` over them)."""
    spec, mapping = parse_spec(body)
    service.writable(file=False)  # the file's identity is checked by the write (a system call per request)
    request_hash = hashlib.sha256(
        json.dumps([mapping, body.weight, body.max_retries], sort_keys=True).encode()
    ).hexdigest()
    loop = asyncio.get_running_loop()
    store = service.store
    if idempotency_key is not None:
        existing = await loop.run_in_executor(service.store_calls, store.by_key, who.tenant, idempotency_key)
        if existing is not None:
            return _replay(service, existing, request_hash)
    # On the event loop: a known shape is answered from the scheduler's cache, a new one searched in a worker.
    searched = await service.feasible(spec, who.tenant)
    values = job_values(
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
    try:  # committed with the concurrent submissions' rows (group commit): durable once it returns
        accepted = store.accepted(values, await store.accept_async(values))
    except IntegrityError:  # the same key posted concurrently: the first one won
        existing = await loop.run_in_executor(service.store_calls, store.by_key, who.tenant, idempotency_key or "")
        if existing is None:
            raise
        return _replay(service, existing, request_hash)
    service.metrics.submitted.labels(who.tenant).inc()
    seconds = service.config.decision_wait_s if wait is None else wait
    if seconds <= 0:  # acknowledged once stored; no call that takes the scheduler's lock
        service.orchestrator.submit(accepted, None, spec, searched=searched)
        return job_out(accepted, None)
    decided = Decided(loop)
    service.orchestrator.submit(accepted, decided, spec, searched=searched)
    with contextlib.suppress(TimeoutError):  # past the wait: answered with the reason it waits so far
        await asyncio.wait_for(decided.future, seconds)
    current = await loop.run_in_executor(service.store_calls, store.get, accepted.id)
    return service.job_out(current or accepted, queue=False)


def _replay(service: Service, existing: JobRecord, request_hash: str) -> JobOut:
    if existing.request_hash != request_hash:
        raise HTTPException(409, "Idempotency-Key already used for a different job")
    return service.job_out(existing, queue=False)


@router.get("", response_model=JobListOut, responses={401: {}})
def list_jobs(service: Svc, who: Who, state: STATES | None = None, limit: Limit = 50, offset: Offset = 0) -> JobListOut:
    """Your jobs (an admin: everyone's) in submission order, optionally of one state, a page at a time."""
    records, total = service.store.list_jobs(
        tenant=None if who.admin else who.tenant, state=state, limit=limit, offset=offset
    )
    items = [service.job_out(r) for r in records]
    following = offset + len(items)
    return JobListOut(
        items=items, total=total, limit=limit, offset=offset, next_offset=following if following < total else None
    )


@router.get("/{job_id}", response_model=JobOut, responses={401: {}, 404: {}})
def get_job(job_id: JobIdPath, service: Svc, who: Who) -> JobOut:
    """One job with its state history, plan, placement, and predicted vs measured memory and step time."""
    record = visible(service.store.get(job_id), who)
    history = [EventOut(at=e.at, state=e.state, detail=e.detail) for e in service.store.events(job_id)]
    return service.job_out(record, history, progress=True)


@router.post(
    "/{job_id}/cancel",
    response_model=JobOut,
    responses={401: {}, 404: {}, 409: {"description": "the job already ended"}, 503: {}},
)
def cancel_job(job_id: JobIdPath, service: Svc, who: Who) -> JobOut:
    """Cancel a queued or running job; its GPUs are released."""
    record = visible(service.store.get(job_id), who)
    if record.state in TERMINAL_STATES:
        raise HTTPException(409, f"job already {record.state}")
    service.writable()
    orchestrator = service.orchestrator
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
                raise unavailable(reason) from None
    return service.job_out(visible(service.store.get(job_id), who))


@router.get(
    "/{job_id}/logs",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}}, 401: {}, 404: {}},
)
async def job_logs(
    job_id: JobIdPath,
    service: Svc,
    who: Who,
    attempt: Attempt = None,
    offset: LogOffset = None,
    limit: LogLimit = 64 << 10,
    follow: bool = False,
) -> Response:
    """An attempt's output: every rank's stdout and stderr (local and Ray executors) or its progress lines
    (simulated). Headers `X-Log-Attempt`, `X-Log-Offset` (where the next read starts) and `X-Log-Size`.
    With `follow=1` the output is streamed as it is written until the attempt ends (a queued job's first
    attempt is waited for)."""
    loop = asyncio.get_running_loop()
    record = visible(await loop.run_in_executor(service.store_calls, service.store.get, job_id), who)
    if follow:
        headers = {} if attempt is None else {"X-Log-Attempt": str(attempt)}
        return StreamingResponse(_follow(service, job_id, attempt, offset or 0), media_type=TEXT, headers=headers)
    number = attempt or record.attempts
    chunk = None
    if number:
        chunk = await loop.run_in_executor(None, service.config.executor.read_log, job_id, number, offset, limit)
    return Response(
        b"" if chunk is None else chunk.data,
        media_type=TEXT,
        headers={
            "X-Log-Attempt": str(number),
            "X-Log-Offset": str((offset or 0) if chunk is None else chunk.next_offset),
            "X-Log-Size": str(0 if chunk is None else chunk.size),
        },
    )


async def _follow(service: Service, job_id: str, attempt: int | None, offset: int) -> AsyncIterator[bytes]:
    """The attempt's output as it grows (:func:`job_logs`); ends once the attempt ended and all it wrote
    was sent, or the scheduler stopped."""
    loop = asyncio.get_running_loop()
    orchestrator, executor = service.orchestrator, service.config.executor

    def read() -> LogChunk | None:
        assert attempt is not None
        return executor.read_log(job_id, attempt, offset, MAX_LOG_BYTES)

    while attempt is None:  # the job's first attempt
        record = await loop.run_in_executor(service.store_calls, service.store.get, job_id)
        if record is None or (record.attempts == 0 and record.state in TERMINAL_STATES):
            return
        if record.attempts:
            attempt = record.attempts
            break
        await asyncio.sleep(FOLLOW_POLL_S)
    while True:
        live = orchestrator.current_attempt(job_id) == attempt  # before the read: nothing written is missed
        chunk = await loop.run_in_executor(None, read)
        if chunk is not None and chunk.data:
            offset = chunk.next_offset
            yield chunk.data
            continue
        if not live or not orchestrator.alive():
            return
        await asyncio.sleep(FOLLOW_POLL_S)
