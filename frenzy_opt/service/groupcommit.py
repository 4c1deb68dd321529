"""Group commit of accepted jobs: the inserts of concurrent submissions share one transaction.

A submission is acknowledged once its job row and first event are committed (:mod:`frenzy_opt.service.store`).
Committing costs a round trip to the database and, on PostgreSQL, a WAL flush per transaction; when many
submissions arrive at once, one thread (:class:`GroupCommit`) takes every insert waiting at the moment it is
free and commits them together (the leader/follower scheme of database group commit: Helland et al., "Group
commit timers and high volume transaction systems", HPTS 1987; PostgreSQL's own ``commit_delay``). No insert
waits for a timer: a lone submission is committed at once; the batch grows only while the previous commit is
under way. Each submission's future completes after the commit that holds it, so an acknowledged job has the
same durability as before: SQLite in WAL mode survives a kill of the process once the commit returned
(https://www.sqlite.org/wal.html), PostgreSQL once the commit record is flushed.

Acceptance order (``seq``) is assigned inside the write transaction, from the database: under SQLite's write
lock (the first statement of the transaction is the insert), and on PostgreSQL under a transaction-level
advisory lock (:data:`SEQ_LOCK_KEY`), so API worker processes writing the same store keep one order, committed
in order; the scheduler reads new rows by it (:meth:`Store.new_since`).

An insert that breaks a constraint (the same ``Idempotency-Key`` posted twice at once) must not fail the
others of its batch: the batch is rolled back and its inserts are committed one at a time, the failing one
getting its :class:`~sqlalchemy.exc.IntegrityError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from sqlalchemy import Table, bindparam, func, insert, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from frenzy_opt.service.schema import EventRow, JobRow

log = logging.getLogger(__name__)

MAX_BATCH = 256
"""The most inserts one transaction carries (a design choice: past a few hundred rows a batch gains nothing
more per row, and it keeps the ``IN`` list that reads the order back far below SQLite's bound on parameters,
32,766: https://www.sqlite.org/limits.html)."""
SEQ_LOCK_KEY = zlib.crc32(b"frenzy-opt job seq") & 0x7FFFFFFF
"""PostgreSQL transaction advisory lock that serialises the assignment of ``seq`` across processes (any key the
application picks: https://www.postgresql.org/docs/15/explicit-locking.html#ADVISORY-LOCKS)."""

_JOBS: Table = JobRow.__table__  # type: ignore[assignment]  # a declarative class's table is a Table
_EVENTS: Table = EventRow.__table__  # type: ignore[assignment]
_NEXT_SEQ = select(func.coalesce(func.max(_JOBS.c.seq), 0) + 1).scalar_subquery()
_INSERT_JOB = insert(_JOBS).values(seq=_NEXT_SEQ)
_INSERT_EVENT = insert(_EVENTS)
_SEQ_OF = select(_JOBS.c.id, _JOBS.c.seq).where(_JOBS.c.id.in_(bindparam("b_ids", expanding=True)))

Row = dict[str, Any]
"""A job row's column values without ``seq`` (:meth:`frenzy_opt.service.store.Store.add_job`)."""
Waiting = Future[int] | asyncio.Future[int]
"""Who waits for an insert: a thread (a :class:`concurrent.futures.Future`) or an event loop."""


def insert_jobs(conn: Connection, rows: Sequence[Row]) -> dict[str, int]:
    """Insert job rows and their first events inside the caller's write transaction; the ``seq`` each got.
    The first statement writes (SQLite then holds the write lock: nobody can take the same ``seq``)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SEQ_LOCK_KEY})
    conn.execute(_INSERT_JOB, list(rows))  # one row at a time inside: each sees the seq of the one before
    events = [{"job_id": r["id"], "at": r["created_at"], "state": "queued", "detail": "accepted"} for r in rows]
    conn.execute(_INSERT_EVENT, events)
    return {str(r.id): int(r.seq) for r in conn.execute(_SEQ_OF, {"b_ids": [r["id"] for r in rows]})}


class GroupCommit:
    """One thread that commits the waiting inserts together (module docstring). ``write`` runs a function
    inside one write transaction of the store (:meth:`frenzy_opt.service.store.Store.write`)."""

    def __init__(self, write: Callable[[Callable[[Connection], dict[str, int]]], dict[str, int]]) -> None:
        self._write = write
        self._queue: queue.SimpleQueue[tuple[Row, Waiting] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()
        self.transactions = 0
        """Transactions committed (each carries one or more inserts)."""
        self.committed = 0
        """Inserts committed."""

    def add(self, row: Row) -> Future[int]:
        """Queue one job row; the future gives its ``seq`` once committed, or the error of the commit."""
        future: Future[int] = Future()
        self._queue.put((row, future))
        self._start()
        return future

    def add_async(self, row: Row) -> asyncio.Future[int]:
        """:meth:`add` for a coroutine on the running event loop: the futures of one batch are completed by
        one call into their loop (a wake-up of the loop per insert cost a system call each)."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.put((row, future))
        self._start()
        return future

    def _start(self) -> None:
        if self._thread is not None:
            return
        with self._guard:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="frenzy-group-commit", daemon=True)
                self._thread.start()

    def close(self, timeout_s: float = 10.0) -> None:
        """Commit what is queued, then stop the thread."""
        with self._guard:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            stop = False
            while len(batch) < MAX_BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            self._commit(batch)
            if stop:
                return

    def _commit(self, batch: list[tuple[Row, Waiting]]) -> None:
        try:
            seqs = self._write(lambda conn: insert_jobs(conn, [row for row, _ in batch]))
        except IntegrityError as err:
            if len(batch) > 1:  # one insert broke a constraint: the others must not fail with it
                for item in batch:
                    self._commit([item])
                return
            _complete([(batch[0][1], err)])
            return
        except Exception as err:  # a store fault: every submission of the batch answers it
            _complete([(future, err) for _, future in batch])
            return
        self.transactions += 1
        self.committed += len(batch)
        _complete([(future, seqs[row["id"]]) for row, future in batch])


def _complete(outcomes: list[tuple[Waiting, int | Exception]]) -> None:
    """Complete the waiting futures: a thread's at once, an event loop's by one call into each loop."""
    loops: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[int], int | Exception]]] = {}
    for future, outcome in outcomes:
        if isinstance(future, asyncio.Future):
            loops.setdefault(future.get_loop(), []).append((future, outcome))
        elif isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    for loop, items in loops.items():
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(_settle, items)


def _settle(items: list[tuple[asyncio.Future[int], int | Exception]]) -> None:
    """On the event loop: complete its futures of a batch (one a request gave up on stays cancelled)."""
    for future, outcome in items:
        if future.done():
            continue
        if isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
