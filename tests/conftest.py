"""Shared fixtures: the job-store backends (SQLite always, PostgreSQL where it is installed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pgserver import PostgresServer, missing  # tests/ is on sys.path (rootdir-less import)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One private PostgreSQL server per test session (per xdist worker); skipped with the reason when
    PostgreSQL or its driver is missing."""
    why = missing()
    if why is not None:
        pytest.skip(f"PostgreSQL tests skipped: {why}")
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty job database of each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'jobs.db'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.new_database()
