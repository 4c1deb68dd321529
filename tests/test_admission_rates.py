"""Issue 27: a submission is acknowledged once stored (the decision follows; ``?wait`` asks for it), the inserts
of concurrent submissions share a transaction (group commit), the scheduler reads rows other processes wrote
(its intake, for ``frenzy serve --workers N``), and no acknowledged job is lost to a kill -9 — on SQLite and
PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import simulated_service
from fastapi.testclient import TestClient
from sqlalchemy.exc import IntegrityError

from frenzy_opt.api.app import create_app
from frenzy_opt.core.machine import free_port
from frenzy_opt.launch.executors.simulated import SimulatedExecutor
from frenzy_opt.planning.scenario import load_cluster_ref
from frenzy_opt.service.jobs import new_job_id
from frenzy_opt.service.orchestrator import Orchestrator
from frenzy_opt.service.records import job_values
from frenzy_opt.service.store import Store

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"model": "gpt3-125m", "training": {"seq_len": 1024, "global_batch_size": 32, "train_steps": 50}}


def _values(tenant: str = "t", key: str | None = None) -> dict[str, Any]:
    return job_values(
        job_id=new_job_id(),
        tenant=tenant,
        name="j",
        spec=SMALL,
        request_hash="h",
        idempotency_key=key,
        max_retries=0,
        weight=1.0,
        predicted=None,
    )


def _state_within(client: TestClient, job_id: str, wanted: set[str], timeout_s: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        if job["state"] in wanted or time.monotonic() > deadline:
            return job
        time.sleep(0.02)


def test_a_submission_is_acknowledged_queued_and_decided_after(db_url: str) -> None:
    with TestClient(create_app(simulated_service(db_url, 1e9))) as client:
        client.post("/v1/jobs", json=SMALL, params={"wait": 30})  # the shape's plan search, out of the way
        answer = client.post("/v1/jobs", json=SMALL)
        assert answer.status_code == 202
        job = answer.json()
        assert job["state"] == "queued" and job["plan"] is None and job["reason"] == "accepted"
        assert {"queue_position", "estimated_start_in_s", "waiting_for"} <= set(job)
        later = _state_within(client, job["id"], {"running", "succeeded"})
        assert later["state"] in ("running", "succeeded") and later["plan"] is not None


def test_wait_gives_the_first_decision_in_the_answer(tmp_path: Path) -> None:
    with TestClient(create_app(simulated_service(f"sqlite:///{tmp_path / 'j.db'}", 1.0))) as client:
        job = client.post("/v1/jobs", json=SMALL, params={"wait": 30}).json()
        assert job["state"] == "running" and job["plan"]["num_gpus"] >= 1


@pytest.mark.parametrize("wait", ["-1", "61", "nan", "soon"])
def test_wait_is_bounded_and_named(tmp_path: Path, wait: str) -> None:
    with TestClient(create_app(simulated_service(f"sqlite:///{tmp_path / 'j.db'}", 1e9))) as client:
        answer = client.post("/v1/jobs", json=SMALL, params={"wait": wait})
        assert answer.status_code == 422
        assert answer.json()["detail"][0]["loc"] == ["query", "wait"]
        assert client.get("/v1/jobs").json()["total"] == 0  # nothing stored


def _held(store: Store, rows: list[dict[str, Any]]) -> list[Future[int]]:
    """Queue ``rows`` while the store's write lock is held (a commit under way), then let them go."""
    with store._write:  # the committer waits behind it, as behind a slow commit
        futures = [store.accept(row) for row in rows]
        time.sleep(0.2)  # the committer takes the first row and waits for the lock; the rest queue up
    return futures


def test_concurrent_inserts_share_a_transaction_in_acceptance_order(db_url: str) -> None:
    store = Store(db_url)
    try:
        rows = [_values() for _ in range(40)]
        seqs = [f.result(30) for f in _held(store, rows)]
        assert store._commits.committed == 40
        assert store._commits.transactions <= 2  # without group commit: 40
        assert seqs == sorted(seqs) and len(set(seqs)) == 40  # the queue's order, no seq twice
        assert [r.id for r in store.new_since(0, 100)] == [r["id"] for r in rows]
        assert all(len(store.events(r["id"])) == 1 for r in rows)  # each with its first event
    finally:
        store.close()


def test_a_reused_key_fails_alone_in_its_batch(db_url: str) -> None:
    store = Store(db_url)
    try:
        rows = [_values(key="same") if i in (3, 7) else _values(key=f"k{i}") for i in range(10)]
        futures = _held(store, rows)
        errors = [i for i, f in enumerate(futures) if isinstance(f.exception(30), IntegrityError)]
        assert errors == [7]  # the first of the two wins; the eight others are stored
        assert store.list_jobs(tenant=None, state=None, limit=50, offset=0)[1] == 9
    finally:
        store.close()


def test_the_intake_queues_rows_another_process_wrote_once_each(db_url: str) -> None:
    writer_side = Store(db_url)  # the API worker's store: inserts only, no writer lock
    try:
        early = [writer_side.add_job(**_kwargs()) for _ in range(3)]  # accepted before the scheduler starts
        orchestrator = Orchestrator(
            Store(db_url), load_cluster_ref("paper-3type"), SimulatedExecutor(time_scale=1e9), intake=True
        )
        orchestrator.start()
        try:
            late = [writer_side.add_job(**_kwargs()) for _ in range(5)]
            ids = [r.id for r in [*early, *late]]
            deadline = time.monotonic() + 30
            while not all(writer_side.get(i).state == "succeeded" for i in ids):  # type: ignore[union-attr]
                assert time.monotonic() < deadline, [writer_side.get(i) for i in ids]
                time.sleep(0.05)
            for job_id in ids:  # queued once, launched once
                assert [e.state for e in writer_side.events(job_id)] == ["queued", "scheduled", "running", "succeeded"]
        finally:
            orchestrator.stop()
            orchestrator.store.close()
    finally:
        writer_side.close()


def _kwargs() -> dict[str, Any]:
    return {
        "job_id": new_job_id(),
        "tenant": "t",
        "name": "j",
        "spec": SMALL,
        "request_hash": "h",
        "idempotency_key": None,
        "max_retries": 0,
        "weight": 1.0,
        "predicted": None,
    }


def _serve(db: str, port: int, workers: int, *, create: bool) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "frenzy_opt.cli", "serve", "--port", str(port), "--db", db]
    command += ["--time-scale", "1", "--workers", str(workers), *(["--create"] if create else [])]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _up(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the server exited"
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"no server at {url}")


def _burst(url: str, acknowledged: list[str], stop: threading.Event) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set():
            try:
                answer = client.post("/v1/jobs", json=SMALL)
            except httpx.HTTPError:
                return  # the server was killed: this request was never acknowledged
            if answer.status_code == 202:
                acknowledged.append(answer.json()["id"])


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_kill_minus_9_mid_burst_loses_no_acknowledged_job(db_url: str, workers: int) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _serve(db_url, port, workers, create=True)
    acknowledged: list[str] = []
    stop = threading.Event()
    try:
        _up(url, proc)
        httpx.post(f"{url}/v1/jobs", json=SMALL, params={"wait": 60}, timeout=90)  # the plan search first
        threads = [threading.Thread(target=_burst, args=(url, acknowledged, stop)) for _ in range(16)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        while len(acknowledged) < 300:  # mid-burst: every thread has a request in flight
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.01)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        stop.set()
    for thread in threads:
        thread.join(30)
    proc = _serve(db_url, port, workers, create=False)
    try:
        _up(url, proc)
        ids: list[str] = []
        with httpx.Client(base_url=url, timeout=60) as client:
            offset: int | None = 0
            while offset is not None:
                page = client.get("/v1/jobs", params={"limit": 500, "offset": offset}).json()
                ids += [item["id"] for item in page["items"]]
                offset = page["next_offset"]
        assert len(ids) == len(set(ids))  # nothing stored twice
        assert set(acknowledged) <= set(ids), len(set(acknowledged) - set(ids))  # every acknowledged job
        assert len(acknowledged) >= 300
    finally:
        proc.terminate()
        proc.wait(30)
