"""One writer per job store, and a writer that lost the store knows it (:mod:`frenzy_opt.service.store`).

- **SQLite** (:class:`FileLock`): an exclusive ``flock`` on the database file itself, keyed by its device and
  inode, so a symlink or a hard link to the file is the same lock, and there is no sibling lock file to delete.
  The kernel drops it when the holder dies. One descriptor per file and process is kept open for as long as a
  store of this process has the file open: closing any descriptor of a file drops every POSIX lock the process
  holds on it, SQLite's own included (https://www.sqlite.org/howtocorrupt.html, section 2.2), so it is closed
  only after the last engine on that file is disposed. Two stores of one process on one file exclude each other
  too (``flock`` alone would not: one descriptor, one lock).
- **PostgreSQL** (:class:`Lease`): a session advisory lock says "a server is here"; a lease row
  (``frenzy_writer``) with a generation number says which one. The holder renews the row every
  :data:`HEARTBEAT_S` and checks its lock session: a session dropped by a server restart,
  ``pg_terminate_backend`` or an idle-session kill is taken again when it can be, and when another server took
  the lock meanwhile, this one is fenced. Every write transaction reads the generation ``FOR SHARE``
  (:meth:`Lease.fence`): once a successor has bumped it, the old holder's writes fail with
  :class:`StoreFenced`. A new server that finds the advisory lock free but the lease renewed less than
  :data:`LEASE_S` ago waits for it to lapse: a live predecessor notices within a heartbeat that the lock is
  gone and steps down (cancels its runs) before the successor recovers and relaunches them.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
import zlib
from dataclasses import dataclass

from sqlalchemy import Float, Integer, Table, Text, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Mapped, mapped_column

from frenzy_opt.service.schema import Base, StoreFenced, StoreInUse

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
"""How often a PostgreSQL writer renews its lease and checks its advisory-lock session."""
LEASE_S = 8.0
"""How long a lease not renewed stays its holder's: eight missed heartbeats. A new server that finds the
advisory lock free waits this long after the last renewal before it takes over (leases: Gray and Cheriton,
"Leases: an efficient fault-tolerant mechanism for distributed file cache consistency", SOSP 1989)."""
LOCK_KEY = zlib.crc32(b"frenzy-opt writer") & 0x7FFFFFFF
"""The advisory lock's key (any 64-bit number the application picks:
https://www.postgresql.org/docs/15/explicit-locking.html#ADVISORY-LOCKS)."""


class WriterRow(Base):
    """The one writer's lease (module docstring): a single row, ``id`` 1."""

    __tablename__ = "frenzy_writer"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    generation: Mapped[int] = mapped_column(Integer, default=0)
    holder: Mapped[str] = mapped_column(Text, default="")
    renewed_at: Mapped[float] = mapped_column(Float, default=0.0)
    """Seconds since the epoch by the database's clock; 0 once released."""
    probed_at: Mapped[float] = mapped_column(Float, default=0.0)
    """The last write probe of a store at fault (:meth:`frenzy_opt.service.health.StoreHealth.probe`)."""


WRITER: Table = WriterRow.__table__  # type: ignore[assignment]  # a declarative class's table is a Table


def holder_text() -> str:
    return f"pid {os.getpid()} on {os.uname().nodename}, since {time.strftime('%Y-%m-%d %H:%M:%S')}"


def ensure_row(engine: Engine) -> None:
    """The lease row exists (a new store, or one made before it existed)."""
    with engine.begin() as conn:
        if conn.execute(select(WRITER.c.id).where(WRITER.c.id == 1)).first() is not None:
            return
        try:
            with conn.begin_nested():
                conn.execute(WRITER.insert().values(id=1, generation=0, holder="", renewed_at=0.0, probed_at=0.0))
        except IntegrityError:  # another process made it first
            pass


def holder_of(engine: Engine) -> str:
    """Who holds the store, as the lease row says ("unknown" if it cannot be read)."""
    try:
        with engine.connect() as conn:
            return str(conn.execute(select(WRITER.c.holder).where(WRITER.c.id == 1)).scalar() or "unknown")
    except DBAPIError:
        return "unknown"


def _claim(engine: Engine) -> int:
    """Take the lease: the next generation, this process as holder; the generation."""
    with engine.begin() as conn:
        row = conn.execute(select(WRITER.c.generation).where(WRITER.c.id == 1).with_for_update()).one()
        generation = int(row.generation) + 1
        conn.execute(
            update(WRITER)
            .where(WRITER.c.id == 1)
            .values(generation=generation, holder=holder_text(), renewed_at=db_now(conn))
        )
    return generation


def db_now(conn: Connection) -> float:
    """Seconds since the epoch by the database server's clock (PostgreSQL), or this machine's (SQLite: the
    same machine): leases compare times of two servers, which need one clock."""
    if conn.dialect.name == "postgresql":
        return float(conn.exec_driver_sql("SELECT EXTRACT(EPOCH FROM clock_timestamp())").scalar() or 0.0)
    return time.time()


@dataclass
class _OpenFile:
    fd: int
    users: int = 0
    holder: object | None = None


_FILES: dict[tuple[int, int], _OpenFile] = {}
_FILES_GUARD = threading.Lock()


class FileLock:
    """The SQLite writer lock (module docstring)."""

    def __init__(self, path: str, engine: Engine) -> None:
        self.path, self.engine = path, engine
        st = os.stat(path)
        self.key = (st.st_dev, st.st_ino)
        self.registered = False
        self.held = False
        self.generation: int | None = None
        with _FILES_GUARD:
            self._entry()

    def _entry(self) -> _OpenFile:
        """This file's descriptor, opened (again, after :meth:`close`) when needed (under ``_FILES_GUARD``)."""
        entry = _FILES.get(self.key)
        if entry is None:
            entry = _FILES[self.key] = _OpenFile(os.open(self.path, os.O_RDONLY | os.O_CLOEXEC))
        if not self.registered:
            entry.users += 1
            self.registered = True
        return entry

    def acquire(self) -> None:
        """Take the lock; :class:`StoreInUse` if another service (or store of this process) holds it."""
        with _FILES_GUARD:
            entry = self._entry()
            taken = entry.holder is not None and entry.holder is not self
            if not taken:
                try:
                    fcntl.flock(entry.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    taken = True
            if not taken:
                entry.holder = self
        if taken:
            raise StoreInUse(
                f"{self.path} is in use by another frenzy serve ({holder_of(self.engine)}): stop it, or give this "
                "one another --db"
            )
        self.held = True
        self.generation = _claim(self.engine)

    def release(self) -> None:
        with _FILES_GUARD:
            entry = _FILES.get(self.key)
            if self.held and entry is not None and entry.holder is self:
                fcntl.flock(entry.fd, fcntl.LOCK_UN)
                entry.holder = None
        self.held = False

    def close(self) -> None:
        """After the store's engine is disposed: the descriptor goes with the last store on the file."""
        self.release()
        with _FILES_GUARD:
            entry = _FILES.get(self.key)
            if entry is None or not self.registered:
                return
            self.registered = False
            entry.users -= 1
            if entry.users <= 0:
                os.close(entry.fd)
                del _FILES[self.key]


class Lease:
    """The PostgreSQL writer lock and its fencing token (module docstring)."""

    def __init__(self, engine: Engine, where: str) -> None:
        self.engine, self.where = engine, where
        self.session: Connection | None = None
        """The connection whose session holds the advisory lock."""
        self.generation: int | None = None

    def _try_lock(self) -> Connection | None:
        conn = self.engine.connect()
        if not conn.exec_driver_sql(f"SELECT pg_try_advisory_lock({LOCK_KEY})").scalar():
            conn.close()
            return None
        conn.commit()
        return conn

    def acquire(self) -> None:
        """Take the advisory lock, wait out a predecessor's lease, then take the next generation."""
        session = self._try_lock()
        if session is None:
            raise StoreInUse(
                f"{self.where} is in use by another frenzy serve ({holder_of(self.engine)}): stop it, or give "
                "this one another --db"
            )
        try:
            self._wait_for_lapse()
            self.generation = _claim(self.engine)
        except BaseException:
            session.close()
            raise
        self.session = session

    def _wait_for_lapse(self) -> None:
        first: float | None = None
        while True:
            with self.engine.connect() as conn:
                row = conn.execute(select(WRITER.c.holder, WRITER.c.renewed_at).where(WRITER.c.id == 1)).one()
                left = float(row.renewed_at) + LEASE_S - db_now(conn)
            if row.renewed_at <= 0 or left <= 0:
                return
            if first is None:
                first = float(row.renewed_at)
                log.warning(
                    "store: the writer lock is free but %s renewed its lease %.1f s ago: waiting up to %.1f s for "
                    "it to lapse",
                    row.holder,
                    LEASE_S - left,
                    left,
                )
            elif float(row.renewed_at) > first + 3 * LEASE_S:
                raise StoreInUse(f"{self.where}: {row.holder} keeps renewing its lease without the writer lock")
            time.sleep(min(left, HEARTBEAT_S / 2))

    def fence(self, conn: Connection) -> None:
        """Inside a write transaction: :class:`StoreFenced` unless this server's generation is the current one.
        ``FOR SHARE`` makes a successor's claim wait for the transactions already past this check."""
        if self.generation is None:
            return
        current = conn.execute(select(WRITER.c.generation).where(WRITER.c.id == 1).with_for_update(read=True)).scalar()
        if current != self.generation:
            raise StoreFenced(self._taken_over(current))

    def _taken_over(self, current: object) -> str:
        return (
            f"another frenzy serve took over {self.where} (generation {current}, this server's {self.generation}): "
            "this server no longer writes or schedules; restart it only after stopping the other"
        )

    def beat(self) -> None:
        """One heartbeat: the lock session is alive (or taken again), and the lease renewed. Raises
        :class:`StoreFenced` once another server holds the store; a database error when it does not answer."""
        if self.generation is None:
            return
        if self.session is not None:
            try:
                self.session.exec_driver_sql("SELECT 1").scalar()
                self.session.commit()
            except DBAPIError:
                log.warning("store: the writer lock's session of %s was dropped; taking it again", self.where)
                self._drop_session()
        if self.session is None:
            session = self._try_lock()  # a database error propagates: not reachable now, try again later
            if session is None:
                raise StoreFenced(
                    f"the writer lock of {self.where} was lost and another frenzy serve holds it now: this server "
                    "no longer writes or schedules"
                )
            self.session = session
        with self.engine.begin() as conn:
            renewed = conn.execute(
                update(WRITER)
                .where(WRITER.c.id == 1, WRITER.c.generation == self.generation)
                .values(renewed_at=db_now(conn))
            ).rowcount
            if renewed != 1:
                current = conn.execute(select(WRITER.c.generation).where(WRITER.c.id == 1)).scalar()
                raise StoreFenced(self._taken_over(current))

    def _drop_session(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            with contextlib.suppress(DBAPIError):
                session.invalidate()
                session.close()

    def release(self) -> None:
        """Give the lease back (a successor need not wait) and the lock with its session."""
        if self.generation is not None:
            try:
                with self.engine.begin() as conn:
                    conn.execute(
                        update(WRITER)
                        .where(WRITER.c.id == 1, WRITER.c.generation == self.generation)
                        .values(renewed_at=0.0)
                    )
            except DBAPIError as err:  # the lease lapses by itself
                log.warning("store: could not release the lease of %s: %s", self.where, err.__class__.__name__)
        self.generation = None
        session, self.session = self.session, None
        if session is not None:
            with contextlib.suppress(DBAPIError):
                session.close()  # the advisory lock goes with the session

    def close(self) -> None:
        self.release()
