"""What counts as a job store's fault: an error of the database rather than of the request (a locked or full
SQLite file, a PostgreSQL server gone), one no retry clears, and a fault in one line. The store
(:mod:`frenzy_opt.service.health`), the orchestrator's loop and the API tell faults from other errors here."""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, IntegrityError

from frenzy_opt.service.schema import StoreFenced, StoreUnavailable

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
