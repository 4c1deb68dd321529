"""Durable job state: SQLAlchemy over SQLite (WAL) by default, any SQLAlchemy URL (e.g. PostgreSQL) by choice.

Tables: ``jobs`` (one row per accepted job: tenant, spec, state, plan, placement, attempts, the reason it
waits or failed, predicted and measured figures) and ``job_events`` (every state change, in order). A job is
written once when it is accepted, in the same transaction as its first event, so a crash never leaves half a
job; the orchestrator is the only writer of state changes.

Sessions are opened where they are used (``with store.session() as s``) and closed at once: never held by
a request for its whole life (a session taken from a yield dependency exhausted the pool at 50 concurrent
requests in an earlier service).

Faults are explicit:

- **One writer, fenced.** A service takes the store's writer lock before it recovers (:meth:`Store.acquire_writer`).
  SQLite: an exclusive ``flock`` on the database file itself (its device and inode), so a symlink, a hard link
  or a deleted sibling file cannot let a second server in; the operating system drops it when the holder
  dies. PostgreSQL: a session advisory lock plus a lease row (``frenzy_writer``: a generation number taken at
  start and renewed every :data:`HEARTBEAT_S`). Every write transaction checks the generation (``FOR SHARE``),
  so a server whose lock session was dropped (a server restart, ``pg_terminate_backend``, an idle-session
  kill) and that another server replaced can no longer write: it is fenced (:class:`StoreFenced`) and steps
  down. A new server that finds the advisory lock free but the lease fresh waits for it to lapse
  (:data:`LEASE_S`), so a live predecessor notices first. A second ``frenzy serve`` on a database another one
  holds fails with :class:`StoreInUse` before it touches a row.
- **Integrity and shape.** At start a SQLite file must pass ``PRAGMA quick_check`` (:class:`StoreCorrupt`), a
  database with a ``jobs`` table of another shape is refused naming the columns (:class:`StoreSchema`; the
  columns added since the first release are added), and a store that does not exist — a SQLite file missing,
  as when a volume is not mounted, or a database without the tables — is refused unless the caller asks to
  create it (:class:`StoreMissing`). :meth:`Store.health` says when the file was deleted or replaced while the
  service runs, and every write refuses to go on then (:class:`StoreUnavailable`).
- **Busy, full, broken.** One busy timeout (:data:`BUSY_TIMEOUT_S`, SQLite's ``busy_timeout`` and PostgreSQL's
  ``lock_timeout``). A store call that fails with one of :data:`STORE_FAULTS` sets :attr:`Store.fault`: from
  then on writes fail fast (:class:`StoreUnavailable`, the API's 503) until a background write probe succeeds
  (every :data:`PROBE_INTERVAL_S`); a write that has waited longer than :data:`PROBE_TIMEOUT_S` for a lock sets
  it too when :meth:`Store.health` looks. A malformed database page found while serving is permanent
  (:attr:`Store.broken`): no probe clears it.
- **Bad rows.** A row whose JSON cannot be read loads with the problem listed in :attr:`JobRecord.problems`
  (and the unreadable field empty) instead of raising, so one bad row cannot stop a listing or a start-up;
  the orchestrator quarantines such rows (fails them with the reason).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy import (
    Table,
    bindparam,
    create_engine,
    event,
    func,
    insert,
    inspect,
    not_,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from frenzy_opt.core.enums import ACTIVE_STATES, TERMINAL_STATES, JobState
from frenzy_opt.service.groupcommit import GroupCommit
from frenzy_opt.service.schema import (
    ADDED_COLUMNS,
    Base,
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
from frenzy_opt.service.writer import HEARTBEAT_S, WRITER, FileLock, Lease, ensure_row

__all__ = [
    "StoreCorrupt",
    "StoreFenced",
    "StoreInUse",
    "StoreMissing",
    "StoreRefused",
    "StoreSchema",
    "StoreUnavailable",
]

log = logging.getLogger(__name__)

BUSY_TIMEOUT_S = 30.0
"""How long a write waits for a lock held by another connection before it fails (SQLite's ``busy_timeout``,
https://www.sqlite.org/c3ref/busy_timeout.html; PostgreSQL's ``lock_timeout``,
https://www.postgresql.org/docs/15/runtime-config-client.html)."""
PROBE_INTERVAL_S = 0.5
"""How often a store at fault is probed with a real write (:meth:`Store.probe`)."""
PROBE_TIMEOUT_S = 1.0
"""How long a probe waits for a lock."""
STALL_S = 5.0
"""A write that has waited this long for the database sets the fault, so later requests fail fast instead of
queueing behind it for the whole busy timeout."""

STATES = tuple(JobState)
TERMINAL = TERMINAL_STATES
ACTIVE = ACTIVE_STATES


STORE_FAULTS: tuple[type[Exception], ...] = (StoreUnavailable, DBAPIError, OSError)
"""What a store call raises when the database, not the request, is at fault (a locked or full SQLite file, a
PostgreSQL server gone). :func:`is_store_fault` leaves out integrity errors: those are the request's."""


def is_store_fault(err: BaseException) -> bool:
    return isinstance(err, STORE_FAULTS) and not isinstance(err, IntegrityError)


def is_permanent_fault(err: BaseException) -> bool:
    """A fault no retry clears: a malformed page or a file that is no database (SQLite's SQLITE_CORRUPT and
    SQLITE_NOTADB, https://www.sqlite.org/rescode.html), a PostgreSQL data-corruption error (SQLSTATE class XX,
    https://www.postgresql.org/docs/15/errcodes-appendix.html), or a fenced writer."""
    if isinstance(err, StoreFenced):
        return True
    message = str(getattr(err, "orig", None) or err).lower()
    return any(word in message for word in ("malformed", "not a database", "data corrupted", "index corrupted"))


def describe_fault(err: BaseException) -> str:
    """A store error in one line: its class and the first line of its message (SQLAlchemy's run on with the
    statement and its parameters)."""
    message = str(err)
    return f"{err.__class__.__name__}: {message.splitlines()[0] if message else ''}"


# The hot paths' statements, built once (building a Core statement per call cost more than running it).
_JOBS: Table = JobRow.__table__  # type: ignore[assignment]  # a declarative class's table is a Table
_EVENTS: Table = EventRow.__table__  # type: ignore[assignment]
_GET = select(_JOBS).where(_JOBS.c.id == bindparam("b_id"))
_BY_KEY = select(_JOBS).where(_JOBS.c.tenant == bindparam("b_tenant"), _JOBS.c.idempotency_key == bindparam("b_key"))
_UPDATE = update(_JOBS).where(_JOBS.c.id == bindparam("b_id"))
"""SET from the parameters' column names."""
_INSERT_EVENT = insert(_EVENTS)
_NEW_SINCE = select(_JOBS).where(_JOBS.c.seq > bindparam("b_seq")).order_by(_JOBS.c.seq).limit(bindparam("b_limit"))


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


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


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


class Store:
    """The job database. ``create=False``: refuse a store that does not exist yet (:class:`StoreMissing`)
    rather than start an empty one (``frenzy serve`` without ``--create``)."""

    def __init__(self, url: str, *, busy_timeout_s: float = BUSY_TIMEOUT_S, create: bool = True) -> None:
        self.url = url
        self.path = sqlite_path(url)
        self.backend = make_url(url).get_backend_name()
        self.where = self.path or make_url(url).render_as_string(hide_password=True)
        self.busy_timeout_s = busy_timeout_s
        if self.path is not None and not create and not os.path.exists(self.path):
            raise StoreMissing(
                f"{self.path} does not exist (a volume not mounted, or a typo?): give the path of the existing "
                "store, or pass --create to start a new, empty one there"
            )
        if self.path is not None and os.path.exists(self.path) and os.stat(self.path).st_nlink > 1:
            raise StoreRefused(
                f"{self.path} has {os.stat(self.path).st_nlink} hard links: SQLite keeps a write-ahead log per file "
                "name, and writes through two names corrupt the database (https://www.sqlite.org/howtocorrupt.html, "
                "section 2.5); remove the other links or copy the file"
            )
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
        self.verify(create=create)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write = threading.Lock()
        """Serialises this process's writes: acceptance order (``seq``), and no two of its own transactions
        wait on each other in SQLite's busy handler (which sleeps in steps of up to 100 ms: the tail of
        submission latency under concurrency); other processes still meet the busy timeout."""
        self._writing_since: float | None = None
        """When the write under way started (time.monotonic()), None when none is."""
        self._commits = GroupCommit(self.write)
        """The group commit of accepted jobs (its thread starts with the first)."""
        self._writer: FileLock | Lease | None = None
        if self.path is not None:
            self._writer = FileLock(self.path, self.engine)
        elif self.backend == "postgresql":
            self._writer = Lease(self.engine, self.where)
        self.held = False
        """Whether this store holds the writer lock (:meth:`acquire_writer`)."""
        self.fault: str | None = None
        """Why writes fail fast now (a store call failed with a fault; cleared by a successful probe)."""
        self.broken: str | None = None
        """A fault no probe clears: a damaged database, or another server took the store over."""
        self.fenced = False
        """Whether it broke because another server took the store over (this one must step down)."""
        self.on_broken: list[Callable[[str], None]] = []
        """Called (from the watch thread or a writer's thread) once the store broke."""
        self.stall_s = STALL_S
        self._closed = threading.Event()
        self._watch: threading.Thread | None = None
        self._watch_guard = threading.Lock()

    # --- integrity, shape, health -----------------------------------------------------------------------

    def verify(self, *, create: bool = True) -> None:
        """Check the database's shape and integrity; create missing tables (module docstring)."""
        try:
            names = set(inspect(self.engine).get_table_names())
            if "jobs" not in names and not create:
                raise StoreMissing(
                    f"{self.where} holds no frenzy-opt job store (no jobs table): give the right database, or pass "
                    "--create to start a new, empty store in it"
                )
            self._check_shape(names)
            Base.metadata.create_all(self.engine)
            ensure_row(self.engine)
            if self.backend == "sqlite":
                with self.engine.connect() as conn:
                    result = [str(r[0]) for r in conn.exec_driver_sql("PRAGMA quick_check")]
                if result != ["ok"]:
                    raise StoreCorrupt(f"{self.where} fails SQLite's integrity check: {'; '.join(result[:3])}")
        except DBAPIError as err:
            message = str(err.orig)
            if any(word in message for word in ("malformed", "not a database", "corrupt")):
                raise StoreCorrupt(
                    f"{self.where} is not a readable database ({message}): restore it from a backup"
                ) from err
            raise
        if self.path is not None:
            self._identity = _identity(self.path)

    def _check_shape(self, names: set[str]) -> None:
        """:class:`StoreSchema` when a table of ours lacks columns; adds the columns of :data:`ADDED_COLUMNS`."""
        inspector = inspect(self.engine)
        for name, table in Base.metadata.tables.items():
            if name not in names:
                continue
            have = {column["name"] for column in inspector.get_columns(name)}
            missing = [c.name for c in table.columns if c.name not in have]
            added = ADDED_COLUMNS.get(name, {})
            wrong = [c for c in missing if c not in added]
            if wrong:
                raise StoreSchema(
                    f"{self.where}: table {name} has columns {', '.join(sorted(have))} but lacks "
                    f"{', '.join(wrong)}: it is not a frenzy-opt job store; give another --db"
                )
            with self.engine.begin() as conn:
                for column in missing:
                    conn.exec_driver_sql(f"ALTER TABLE {name} ADD COLUMN {column} {added[column]}")
                    log.warning("store: added column %s.%s to %s", name, column, self.where)

    def health(self) -> str | None:
        """Why the store cannot serve now (None when it can): its file was deleted or replaced, it broke, a
        call failed with a fault no probe has cleared yet, a write has waited too long, or it does not
        answer."""
        problem = self.file_problem() or self.broken or self.fault or self._stalled()
        if problem is not None:
            return problem
        try:
            self.ping()
        except SQLAlchemyError as err:
            return f"the database does not answer: {describe_fault(err)}"
        return None

    def _stalled(self) -> str | None:
        """Why writes stall (a write has waited :attr:`stall_s` for the database): sets the fault, so later
        writes fail fast instead of queueing behind it, until a probe succeeds once it ended."""
        since = self._writing_since
        if since is None or time.monotonic() - since < self.stall_s:
            return None
        waited = time.monotonic() - since
        reason = f"a write has waited {waited:.0f} s for the database (a lock held by another connection?)"
        if self.fault is None:
            log.error("store: %s; writes fail fast until it ends", reason)
            self.fault = reason
            self._start_watch()
        return reason

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

    def refusal(self) -> str | None:
        """Why a write would fail at once now (None when it would be tried)."""
        return self.broken or self.file_problem() or self.fault

    def _note(self, err: BaseException) -> None:
        """A store call failed with a fault: writes fail fast until a probe succeeds (or for good)."""
        reason = describe_fault(err)
        if isinstance(err, StoreFenced):
            self._break(str(err), fenced=True)
            return
        if is_permanent_fault(err):
            self._break(
                f"the database is damaged ({reason}): this server neither writes nor schedules; restore the "
                "database from a backup and restart"
            )
            return
        if self.fault is None:
            log.error("store: %s; writes fail fast until a write probe succeeds", reason)
        self.fault = reason
        self._start_watch()

    def _break(self, reason: str, *, fenced: bool = False) -> None:
        if self.broken is not None:
            return
        self.fenced = fenced
        self.broken = reason
        log.error("store: %s", reason)
        for callback in self.on_broken:
            callback(reason)

    # --- the writer lock and the watch thread -----------------------------------------------------------

    def acquire_writer(self) -> None:
        """Take the writer lock (module docstring); :class:`StoreInUse` if another service holds it."""
        if self.held or self._writer is None:
            return
        self._closed.clear()  # a store closed before may serve again (an app's lifespan started again)
        self._writer.acquire()
        self.held = True
        self._start_watch()

    def release_writer(self) -> None:
        if self._writer is not None and self.held:
            self._writer.release()
        self.held = False

    def _start_watch(self) -> None:
        with self._watch_guard:
            if self._watch is None and not self._closed.is_set():
                self._watch = threading.Thread(target=self._watching, name="frenzy-store-watch", daemon=True)
                self._watch.start()

    def _watching(self) -> None:
        """Every :data:`PROBE_INTERVAL_S` while at fault, else every heartbeat: a stalled write sets the
        fault, a PostgreSQL writer renews its lease, a successful probe clears the fault."""
        while not self._closed.wait(PROBE_INTERVAL_S if self.fault else HEARTBEAT_S):
            if self.broken is not None:
                continue
            self._stalled()
            try:
                if self.held and isinstance(self._writer, Lease):
                    self._writer.beat()  # a write: it proves the store writable too
                    if self.fault is not None and self._writing_since is None:
                        self._cleared()
                elif self.fault is not None:
                    self.probe()
            except StoreFenced as err:
                self._break(str(err), fenced=True)
            except Exception as err:  # the database does not answer: try again next time
                if is_store_fault(err):
                    self._note(err)
                else:
                    log.exception("store: the watch thread's check failed")

    def probe(self) -> bool:
        """A real write with a short lock wait (:data:`PROBE_TIMEOUT_S`); clears the fault when it succeeds.
        False while another write of this process is under way (it says more than a probe would)."""
        if not self._write.acquire(timeout=PROBE_TIMEOUT_S):
            return False
        try:
            if self.file_problem() is not None:
                return False
            with self.engine.connect() as conn:
                try:
                    with conn.begin():
                        if self.backend == "sqlite":
                            conn.exec_driver_sql(f"PRAGMA busy_timeout={int(PROBE_TIMEOUT_S * 1000)}")
                        elif self.backend == "postgresql":
                            conn.exec_driver_sql(f"SET LOCAL lock_timeout = {int(PROBE_TIMEOUT_S * 1000)}")
                        self._fence(conn)
                        conn.execute(update(WRITER).where(WRITER.c.id == 1).values(probed_at=time.time()))
                finally:
                    if self.backend == "sqlite":
                        conn.exec_driver_sql(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
        except Exception as err:
            if not is_store_fault(err):
                raise
            self._note(err)
            return False
        finally:
            self._write.release()
        self._cleared()
        return True

    def _cleared(self) -> None:
        if self.fault is not None:
            log.warning("store: writes again after: %s", self.fault)
            self.fault = None

    def _fence(self, conn: Connection) -> None:
        if self.held and isinstance(self._writer, Lease):
            self._writer.fence(conn)

    @contextmanager
    def _writing(self) -> Iterator[Connection]:
        """One write transaction: refused at once while the store is at fault; a fault it meets is noted;
        a writer's generation is checked first (fencing)."""
        refusal = self.refusal()
        if refusal is not None:
            raise StoreFenced(refusal) if self.fenced else StoreUnavailable(refusal)
        if not self._write.acquire(timeout=self.stall_s):  # behind a write that waits for the database
            raise StoreUnavailable(self._stalled() or f"the store's writes have queued for over {self.stall_s:g} s")
        try:
            self._writing_since = time.monotonic()
            with self.engine.begin() as conn:
                self._fence(conn)
                yield conn
        except Exception as err:
            if is_store_fault(err):
                self._note(err)
            raise
        finally:
            self._writing_since = None
            self._write.release()

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
        return _record({**values, "seq": seq})

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

    def ping(self) -> None:
        """Raise if the database does not answer."""
        with self.engine.connect() as conn:
            conn.execute(select(1))

    @_noted
    def get(self, job_id: str) -> JobRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(_GET, {"b_id": job_id}).mappings().first()
            return None if row is None else _record(dict(row))

    @_noted
    def by_key(self, tenant: str, key: str) -> JobRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(_BY_KEY, {"b_tenant": tenant, "b_key": key}).mappings().first()
            return None if row is None else _record(dict(row))

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
            return [_record(dict(row)) for row in rows]

    @_noted
    def last_seq(self) -> int:
        """The ``seq`` of the last job accepted (0 for an empty store)."""
        with self.engine.connect() as conn:
            return int(conn.scalar(select(func.max(_JOBS.c.seq))) or 0)
