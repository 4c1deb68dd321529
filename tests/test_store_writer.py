"""One writer per job store, and a writer that lost the store steps down (issue 23, item 3).

SQLite: the lock is the database file's own (device and inode): a symlink, a hard link, no sibling lock file
to delete. PostgreSQL: an advisory lock plus a lease with a fencing generation: a restart of the database
server or ``pg_terminate_backend`` of the lock's session never leaves two servers scheduling.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from factories import simulated_service
from fastapi.testclient import TestClient
from pgserver import PostgresServer
from sqlalchemy import text, update

from frenzy_opt.api.app import create_app
from frenzy_opt.service.store import Store, StoreFenced, StoreInUse, StoreRefused
from frenzy_opt.service.writer import LEASE_S, WRITER

LONG = {"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 512, "train_steps": 100_000}}
ROOT = Path(__file__).resolve().parents[1]


def _other_process_takes(url: str) -> subprocess.CompletedProcess[str]:
    """Another process opens the store and takes its writer lock (what a second ``frenzy serve`` does)."""
    code = "import sys; from frenzy_opt.service.store import Store; Store(sys.argv[1]).acquire_writer(); print('ok')"
    return subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.parametrize("alias", ["symlink", "hardlink", "itself"])
def test_a_second_writer_on_the_same_sqlite_file_is_refused_whatever_its_path(tmp_path: Path, alias: str) -> None:
    path = tmp_path / "jobs.db"
    first = Store(f"sqlite:///{path}")
    first.acquire_writer()
    other = tmp_path / "elsewhere" / "other-name.db"
    other.parent.mkdir()
    if alias == "symlink":
        other.symlink_to(path)
    elif alias == "hardlink":
        os.link(path, other)
    else:
        other = path
    assert not list(tmp_path.glob("*.lock"))  # no sibling lock file that could be deleted
    taken = _other_process_takes(f"sqlite:///{other}")
    if alias == "hardlink":  # refused before it opens the file: two names, two write-ahead logs, corruption
        assert taken.returncode != 0 and "2 hard links" in taken.stderr, taken.stderr[-2000:]
        with pytest.raises(StoreRefused, match="hard links"):
            Store(f"sqlite:///{other}")
        first.close()
        return
    assert taken.returncode != 0 and "in use by another frenzy serve" in taken.stderr, taken.stderr[-2000:]
    assert f"pid {os.getpid()}" in taken.stderr  # it names the holder
    second = Store(f"sqlite:///{other}")  # and in this process too
    with pytest.raises(StoreInUse):
        second.acquire_writer()
    first.close()
    second.acquire_writer()  # released with the first
    second.close()
    assert _other_process_takes(f"sqlite:///{other}").returncode == 0


def test_a_killed_writer_leaves_no_stale_sqlite_lock(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    Store(url).close()
    code = "import sys, time; from frenzy_opt.service.store import Store; Store(sys.argv[1]).acquire_writer(); "
    code += "print('held', flush=True); time.sleep(600)"
    holder = subprocess.Popen([sys.executable, "-c", code, url], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert _other_process_takes(url).returncode != 0
    finally:
        holder.kill()
        holder.wait(10)
    assert _other_process_takes(url).returncode == 0


# --- PostgreSQL -----------------------------------------------------------------------------------------


@pytest.fixture
def pg(postgres_server: PostgresServer) -> PostgresServer:
    return postgres_server


@contextmanager
def _serving(url: str) -> Iterator[TestClient]:
    with TestClient(create_app(simulated_service(url, 1.0, decision_wait_s=5.0))) as client:
        yield client


def _until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _lock_sessions(url: str) -> int:
    """Sessions that hold an advisory lock."""
    admin = Store(url)
    try:
        with admin.engine.connect() as conn:
            return int(conn.execute(text(LOCKS.replace("pid", "count(*)"))).scalar() or 0)
    finally:
        admin.close()


LOCKS = "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"


def _terminate_lock_session(url: str) -> int:
    """``pg_terminate_backend`` of every session that holds an advisory lock; how many."""
    admin = Store(url)
    try:
        with admin.engine.begin() as conn:
            pids = [row[0] for row in conn.execute(text(LOCKS))]
            for pid in pids:
                conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        return len(pids)
    finally:
        admin.close()


def test_a_writer_whose_generation_was_taken_is_fenced_and_steps_down(pg: PostgresServer) -> None:
    """Deterministic fencing: a successor's claim (the generation bumped) makes the first server's next write
    fail, and its loop cancel every run it started, write nothing more and stop; healthz says why, with no
    Retry-After (no retry clears it)."""
    url = pg.new_database()
    with _serving(url) as client:
        job = client.post("/v1/jobs", json=LONG).json()
        assert job["state"] == "running"
        service = client.app.state.service  # type: ignore[attr-defined]
        with service.store.engine.begin() as conn:  # what a successor's claim does
            conn.execute(update(WRITER).where(WRITER.c.id == 1).values(generation=WRITER.c.generation + 1))
        refused = client.post("/v1/jobs", json=LONG)
        assert refused.status_code == 503 and "took over" in refused.json()["detail"]
        assert "retry-after" not in refused.headers
        _until(lambda: not service.orchestrator.alive(), 10, "the loop to step down")
        assert service.orchestrator.stepped_down and service.config.executor.running() == set()
        health = client.get("/healthz")
        assert health.status_code == 503 and "took over" in health.json()["detail"]
        assert "retry-after" not in health.headers
        with pytest.raises(StoreFenced):
            service.store.transition(job["id"], "failed", "a late write of the old server")
        after = client.get(f"/v1/jobs/{job['id']}").json()
        assert after["state"] == "running"  # the fenced server changed nothing


@pytest.mark.slow
def test_a_postgresql_restart_keeps_one_writer(pg: PostgresServer) -> None:
    """The lock's session dies with the server; the holder takes it again, keeps its generation and goes on
    scheduling, and a second server is refused."""
    url = pg.new_database()
    with _serving(url) as client:
        first = client.post("/v1/jobs", json=LONG).json()
        assert first["state"] == "running"
        pg.restart()
        service = client.app.state.service  # type: ignore[attr-defined]

        def writes_again() -> bool:
            try:
                return client.post("/v1/jobs", json=LONG).status_code == 202 and client.get("/healthz").is_success
            except Exception:
                return False

        _until(writes_again, 30, "the service to write again after the restart")
        _until(lambda: _lock_sessions(url) == 1, 10, "the holder to take its lock again (next heartbeat)")
        assert service.orchestrator.alive() and not service.store.broken
        with pytest.raises(StoreInUse), TestClient(create_app(simulated_service(url, 1.0))):
            pass
        assert client.get(f"/v1/jobs/{first['id']}").json()["state"] == "running"


@pytest.mark.slow
def test_a_terminated_lock_session_never_leaves_two_servers_scheduling(pg: PostgresServer) -> None:
    """``pg_terminate_backend`` of the first server's lock session, then a second server starts at once:
    either the first took its lock back first (the second is refused), or the second waits out the first's
    lease while the first notices and steps down (cancelling its runs), then takes over and relaunches the
    jobs as moves. Never both scheduling: GPUs are never double-booked."""
    url = pg.new_database()
    with _serving(url) as client:
        jobs = [client.post("/v1/jobs", json=LONG).json() for _ in range(3)]
        ran = [j["id"] for j in jobs if j["state"] == "running"]
        assert ran
        first = client.app.state.service  # type: ignore[attr-defined]
        assert _terminate_lock_session(url) == 1
        second_app = create_app(simulated_service(url, 1.0, decision_wait_s=5.0))
        started = time.monotonic()
        try:
            second = TestClient(second_app).__enter__()
        except StoreInUse:
            assert first.orchestrator.alive() and client.get("/healthz").status_code == 200
            return
        try:
            waited = time.monotonic() - started
            assert waited >= LEASE_S - 2.0  # it waited for the first's lease to lapse
            assert not first.orchestrator.alive() and first.orchestrator.stepped_down
            assert first.config.executor.running() == set()  # the first's runs were cancelled
            assert client.get("/healthz").status_code == 503
            _until(lambda: second.get(f"/v1/jobs/{ran[0]}").json()["state"] == "running", 20, "a relaunch")
            used = sum(t["used"] for t in second.get("/v1/cluster").json()["gpu_types"].values())
            assert used <= first.config.cluster.num_gpus
            for job_id in ran:  # lost with the first server: a move each, no failure
                body = second.get(f"/v1/jobs/{job_id}").json()
                assert body["moves"] == 1 and body["failures"] == 0 and body["state"] in ("queued", "running")
        finally:
            second.__exit__(None, None, None)


def test_a_waiting_successor_takes_over_once_the_lease_lapses(pg: PostgresServer) -> None:
    """A lease renewed moments ago (a predecessor killed with -9 leaves it so) is waited out, not ignored."""
    url = pg.new_database()
    holder = Store(url)
    holder.acquire_writer()
    holder._closed.set()  # no more heartbeats: the process is gone but its lease is fresh
    assert _terminate_lock_session(url) == 1
    successor = Store(url)
    done = threading.Event()
    started = time.monotonic()

    def take() -> None:
        successor.acquire_writer()
        done.set()

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    assert not done.wait(LEASE_S / 2)  # still waiting half-way through the lease
    assert done.wait(LEASE_S + 10)
    assert time.monotonic() - started >= LEASE_S - 1.5
    with pytest.raises(StoreFenced):  # the old one's writes are fenced now
        holder.transition("nobody", "failed", "late")
    successor.close()
    holder.close()
