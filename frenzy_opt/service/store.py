"""Durable job state: SQLAlchemy over SQLite (WAL) by default, any SQLAlchemy URL (e.g. PostgreSQL) by choice.

Tables: ``jobs`` (one row per accepted job: tenant, spec, state, plan, placement, attempts, the reason it
waits or failed, predicted and measured figures) and ``job_events`` (every state change, in order). A job is
written once when it is accepted, in the same transaction as its first event, so a crash never leaves half a
job; the orchestrator is the only writer of state changes.

Sessions are opened where they are used (``with store.session() as s``) and closed at once: never held by
a request for its whole life (a session taken from a yield dependency exhausted the pool at 50 concurrent
requests in an earlier service).

Faults are explicit:

- **One writer.** A service takes the store's writer lock before it recovers (:meth:`Store.acquire_writer`):
  an exclusive ``flock`` on ``<db>.lock`` for a SQLite file, a session-level advisory lock on PostgreSQL.
  Both are released by the operating system or the server when the holder dies, so a ``kill -9`` never leaves
  a stale lock, and a second ``frenzy serve`` on the same database fails with :class:`StoreInUse` before it
  touches a row.
- **Integrity.** At start a SQLite file must pass ``PRAGMA quick_check`` and hold the tables
  (:class:`StoreCorrupt` otherwise); :meth:`Store.health` says when the file was deleted or replaced while
  the service runs, and every write refuses to go on then (:class:`StoreUnavailable`), rather than writing
  into an unlinked file or a fresh empty one.
- **Busy and full.** One busy timeout (:data:`BUSY_TIMEOUT_S`, SQLite's ``busy_timeout`` and PostgreSQL's
  ``lock_timeout``); a write that still fails raises one of :data:`STORE_FAULTS`, which the orchestrator retries
  with back-off and the API answers with 503 and ``Retry-After``.
- **Bad rows.** A row whose JSON cannot be read loads with the problem listed in :attr:`JobRecord.problems`
  (and the unreadable field empty) instead of raising, so one bad row cannot stop a listing or a start-up;
  the orchestrator quarantines such rows (fails them with the reason).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    bindparam,
    create_engine,
    event,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from frenzy_opt.core.enums import ACTIVE_STATES, TERMINAL_STATES, JobState

log = logging.getLogger(__name__)

BUSY_TIMEOUT_S = 30.0
"""How long a write waits for a lock held by another connection before it fails (SQLite's ``busy_timeout``,
https://www.sqlite.org/c3ref/busy_timeout.html; PostgreSQL's ``lock_timeout``,
https://www.postgresql.org/docs/15/runtime-config-client.html)."""

STATES = tuple(JobState)
TERMINAL = TERMINAL_STATES
ACTIVE = ACTIVE_STATES


class StoreUnavailable(RuntimeError):
    """The store cannot take writes now (its file is gone, the disk is full, a lock is held too long)."""


class StoreCorrupt(RuntimeError):
    """The database fails its integrity check: the service does not start on it."""


class StoreInUse(RuntimeError):
    """Another service holds the store's writer lock."""


STORE_FAULTS: tuple[type[Exception], ...] = (StoreUnavailable, DBAPIError, OSError)
"""What a store call raises when the database, not the request, is at fault (a locked or full SQLite file, a
PostgreSQL server gone). :func:`is_store_fault` leaves out integrity errors: those are the request's."""


def is_store_fault(err: BaseException) -> bool:
    return isinstance(err, STORE_FAULTS) and not isinstance(err, IntegrityError)


def describe_fault(err: BaseException) -> str:
    """A store error in one line: its class and the first line of its message (SQLAlchemy's run on with the
    statement and its parameters)."""
    message = str(err)
    return f"{err.__class__.__name__}: {message.splitlines()[0] if message else ''}"


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


# The hot paths' statements, built once (building a Core statement per call cost more than running it).
_JOBS: Table = JobRow.__table__  # type: ignore[assignment]  # a declarative class's table is a Table
_EVENTS: Table = EventRow.__table__  # type: ignore[assignment]
_GET = select(_JOBS).where(_JOBS.c.id == bindparam("b_id"))
_BY_KEY = select(_JOBS).where(_JOBS.c.tenant == bindparam("b_tenant"), _JOBS.c.idempotency_key == bindparam("b_key"))
_UPDATE = update(_JOBS).where(_JOBS.c.id == bindparam("b_id"))
"""SET from the parameters' column names."""
_INSERT_JOB = insert(_JOBS)
_INSERT_EVENT = insert(_EVENTS)


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
    placement: dict[str, Any] | None
    predicted: dict[str, Any] | None
    measured: dict[str, Any] | None
    created_at: float
    updated_at: float
    problems: tuple[str, ...] = ()
    """What could not be read from the stored row (the field is then empty); quarantined at start-up."""

    @staticmethod
    def of(row: JobRow) -> JobRecord:
        """The record of an ORM row (the same mapping as a Core row's, :func:`_record`)."""
        return _record({column.name: getattr(row, column.name) for column in JobRow.__table__.columns})


@dataclass(frozen=True, slots=True, kw_only=True)
class EventRecord:
    at: float
    state: str
    """As written (a state of :class:`JobState`)."""
    detail: str


def _record(values: dict[str, Any]) -> JobRecord:
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


def _sqlite_pragmas(busy_timeout_s: float) -> Any:
    def on_connect(dbapi_connection: Any, _: Any) -> None:
        # WAL: readers never block the writer and a crash loses at most the last transaction's fsync
        # (https://www.sqlite.org/wal.html); NORMAL sync is durable across process crashes in WAL mode.
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return on_connect


def sqlite_path(url: str) -> str | None:
    """The file of a SQLite URL (None for another database or an in-memory one)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return os.path.abspath(parsed.database)


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


class Store:
    """The job database."""

    def __init__(self, url: str, *, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self.url = url
        self.path = sqlite_path(url)
        self.backend = make_url(url).get_backend_name()
        kwargs: dict[str, Any] = {}
        if self.backend == "sqlite":
            # The driver's own wait (``timeout``) and the pragma are the same figure: one busy timeout.
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": busy_timeout_s}
        elif self.backend == "postgresql":
            kwargs["connect_args"] = {"options": f"-c lock_timeout={int(busy_timeout_s * 1000)}"}
            kwargs["pool_pre_ping"] = True  # a connection the server dropped is replaced, not handed out
        self.engine: Engine = create_engine(url, **kwargs)
        if self.backend == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas(busy_timeout_s))
        self._identity: tuple[int, int] | None = None
        self.verify()
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write = threading.Lock()
        """Serialises this process's writes: acceptance order (``seq``), and no two of its own transactions
        wait on each other in SQLite's busy handler (which sleeps in steps of up to 100 ms: the tail of
        submission latency under concurrency); other processes still meet the busy timeout."""
        self._next_seq: int | None = None
        self._writer: Any = None
        """The writer lock held (a lock file or a PostgreSQL connection), None when not held."""

    # --- integrity, health and the writer lock ------------------------------------------------------

    def verify(self) -> None:
        """Create missing tables, then check the database's integrity (module docstring)."""
        where = self.path or make_url(self.url).render_as_string(hide_password=True)
        try:
            Base.metadata.create_all(self.engine)
            if self.backend == "sqlite":
                with self.engine.connect() as conn:
                    result = [str(r[0]) for r in conn.exec_driver_sql("PRAGMA quick_check")]
                if result != ["ok"]:
                    raise StoreCorrupt(f"{where} fails SQLite's integrity check: {'; '.join(result[:3])}")
        except DBAPIError as err:
            message = str(err.orig)
            if any(word in message for word in ("malformed", "not a database", "corrupt")):
                raise StoreCorrupt(f"{where} is not a readable database ({message}): restore it from a backup") from err
            raise
        if self.path is not None:
            self._identity = _identity(self.path)

    def health(self) -> str | None:
        """Why the store cannot serve now (None when it can): the database does not answer, or its file
        was deleted or replaced since the service opened it."""
        problem = self.file_problem()
        if problem is not None:
            return problem
        try:
            self.ping()
        except SQLAlchemyError as err:
            return f"the database does not answer: {describe_fault(err)}"
        return None

    def file_problem(self) -> str | None:
        """Why writes would go astray (the SQLite file was deleted or replaced), without a query: cheap
        enough for every request."""
        if self.path is None or self._identity is None:
            return None
        now = _identity(self.path)
        if now == self._identity:
            return None
        state = "deleted" if now is None else "replaced"
        return f"the database file {self.path} was {state} while the service ran; restart it on a good file"

    def _check_writable(self) -> None:
        problem = self.file_problem()
        if problem is not None:
            raise StoreUnavailable(problem)

    def acquire_writer(self) -> None:
        """Take the writer lock (module docstring); :class:`StoreInUse` if another service holds it."""
        if self._writer is not None:
            return
        if self.path is not None:
            handle = open(f"{self.path}.lock", "a+")  # noqa: SIM115 (held open for the service's life)
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "unknown"
                handle.close()
                raise StoreInUse(
                    f"{self.path} is in use by another frenzy serve ({holder}): stop it, or give this one another --db"
                ) from None
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()} on {os.uname().nodename}, since {time.strftime('%Y-%m-%d %H:%M:%S')}")
            handle.flush()
            self._writer = handle
        elif self.backend == "postgresql":
            conn: Connection = self.engine.connect()
            key = zlib.crc32(b"frenzy-opt writer") & 0x7FFFFFFF
            if not conn.exec_driver_sql(f"SELECT pg_try_advisory_lock({key})").scalar():
                conn.close()
                where = make_url(self.url).render_as_string(hide_password=True)
                raise StoreInUse(f"{where} is in use by another frenzy serve: stop it, or give this one another --db")
            conn.commit()
            self._writer = conn

    def release_writer(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()  # the lock goes with the file descriptor or the session

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self._sessions() as s, s.begin():
            yield s

    def close(self) -> None:
        self.release_writer()
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
        self._check_writable()
        with self._write, self.engine.begin() as conn:
            if self._next_seq is None:
                self._next_seq = int(conn.scalar(select(func.max(JobRow.seq))) or 0) + 1
            values["seq"] = self._next_seq
            conn.execute(_INSERT_JOB, values)
            conn.execute(_INSERT_EVENT, {"job_id": job_id, "at": now, "state": "queued", "detail": "accepted"})
            self._next_seq += 1
        return _record(values)

    def transition(self, job_id: str, state: str, detail: str = "", **fields: Any) -> None:
        """Move a job to ``state`` (recording the event) and set other columns (``plan``, ``placement``,
        ``measured``: JSON-encoded; ``attempts``, ``reason``)."""
        self.apply([(job_id, state, detail, fields)])

    def apply(self, transitions: Sequence[tuple[str, str, str, dict[str, Any]]]) -> None:
        """Several :meth:`transition` s in order, in one transaction."""
        for _, state, _, _ in transitions:
            if state not in STATES:
                raise ValueError(f"state must be one of {', '.join(STATES)}, got {state!r}")
        self._check_writable()
        now = time.time()
        events = []
        with self._write, self.engine.begin() as conn:
            for job_id, state, detail, fields in transitions:
                values: dict[str, Any] = {"b_id": job_id, "state": state, "updated_at": now}
                values["reason"] = fields.get("reason", detail)
                for key, value in fields.items():
                    if key in ("plan", "placement", "measured", "predicted"):
                        values[f"{key}_json"] = None if value is None else json.dumps(value)
                    elif key != "reason":
                        values[key] = value
                if conn.execute(_UPDATE, values).rowcount != 1:
                    raise KeyError(job_id)
                events.append({"job_id": job_id, "at": now, "state": state, "detail": detail})
            if events:
                conn.execute(_INSERT_EVENT, events)  # one executemany, in order (ids ascend)

    def save_calibration(self, report: dict[str, dict[str, Any]]) -> None:
        """Upsert the fitted efficiencies (:func:`frenzy_opt.prediction.closedloop.recalibrate`'s report)."""
        self._check_writable()
        now = time.time()
        with self._write, self.session() as s:
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
            row = conn.execute(_GET, {"b_id": job_id}).mappings().first()
            return None if row is None else _record(dict(row))

    def by_key(self, tenant: str, key: str) -> JobRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(_BY_KEY, {"b_tenant": tenant, "b_key": key}).mappings().first()
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

    def history_since(self, since: float, tenant: str | None) -> list[tuple[JobRecord, list[EventRecord]]]:
        """Every job (of ``tenant``) that was active at or after ``since``, with its events in order: two
        queries, whatever the number of jobs (the accounting reads them, :mod:`frenzy_opt.service.accounting`)."""
        # The events are selected by the same condition through a join, not by an IN list of the job ids
        # (SQLite bounds the number of bound parameters of one statement).
        wanted = [or_(JobRow.updated_at >= since, JobRow.state.in_(ACTIVE))]
        if tenant is not None:
            wanted.append(JobRow.tenant == tenant)
        with self.session() as s:
            records = [JobRecord.of(r) for r in s.scalars(select(JobRow).where(*wanted).order_by(JobRow.seq))]
            events: dict[str, list[EventRecord]] = {r.id: [] for r in records}
            joined = select(EventRow).join(JobRow, EventRow.job_id == JobRow.id).where(*wanted)
            rows = s.scalars(joined.order_by(EventRow.id))
            for row in rows:  # a job accepted between the two queries (read committed) is left for next time
                if row.job_id in events:
                    events[row.job_id].append(EventRecord(at=row.at, state=row.state, detail=row.detail))
            return [(r, events[r.id]) for r in records]

    def active(self) -> list[JobRecord]:
        """Jobs not in a terminal state, in acceptance order (for recovery)."""
        with self.session() as s:
            rows = s.scalars(select(JobRow).where(JobRow.state.in_(ACTIVE)).order_by(JobRow.seq))
            return [JobRecord.of(r) for r in rows]
