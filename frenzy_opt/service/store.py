"""Durable job state: SQLAlchemy over SQLite (WAL) by default, any SQLAlchemy URL (e.g. PostgreSQL) by choice.

Tables: ``jobs`` (one row per accepted job: tenant, spec, state, plan, placement, attempts, the reason it
waits or failed, predicted and measured figures) and ``job_events`` (every state change, in order). A job is
written once when it is accepted, in the same transaction as its first event, so a crash never leaves half a
job; the orchestrator is the only writer of state changes.

Sessions are opened where they are used (``with store.session() as s``) and closed at once: never held by
a request for its whole life (a session taken from a yield dependency exhausted the pool at 50 concurrent
requests in an earlier service).

:class:`Store` is the job database's reads and writes. What it stands on, one concept a module: the tables and
the errors a store raises (:mod:`frenzy_opt.service.schema`), a job as stored (:mod:`frenzy_opt.service.records`:
a row that cannot be read loads with its problems, it does not raise), opening and checking the database
(:mod:`frenzy_opt.service.database`: integrity and shape), the writer lock, faults and fail-fast writes
(:mod:`frenzy_opt.service.health`, :mod:`frenzy_opt.service.writer`) and what counts as a fault
(:mod:`frenzy_opt.service.faults`). The group commit of accepted jobs: :mod:`frenzy_opt.service.groupcommit`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy import Table, bindparam, func, insert, not_, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, sessionmaker

from frenzy_opt.core.enums import ACTIVE_STATES, TERMINAL_STATES
from frenzy_opt.service.database import BUSY_TIMEOUT_S
from frenzy_opt.service.faults import is_store_fault
from frenzy_opt.service.groupcommit import GroupCommit
from frenzy_opt.service.health import StoreHealth
from frenzy_opt.service.records import STATES, EventRecord, JobRecord, job_record, job_values
from frenzy_opt.service.schema import (
    CalibrationRow,
    EventRow,
    JobRow,
    StoreCorrupt,
    StoreFenced,
    StoreInUse,
    StoreMissing,
    StoreRefused,
    StoreSchema,
    StoreUnavailable,
)
from frenzy_opt.service.writer import FileLock

__all__ = [
    "StoreCorrupt",
    "StoreFenced",
    "StoreInUse",
    "StoreMissing",
    "StoreRefused",
    "StoreSchema",
    "StoreUnavailable",
]

TERMINAL = TERMINAL_STATES
ACTIVE = ACTIVE_STATES


# The hot paths' statements, built once (building a Core statement per call cost more than running it).
_JOBS: Table = JobRow.__table__  # type: ignore[assignment]  # a declarative class's table is a Table
_EVENTS: Table = EventRow.__table__  # type: ignore[assignment]
_GET = select(_JOBS).where(_JOBS.c.id == bindparam("b_id"))
_BY_KEY = select(_JOBS).where(_JOBS.c.tenant == bindparam("b_tenant"), _JOBS.c.idempotency_key == bindparam("b_key"))
_UPDATE = update(_JOBS).where(_JOBS.c.id == bindparam("b_id"))
"""SET from the parameters' column names."""
_INSERT_EVENT = insert(_EVENTS)
_NEW_SINCE = select(_JOBS).where(_JOBS.c.seq > bindparam("b_seq")).order_by(_JOBS.c.seq).limit(bindparam("b_limit"))


P = ParamSpec("P")
R = TypeVar("R")


def _noted(read: Callable[Concatenate[Store, P], R]) -> Callable[Concatenate[Store, P], R]:
    """A read that notes the store fault it meets (:meth:`Store._note`): a damaged page found by a read is a
    damaged database, a server gone for a read is gone for writes."""

    @functools.wraps(read)
    def noting(store: Store, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return read(store, *args, **kwargs)
        except Exception as err:
            if is_store_fault(err):
                store._note(err)
            raise

    return noting


class Store(StoreHealth):
    """The job database. ``create=False``: refuse a store that does not exist yet (:class:`StoreMissing`)
    rather than start an empty one (``frenzy serve`` without ``--create``)."""

    def __init__(self, url: str, *, busy_timeout_s: float = BUSY_TIMEOUT_S, create: bool = True) -> None:
        super().__init__(url, busy_timeout_s=busy_timeout_s, create=create)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._commits = GroupCommit(self.write)
        """The group commit of accepted jobs (its thread starts with the first)."""

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self._sessions() as s, s.begin():
            yield s

    def close(self) -> None:
        self._commits.close()
        self._closed.set()
        watch, self._watch = self._watch, None
        if watch is not None and watch is not threading.current_thread():
            watch.join(5)
        self.release_writer()
        self.engine.dispose()
        if isinstance(self._writer, FileLock):
            self._writer.close()  # after the engine: the last descriptor of the file goes last

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
        """Accept a job: its row and its first event in one transaction, shared with the inserts of concurrent
        submissions (:meth:`accept`); returns once committed."""
        values = job_values(
            job_id=job_id,
            tenant=tenant,
            name=name,
            spec=spec,
            request_hash=request_hash,
            idempotency_key=idempotency_key,
            max_retries=max_retries,
            weight=weight,
            predicted=predicted,
        )
        return self.accepted(values, self.accept(values).result())

    def accept(self, values: dict[str, Any]) -> Future[int]:
        """Queue a job row (:func:`job_values`) for the next group commit
        (:mod:`frenzy_opt.service.groupcommit`); the future gives its ``seq`` once the row is durable, or the
        error (an :class:`IntegrityError` for an ``Idempotency-Key`` the tenant used, a store fault)."""
        return self._commits.add(values)  # refused at once while the store is at fault, as every write

    def accept_async(self, values: dict[str, Any]) -> asyncio.Future[int]:
        """:meth:`accept` awaited on the running event loop."""
        return self._commits.add_async(values)

    @staticmethod
    def accepted(values: dict[str, Any], seq: int) -> JobRecord:
        """The record of a committed job row."""
        return job_record({**values, "seq": seq})

    def write(self, work: Callable[[Connection], R]) -> R:
        """Run ``work`` inside one write transaction (the group commit's)."""
        with self._writing() as conn:
            return work(conn)

    def transition(self, job_id: str, state: str, detail: str = "", **fields: Any) -> None:
        """Move a job to ``state`` (recording the event) and set other columns (``plan``, ``placement``,
        ``measured``: JSON-encoded; ``attempts``, ``failures``, ``moves``, ``reason``)."""
        self.apply([(job_id, state, detail, fields)])

    def apply(self, transitions: Sequence[tuple[str, str, str, dict[str, Any]]]) -> None:
        """Several :meth:`transition` s in order, in one transaction."""
        for _, state, _, _ in transitions:
            if state not in STATES:
                raise ValueError(f"state must be one of {', '.join(STATES)}, got {state!r}")
        now = time.time()
        events = []
        with self._writing() as conn:
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
        now = time.time()
        table: Table = CalibrationRow.__table__  # type: ignore[assignment]
        with self._writing() as conn:
            for key, entry in report.items():
                values = {
                    "efficiency": float(entry["efficiency_after"]),
                    "samples": int(entry["samples"]),
                    "report_json": json.dumps(entry),
                    "updated_at": now,
                }
                if conn.execute(update(table).where(table.c.key == key).values(**values)).rowcount == 0:
                    conn.execute(insert(table).values(key=key, **values))

    @_noted
    def calibration(self) -> dict[str, dict[str, Any]]:
        with self.session() as s:
            rows = s.scalars(select(CalibrationRow).order_by(CalibrationRow.key))
            return {r.key: {**json.loads(r.report_json), "updated_at": r.updated_at} for r in rows}

    # --- reads -----------------------------------------------------------------------------------------

    @_noted
    def get(self, job_id: str) -> JobRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(_GET, {"b_id": job_id}).mappings().first()
            return None if row is None else job_record(dict(row))

    @_noted
    def by_key(self, tenant: str, key: str) -> JobRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(_BY_KEY, {"b_tenant": tenant, "b_key": key}).mappings().first()
            return None if row is None else job_record(dict(row))

    @_noted
    def events(self, job_id: str) -> list[EventRecord]:
        with self.session() as s:
            rows = s.scalars(select(EventRow).where(EventRow.job_id == job_id).order_by(EventRow.id))
            return [EventRecord(at=r.at, state=r.state, detail=r.detail) for r in rows]

    @_noted
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

    @_noted
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

    @_noted
    def active(self) -> list[JobRecord]:
        """Jobs not in a terminal state, in acceptance order (for recovery), and rows whose state is none this
        version knows (recovery quarantines them: :attr:`JobRecord.problems` names the state)."""
        with self.session() as s:
            unknown = not_(JobRow.state.in_(STATES))
            rows = s.scalars(select(JobRow).where(or_(JobRow.state.in_(ACTIVE), unknown)).order_by(JobRow.seq))
            return [JobRecord.of(r) for r in rows]

    @_noted
    def new_since(self, seq: int, limit: int) -> list[JobRecord]:
        """Jobs accepted after ``seq``, in acceptance order, at most ``limit`` of them: the scheduler reads what
        API worker processes accepted (rows are committed in ``seq`` order, :mod:`frenzy_opt.service.groupcommit`,
        so none appears later below a ``seq`` already read)."""
        with self.engine.connect() as conn:
            rows = conn.execute(_NEW_SINCE, {"b_seq": seq, "b_limit": limit}).mappings().all()
            return [job_record(dict(row)) for row in rows]

    @_noted
    def last_seq(self) -> int:
        """The ``seq`` of the last job accepted (0 for an empty store)."""
        with self.engine.connect() as conn:
            return int(conn.scalar(select(func.max(_JOBS.c.seq))) or 0)
