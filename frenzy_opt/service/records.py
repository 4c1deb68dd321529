"""A job as stored, detached from any session (:class:`JobRecord`, :class:`EventRecord`), read from a row's
column values (:func:`job_record`), and a new job's row (:func:`job_values`).

Bad rows: a row whose JSON cannot be read loads with the problem listed in :attr:`JobRecord.problems` (and the
unreadable field empty) instead of raising, so one bad row cannot stop a listing or a start-up; the orchestrator
quarantines such rows (fails them with the reason).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from frenzy_opt.core.enums import JobState
from frenzy_opt.service.schema import JobRow

STATES = tuple(JobState)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRecord:
    """A job as stored, detached from any session."""

    id: str
    seq: int
    tenant: str
    name: str
    idempotency_key: str | None
    request_hash: str
    spec: dict[str, Any]
    state: JobState
    reason: str
    attempts: int
    max_retries: int
    weight: float
    plan: dict[str, Any] | None
    failures: int = 0
    moves: int = 0
    placement: dict[str, Any] | None
    predicted: dict[str, Any] | None
    measured: dict[str, Any] | None
    created_at: float
    updated_at: float
    problems: tuple[str, ...] = ()
    """What could not be read from the stored row (the field is then empty); quarantined at start-up."""

    @staticmethod
    def of(row: JobRow) -> JobRecord:
        """The record of an ORM row (the same mapping as a Core row's, :func:`job_record`)."""
        return job_record({column.name: getattr(row, column.name) for column in JobRow.__table__.columns})


@dataclass(frozen=True, slots=True, kw_only=True)
class EventRecord:
    at: float
    state: str
    """As written (a state of :class:`JobState`)."""
    detail: str


def job_record(values: dict[str, Any]) -> JobRecord:
    """A :class:`JobRecord` from a row's column values; a JSON column that does not hold a JSON object is
    read as empty and named in ``problems``."""
    problems: list[str] = []

    def load(column: str) -> dict[str, Any] | None:
        text = values[column]
        if text is None:
            return None
        try:
            value = json.loads(text)
        except (TypeError, ValueError) as err:
            problems.append(f"{column} is not valid JSON ({err})")
            return None
        if not isinstance(value, dict):
            problems.append(f"{column} is not a JSON object")
            return None
        return value

    spec = load("spec_json")
    try:
        state = JobState(values["state"])
    except ValueError:
        problems.append(f"state {values['state']!r} is not one of {', '.join(STATES)}")
        state = JobState.FAILED
    if spec is None and not any(p.startswith("spec_json") for p in problems):
        problems.append("spec_json is empty")
    return JobRecord(
        id=values["id"],
        seq=values["seq"],
        tenant=values["tenant"],
        name=values["name"],
        idempotency_key=values["idempotency_key"],
        request_hash=values["request_hash"],
        spec=spec or {},
        state=state,
        reason=values["reason"],
        attempts=values["attempts"],
        failures=values.get("failures") or 0,
        moves=values.get("moves") or 0,
        max_retries=values["max_retries"],
        weight=values["weight"],
        plan=load("plan_json"),
        placement=load("placement_json"),
        predicted=load("predicted_json"),
        measured=load("measured_json"),
        created_at=values["created_at"],
        updated_at=values["updated_at"],
        problems=tuple(problems),
    )


def job_values(
    *,
    job_id: str,
    tenant: str,
    name: str,
    spec: dict[str, Any],
    request_hash: str,
    idempotency_key: str | None,
    max_retries: int,
    weight: float,
    predicted: dict[str, Any] | None,
) -> dict[str, Any]:
    """A new job's row (queued, accepted now), every column but ``seq`` (given when it is committed)."""
    now = time.time()
    return {
        "id": job_id,
        "tenant": tenant,
        "name": name,
        "idempotency_key": idempotency_key,
        "request_hash": request_hash,
        "spec_json": json.dumps(spec, sort_keys=True),
        "state": "queued",
        "reason": "accepted",
        "attempts": 0,
        "failures": 0,
        "moves": 0,
        "max_retries": max_retries,
        "weight": weight,
        "plan_json": None,
        "placement_json": None,
        "predicted_json": None if predicted is None else json.dumps(predicted),
        "measured_json": None,
        "created_at": now,
        "updated_at": now,
    }
