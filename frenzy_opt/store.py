"""Durable job state: SQLAlchemy over SQLite (WAL) by default, any SQLAlchemy URL (e.g. PostgreSQL) by choice.

Tables: ``jobs`` (one row per accepted job: tenant, spec, state, plan, placement, attempts, the reason it
waits or failed, predicted and measured figures) and ``job_events`` (every state change, in order). A job is
written once when it is accepted, in the same transaction as its first event, so a crash never leaves half a
job; the orchestrator is the only writer of state changes.

Sessions are opened where they are used (``with store.session() as s``) and closed at once: never held by
a request for its whole life (a session taken from a yield dependency exhausted the pool at 50 concurrent
requests in an earlier service).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

STATES = ("queued", "scheduled", "running", "succeeded", "failed", "cancelled")
TERMINAL = ("succeeded", "failed", "cancelled")
ACTIVE = ("queued", "scheduled", "running")


class Base(DeclarativeBase):
    pass


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("tenant", "idempotency_key", name="uq_jobs_tenant_key"),
        Index("ix_jobs_tenant_state", "tenant", "state"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, unique=True)
    """Acceptance order (the queue order after a restart)."""
    tenant: Mapped[str] = mapped_column(String(100))
    name: Mapped[str] = mapped_column(String(200))
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    spec_json: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(20), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_retries: Mapped[int] = mapped_column(Integer, default=2)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    plan_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    placement_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    predicted_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    measured_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class EventRow(Base):
    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    at: Mapped[float] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(20))
    detail: Mapped[str] = mapped_column(Text, default="")


class CalibrationRow(Base):
    """A fitted efficiency of the step-time model (closed loop), per ``GPU@precision``."""

    __tablename__ = "calibration"

    key: Mapped[str] = mapped_column(String(100), primary_key=True)
    efficiency: Mapped[float] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer)
    report_json: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[float] = mapped_column(Float)


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
    state: str
    reason: str
    attempts: int
    max_retries: int
    weight: float
    plan: dict[str, Any] | None
    placement: dict[str, Any] | None
    predicted: dict[str, Any] | None
    measured: dict[str, Any] | None
    created_at: float
    updated_at: float

    @staticmethod
    def of(row: JobRow) -> JobRecord:
        """The record of an ORM row (the same mapping as a Core row's, :func:`_record`)."""
        return _record({column.name: getattr(row, column.name) for column in JobRow.__table__.columns})


@dataclass(frozen=True, slots=True, kw_only=True)
class EventRecord:
    at: float
    state: str
    detail: str


def _record(values: dict[str, Any]) -> JobRecord:
    """A :class:`JobRecord` from a row's column values."""

    def load(text: str | None) -> dict[str, Any] | None:
        return None if text is None else dict(json.loads(text))

    return JobRecord(
        id=values["id"],
        seq=values["seq"],
        tenant=values["tenant"],
        name=values["name"],
        idempotency_key=values["idempotency_key"],
        request_hash=values["request_hash"],
        spec=json.loads(values["spec_json"]),
        state=values["state"],
        reason=values["reason"],
        attempts=values["attempts"],
        max_retries=values["max_retries"],
        weight=values["weight"],
        plan=load(values["plan_json"]),
        placement=load(values["placement_json"]),
        predicted=load(values["predicted_json"]),
        measured=load(values["measured_json"]),
        created_at=values["created_at"],
        updated_at=values["updated_at"],
    )


def _sqlite_pragmas(dbapi_connection: Any, _: Any) -> None:
    # WAL: readers never block the writer and a crash loses at most the last transaction's fsync
    # (https://www.sqlite.org/wal.html); NORMAL sync is durable across process crashes in WAL mode.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


class Store:
    """The job database."""

    def __init__(self, url: str) -> None:
        self.url = url
        kwargs: dict[str, Any] = {}
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        self.engine: Engine = create_engine(url, **kwargs)
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        Base.metadata.create_all(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._accept = threading.Lock()  # serialises acceptance order (``seq``) within the process
        self._next_seq: int | None = None

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self._sessions() as s, s.begin():
            yield s

    def close(self) -> None:
        self.engine.dispose()

    # --- writes ----------------------------------------------------------------------------------------

    def add_job(
        self,
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
    ) -> JobRecord:
        """Accept a job: its row and its first event in one transaction (SQLAlchemy Core: the ORM's unit of
        work tripled the cost of this hot path)."""
        now = time.time()
        values = {
            "id": job_id,
            "tenant": tenant,
            "name": name,
            "idempotency_key": idempotency_key,
            "request_hash": request_hash,
            "spec_json": json.dumps(spec, sort_keys=True),
            "state": "queued",
            "reason": "accepted",
            "attempts": 0,
            "max_retries": max_retries,
            "weight": weight,
            "plan_json": None,
            "placement_json": None,
            "predicted_json": None if predicted is None else json.dumps(predicted),
            "measured_json": None,
            "created_at": now,
            "updated_at": now,
        }
        with self._accept, self.engine.begin() as conn:
            if self._next_seq is None:
                self._next_seq = int(conn.scalar(select(func.max(JobRow.seq))) or 0) + 1
            values["seq"] = self._next_seq
            conn.execute(insert(JobRow), values)
            conn.execute(insert(EventRow), {"job_id": job_id, "at": now, "state": "queued", "detail": "accepted"})
            self._next_seq += 1
        return _record(values)

    def transition(self, job_id: str, state: str, detail: str = "", **fields: Any) -> None:
        """Move a job to ``state`` (recording the event) and set other columns (``plan``, ``placement``,
        ``measured``: JSON-encoded; ``attempts``, ``reason``)."""
        self.apply([(job_id, state, detail, fields)])

    def apply(self, transitions: list[tuple[str, str, str, dict[str, Any]]]) -> None:
        """Several :meth:`transition` s in order, in one transaction."""
        for _, state, _, _ in transitions:
            if state not in STATES:
                raise ValueError(f"state must be one of {', '.join(STATES)}, got {state!r}")
        now = time.time()
        with self.engine.begin() as conn:
            for job_id, state, detail, fields in transitions:
                values: dict[str, Any] = {"state": state, "reason": fields.get("reason", detail), "updated_at": now}
                for key, value in fields.items():
                    if key in ("plan", "placement", "measured", "predicted"):
                        values[f"{key}_json"] = None if value is None else json.dumps(value)
                    elif key != "reason":
                        values[key] = value
                if conn.execute(update(JobRow).where(JobRow.id == job_id).values(**values)).rowcount != 1:
                    raise KeyError(job_id)
                conn.execute(insert(EventRow), {"job_id": job_id, "at": now, "state": state, "detail": detail})

    def set_reason(self, job_id: str, reason: str) -> None:
        """Why a queued job waits (not a state change: no event)."""
        with self.session() as s:
            row = s.get(JobRow, job_id)
            if row is not None and row.reason != reason:
                row.reason = reason

    def save_calibration(self, report: dict[str, dict[str, Any]]) -> None:
        """Upsert the fitted efficiencies (:func:`frenzy_opt.closedloop.recalibrate`'s report)."""
        now = time.time()
        with self.session() as s:
            for key, entry in report.items():
                row = s.get(CalibrationRow, key)
                if row is None:
                    row = CalibrationRow(key=key)
                    s.add(row)
                row.efficiency = float(entry["efficiency_after"])
                row.samples = int(entry["samples"])
                row.report_json = json.dumps(entry)
                row.updated_at = now

    def calibration(self) -> dict[str, dict[str, Any]]:
        with self.session() as s:
            rows = s.scalars(select(CalibrationRow).order_by(CalibrationRow.key))
            return {r.key: {**json.loads(r.report_json), "updated_at": r.updated_at} for r in rows}

    # --- reads -----------------------------------------------------------------------------------------

    def ping(self) -> None:
        """Raise if the database does not answer."""
        with self.engine.connect() as conn:
            conn.execute(select(1))

    def get(self, job_id: str) -> JobRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(JobRow.__table__).where(JobRow.id == job_id)).mappings().first()
            return None if row is None else _record(dict(row))

    def by_key(self, tenant: str, key: str) -> JobRecord | None:
        with self.engine.connect() as conn:
            query = select(JobRow.__table__).where(JobRow.tenant == tenant, JobRow.idempotency_key == key)
            row = conn.execute(query).mappings().first()
            return None if row is None else _record(dict(row))

    def events(self, job_id: str) -> list[EventRecord]:
        with self.session() as s:
            rows = s.scalars(select(EventRow).where(EventRow.job_id == job_id).order_by(EventRow.id))
            return [EventRecord(at=r.at, state=r.state, detail=r.detail) for r in rows]

    def list_jobs(
        self, *, tenant: str | None, state: str | None, limit: int, offset: int
    ) -> tuple[list[JobRecord], int]:
        """A page of jobs in acceptance order, and the total that match."""
        with self.session() as s:
            query = select(JobRow)
            count = select(func.count()).select_from(JobRow)
            if tenant is not None:
                query, count = query.where(JobRow.tenant == tenant), count.where(JobRow.tenant == tenant)
            if state is not None:
                query, count = query.where(JobRow.state == state), count.where(JobRow.state == state)
            total = int(s.scalar(count) or 0)
            rows = s.scalars(query.order_by(JobRow.seq).limit(limit).offset(offset))
            return [JobRecord.of(r) for r in rows], total

    def active(self) -> list[JobRecord]:
        """Jobs not in a terminal state, in acceptance order (for recovery)."""
        with self.session() as s:
            rows = s.scalars(select(JobRow).where(JobRow.state.in_(ACTIVE)).order_by(JobRow.seq))
            return [JobRecord.of(r) for r in rows]
