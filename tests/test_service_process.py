"""The service as a real process on 127.0.0.1: uvicorn in a thread, ``frenzy serve`` killed with SIGKILL
mid-schedule and restarted on the same database (every accepted job found exactly once), and schemathesis
against the app's own OpenAPI under a memory limit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from frenzy_opt.api.server import background_server, build_config
from frenzy_opt.core.machine import free_port
from frenzy_opt.planning.scenario import load_cluster_ref

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"model": "gpt3-125m", "training": {"seq_len": 1024, "global_batch_size": 32, "train_steps": 50}}
MEDIUM = {"model": "gpt3-1.3b", "training": {"seq_len": 2048, "global_batch_size": 64, "train_steps": 2000}}


def test_a_real_uvicorn_server_on_loopback(tmp_path: Path) -> None:
    config = build_config(load_cluster_ref("paper-3type"), db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", time_scale=1e9)
    with background_server(config) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert url.startswith("http://127.0.0.1:")
        assert client.get("/healthz").json()["status"] == "ok"
        job = client.post("/v1/jobs", json=SMALL, headers={"Idempotency-Key": "k1"}).json()
        assert client.post("/v1/jobs", json=SMALL, headers={"Idempotency-Key": "k1"}).json()["id"] == job["id"]
        deadline = time.monotonic() + 20
        while client.get(f"/v1/jobs/{job['id']}").json()["state"] != "succeeded":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert "frenzy_decisions_total" in client.get("/metrics").text
        spec = client.get("/openapi.json").json()
        assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel", "/v1/plans", "/v1/cluster"} <= set(
            spec["paths"]
        )


def _serve(
    db: str, port: int, time_scale: float, stderr: Any = subprocess.DEVNULL, *, create: bool = True
) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "frenzy_opt.cli", "serve", "--port", str(port), "--db", db]
    command += ["--create"] if create else []
    command += ["--time-scale", str(time_scale)]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)


def _wait_up(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the server exited"
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"no server at {url}")


def _all_jobs(client: httpx.Client) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    offset: int | None = 0
    while offset is not None:
        page = client.get("/v1/jobs", params={"limit": 500, "offset": offset}).json()
        items += page["items"]
        offset = page["next_offset"]
    return items


@pytest.mark.slow
def test_kill_minus_9_mid_schedule_then_restart_finds_every_job_exactly_once(db_url: str) -> None:
    db = db_url
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # 200 cluster seconds per second: the 1.3 B jobs run for several seconds, so some are mid-run at the kill.
    proc = _serve(db, port, time_scale=200.0)
    accepted: list[str] = []
    try:
        _wait_up(url, proc)
        with httpx.Client(base_url=url, timeout=30) as client:
            for i in range(24):
                answer = client.post("/v1/jobs", json=SMALL if i % 3 else MEDIUM)
                assert answer.status_code == 202
                accepted.append(answer.json()["id"])
            states_before = {j["id"]: j["state"] for j in _all_jobs(client)}
        assert "running" in states_before.values()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    proc = _serve(db, port, time_scale=20000.0, create=False)  # the store exists: no --create
    try:
        _wait_up(url, proc)
        with httpx.Client(base_url=url, timeout=30) as client:
            deadline = time.monotonic() + 120
            while True:
                jobs = _all_jobs(client)
                if all(j["state"] in ("succeeded", "failed", "cancelled") for j in jobs) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            ids = [j["id"] for j in jobs]
            assert sorted(ids) == sorted(accepted)  # every accepted job, exactly once, nothing else
            assert {j["state"] for j in jobs} == {"succeeded"}
            was_running = [j for j, s in states_before.items() if s == "running"]
            for job_id in was_running:
                history = client.get(f"/v1/jobs/{job_id}").json()["history"]
                details = " ".join(e["detail"] for e in history)
                assert "lost on restart" in details or history[-1]["state"] == "succeeded"
            lost = [
                j
                for j in was_running
                if any("lost on restart" in e["detail"] for e in client.get(f"/v1/jobs/{j}").json()["history"])
            ]
            assert lost  # the kill really interrupted runs, and they were retried to success
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.mark.slow
def test_a_second_serve_on_the_same_database_exits_before_touching_it(db_url: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    first = _serve(db_url, port, time_scale=1.0)
    try:
        _wait_up(url, first)
        with httpx.Client(base_url=url, timeout=30) as client:
            job = client.post("/v1/jobs", json=MEDIUM, params={"wait": 30}).json()  # the decision in the answer
            assert job["state"] == "running"
            before = client.get(f"/v1/jobs/{job['id']}").json()["history"]
            # The same port too: the second fails at the writer lock, before recovery and before binding.
            second = _serve(db_url, port, time_scale=1.0, stderr=subprocess.PIPE)
            _, err = second.communicate(timeout=60)
            assert second.returncode != 0
            assert b"in use by another frenzy serve" in err, err.decode()[-2000:]
            after = client.get(f"/v1/jobs/{job['id']}").json()
            assert after["state"] == "running" and after["history"] == before
    finally:
        first.terminate()
        first.wait(20)


@pytest.mark.slow
def test_schemathesis_finds_no_server_error(tmp_path: Path) -> None:
    """Runs tests/fuzz_api.py in a child process limited to 4 GiB of address space."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            str(ROOT / "tests" / "fuzz_api.py"),
        ],
        cwd=tmp_path,
        preexec_fn=limit,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "FRENZY_FUZZ_DB": f"sqlite:///{tmp_path / 'fuzz.db'}"},
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
