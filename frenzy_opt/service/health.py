"""A job store's health and guarded writes (:class:`StoreHealth`, what :class:`frenzy_opt.service.store.Store`
writes through): the writer lock, faults noted and cleared, write transactions that fail fast while the store is
at fault, and the watch thread.

- **One writer, fenced.** A service takes the store's writer lock before it recovers
  (:meth:`StoreHealth.acquire_writer`). SQLite: an exclusive ``flock`` on the database file itself (its device
  and inode), so a symlink, a hard link or a deleted sibling file cannot let a second server in; the operating
  system drops it when the holder dies. PostgreSQL: a session advisory lock plus a lease row (``frenzy_writer``:
  a generation number taken at start and renewed every :data:`HEARTBEAT_S`). Every write transaction checks the
  generation (``FOR SHARE``), so a server whose lock session was dropped (a server restart,
  ``pg_terminate_backend``, an idle-session kill) and that another server replaced can no longer write: it is
  fenced (:class:`StoreFenced`) and steps down. A new server that finds the advisory lock free but the lease
  fresh waits for it to lapse (:data:`frenzy_opt.service.writer.LEASE_S`), so a live predecessor notices first.
  A second ``frenzy serve`` on a database another one holds fails with :class:`StoreInUse` before it touches a
  row (:mod:`frenzy_opt.service.writer`).
- **Busy, full, broken.** One busy timeout (:data:`frenzy_opt.service.database.BUSY_TIMEOUT_S`, SQLite's
  ``busy_timeout`` and PostgreSQL's ``lock_timeout``). A store call that fails with one of
  :data:`frenzy_opt.service.faults.STORE_FAULTS` sets :attr:`StoreHealth.fault`: from then on writes fail fast
  (:class:`StoreUnavailable`, the API's 503) until a background write probe succeeds (every
  :data:`PROBE_INTERVAL_S`); a write that has waited longer than :data:`PROBE_TIMEOUT_S` for a lock sets it too
  when :meth:`StoreHealth.health` looks. A malformed database page found while serving is permanent
  (:attr:`StoreHealth.broken`): no probe clears it. :meth:`StoreHealth.health` says when the file was deleted or
  replaced while the service runs, and every write refuses to go on then (:class:`StoreUnavailable`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from frenzy_opt.service.database import BUSY_TIMEOUT_S, Database, file_identity, log
from frenzy_opt.service.faults import describe_fault, is_permanent_fault, is_store_fault
from frenzy_opt.service.schema import StoreFenced, StoreUnavailable
from frenzy_opt.service.writer import HEARTBEAT_S, WRITER, FileLock, Lease

PROBE_INTERVAL_S = 0.5
"""How often a store at fault is probed with a real write (:meth:`Store.probe`)."""
PROBE_TIMEOUT_S = 1.0
"""How long a probe waits for a lock."""
STALL_S = 5.0
"""A write that has waited this long for the database sets the fault, so later requests fail fast instead of
queueing behind it for the whole busy timeout."""


class StoreHealth(Database):
    """The writer lock, faults and guarded writes of a job store (module docstring)."""

    def __init__(self, url: str, *, busy_timeout_s: float = BUSY_TIMEOUT_S, create: bool = True) -> None:
        super().__init__(url, busy_timeout_s=busy_timeout_s, create=create)
        self._write = threading.Lock()
        """Serialises this process's writes: acceptance order (``seq``), and no two of its own transactions
        wait on each other in SQLite's busy handler (which sleeps in steps of up to 100 ms: the tail of
        submission latency under concurrency); other processes still meet the busy timeout."""
        self._writing_since: float | None = None
        """When the write under way started (time.monotonic()), None when none is."""
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

    # --- health ---------------------------------------------------------------------------------------------

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
        now = file_identity(self.path)
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
