"""Opening a job store's database (:class:`Database`, what :class:`frenzy_opt.service.store.Store` stands on): the
SQLAlchemy engine with one busy timeout (SQLite's pragmas: WAL, ``busy_timeout``; PostgreSQL's
``lock_timeout``), and the checks at start.

Integrity and shape: at start a SQLite file must pass ``PRAGMA quick_check`` (:class:`StoreCorrupt`), a database
with a ``jobs`` table of another shape is refused naming the columns (:class:`StoreSchema`; the columns added
since the first release are added), and a store that does not exist — a SQLite file missing, as when a volume is
not mounted, or a database without the tables — is refused unless the caller asks to create it
(:class:`StoreMissing`). A SQLite file with several hard links is refused (:class:`StoreRefused`). The file's
identity (device and inode) is kept, so that :meth:`frenzy_opt.service.health.StoreHealth.file_problem` can
tell when it was deleted or replaced while the service runs.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from sqlalchemy import create_engine, event, inspect, select
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError

from frenzy_opt.service.schema import (
    ADDED_COLUMNS,
    Base,
    StoreCorrupt,
    StoreMissing,
    StoreRefused,
    StoreSchema,
)
from frenzy_opt.service.writer import ensure_row

log = logging.getLogger("frenzy_opt.service.store")
"""Every part of the store logs as the store (one logger to configure, whichever module writes)."""

BUSY_TIMEOUT_S = 30.0
"""How long a write waits for a lock held by another connection before it fails (SQLite's ``busy_timeout``,
https://www.sqlite.org/c3ref/busy_timeout.html; PostgreSQL's ``lock_timeout``,
https://www.postgresql.org/docs/15/runtime-config-client.html)."""


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


def file_identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


class Database:
    """A job store's database, opened and checked (module docstring)."""

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
            self._identity = file_identity(self.path)

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

    def ping(self) -> None:
        """Raise if the database does not answer."""
        with self.engine.connect() as conn:
            conn.execute(select(1))
