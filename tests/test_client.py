"""The client commands (``frenzy submit|jobs|status|cancel|usage``) against the real app: tables and
``--json``, server and token resolution, and the errors a user sees when the server is down or refuses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from factories import simulated_service
from fastapi.testclient import TestClient

from frenzy_opt import client as client_module
from frenzy_opt.api.app import create_app
from frenzy_opt.cli import main
from frenzy_opt.client import Target, _where, parse_duration, resolve, usage_table

TOKEN_A, TOKEN_ADMIN = "token-team-a", "token-admin-1"
TENANTS = {"tokens": [{"token": TOKEN_A, "tenant": "team-a"}, {"token": TOKEN_ADMIN, "tenant": "ops", "admin": True}]}
SMALL = {"model": "gpt3-125m", "training": {"seq_len": 1024, "global_batch_size": 32, "train_steps": 50}}
LONG = {"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 512, "train_steps": 100_000}}


@pytest.fixture
def service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    """A live app (simulated executor, wall-clock speed: a long job stays running) that every client command
    talks to in place of a socket."""
    for name in ("FRENZY_SERVER", "FRENZY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FRENZY_CONFIG", str(tmp_path / "absent.yaml"))
    config = simulated_service(f"sqlite:///{tmp_path / 'jobs.db'}", 1.0, TENANTS, decision_wait_s=5.0)
    with TestClient(create_app(config)) as http:
        seen: list[Target] = []

        def connect(target: Target) -> TestClient:
            seen.append(target)
            return http

        monkeypatch.setattr(client_module, "connect", connect)
        http.targets = seen  # type: ignore[attr-defined]
        yield http


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _job_file(tmp_path: Path, spec: dict[str, Any], name: str) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"name": name, **spec}), encoding="utf-8")
    return str(path)


def test_submit_jobs_status_cancel(service: TestClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    auth = ("--token", TOKEN_A)
    code, out, _ = _run(capsys, "submit", _job_file(tmp_path, LONG, "long-one"), *auth, "--json")
    assert code == 0
    job = json.loads(out)
    assert job["name"] == "long-one" and job["tenant"] == "team-a" and job["state"] in ("queued", "running")

    code, out, _ = _run(capsys, "jobs", *auth)
    assert code == 0
    header, *rows = out.strip().splitlines()
    assert header.split() == ["ID", "NAME", "TENANT", "STATE", "GPUS", "WHERE"]
    assert len(rows) == 1 and rows[0].split()[:3] == [job["id"], "long-one", "team-a"]

    code, out, _ = _run(capsys, "status", job["id"], *auth)
    assert code == 0 and out.startswith(f"{job['id']}  long-one  (team-a)") and "state:" in out

    code, out, _ = _run(capsys, "cancel", job["id"], *auth, "--json")
    assert code == 0 and json.loads(out)["state"] == "cancelled"
    # A finished job leaves the default listing (the queue and running jobs) and stays under --all.
    assert json.loads(_run(capsys, "jobs", *auth, "--json")[1]) == {"items": [], "total": 0, "jobs": []}
    listed = json.loads(_run(capsys, "jobs", *auth, "--all", "--json")[1])
    everything = listed["items"]  # contract 3: `items` as GET /v1/jobs
    assert listed["jobs"] == everything and listed["total"] == len(everything)
    assert [j["id"] for j in everything] == [job["id"]]
    cancelled = json.loads(_run(capsys, "jobs", *auth, "--state", "cancelled", "--json")[1])["items"]
    assert [j["state"] for j in cancelled] == ["cancelled"]


def test_a_shipped_job_name_submits(service: TestClient, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "submit", "job-tiny", "--token", TOKEN_A)
    assert code == 0 and out.startswith("submitted ")


def test_a_refused_token_and_an_unknown_job_are_one_line_errors(
    service: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(capsys, "jobs", "--token", "not-a-token")
    assert code == 1 and out == ""
    assert "refused the request (401: the token is not known to the service)" in err and err.count("\n") == 1
    code, _, err = _run(capsys, "jobs")
    assert code == 1 and "401: no token given" in err
    code, _, err = _run(capsys, "status", "no-such-job", "--token", TOKEN_A)
    assert code == 1 and "404" in err


def test_the_tenant_sees_only_its_own_jobs(
    service: TestClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(capsys, "submit", _job_file(tmp_path, SMALL, "mine"), "--token", TOKEN_A)
    _run(capsys, "submit", _job_file(tmp_path, SMALL, "theirs"), "--token", TOKEN_ADMIN)
    mine = json.loads(_run(capsys, "jobs", "--all", "--json", "--token", TOKEN_A)[1])["items"]
    every = json.loads(_run(capsys, "jobs", "--all", "--json", "--token", TOKEN_ADMIN)[1])["items"]
    assert [j["name"] for j in mine] == ["mine"]
    assert sorted(j["name"] for j in every) == ["mine", "theirs"]


def test_server_and_token_come_from_flags_then_environment_then_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "client.yaml"
    config.write_text("server: http://config:1/\ntoken: from-config\n", encoding="utf-8")
    monkeypatch.setenv("FRENZY_CONFIG", str(config))
    monkeypatch.delenv("FRENZY_SERVER", raising=False)
    monkeypatch.delenv("FRENZY_TOKEN", raising=False)
    assert resolve(None, None) == Target("http://config:1", "from-config")
    monkeypatch.setenv("FRENZY_SERVER", "http://env:2")
    monkeypatch.setenv("FRENZY_TOKEN", "from-env")
    assert resolve(None, None) == Target("http://env:2", "from-env")
    assert resolve("http://flag:3", "from-flag") == Target("http://flag:3", "from-flag")
    config.write_text("server: [1]\nother: 2\n", encoding="utf-8")
    with pytest.raises(client_module.ClientError, match="server and token"):
        resolve(None, None)
    monkeypatch.setenv("FRENZY_CONFIG", str(tmp_path / "none.yaml"))
    monkeypatch.delenv("FRENZY_SERVER")
    monkeypatch.delenv("FRENZY_TOKEN")
    assert resolve(None, None) == Target("http://127.0.0.1:8000", None)


def test_an_unreachable_server_names_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from frenzy_opt.core.machine import free_port

    monkeypatch.setenv("FRENZY_CONFIG", str(tmp_path / "none.yaml"))
    server = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    code, out, err = _run(capsys, "jobs", "--server", server)
    assert code == 1 and out == ""
    assert f"cannot reach the frenzy service at {server}" in err and "frenzy serve" in err


def test_durations() -> None:
    assert [parse_duration(t) for t in ("90s", "30m", "12h", "7d", "15")] == [90, 1800, 43200, 604800, 15]
    for bad in ("soon", "-3h", "h"):
        with pytest.raises(ValueError, match="--since"):
            parse_duration(bad)


def test_one_clock_cluster_time_with_its_wall_time_when_scaled() -> None:
    queued = {"state": "queued", "queue_position": 3, "estimated_start_in_s": 7200.0 * 10, "time_scale": 120.0}
    assert _where(queued) == "#3, starts in 20.0h cluster time (~10m wall at 120x)"
    assert _where({**queued, "time_scale": 1.0}) == "#3, starts in 20.0h"
    row = {"tenant": "t", "gpu_type": "A100", "gpu_hours": 76.0, "jobs": 3}
    text = usage_table({"time_scale": 120.0, "rows": [row]})
    assert "76.00" in text and "cluster time" in text and "120x" in text


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.startswith("frenzy-opt ")


def test_usage_and_timeline_come_from_the_history(
    service: TestClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = json.loads(_run(capsys, "submit", _job_file(tmp_path, LONG, "long"), "--token", TOKEN_A, "--json")[1])
    assert job["state"] == "running", job["reason"]
    headers = {"Authorization": f"Bearer {TOKEN_A}"}
    timeline = service.get("/v1/timeline", params={"since": 0}, headers=headers).json()
    (stretch,) = timeline["intervals"]
    assert stretch["job"] == job["id"] and stretch["end"] is None and stretch["tenant"] == "team-a"
    assert stretch["num_gpus"] == job["plan"]["num_gpus"] and stretch["gpu_type"] == job["plan"]["gpu_type"]
    assert set(timeline["gpus_per_type"]) == {"A100-SXM4-80GB", "V100-SXM2-32GB", "RTX-3090"}
    code, out, _ = _run(capsys, "usage", "--token", TOKEN_A, "--json")
    (row,) = json.loads(out)["rows"]
    assert code == 0 and row["tenant"] == "team-a" and row["gpu_type"] == stretch["gpu_type"] and row["jobs"] == 1
    assert 0 < row["gpu_hours"] < 1
    code, out, _ = _run(capsys, "usage", "--token", TOKEN_A, "--since", "1h")
    assert code == 0 and out.splitlines()[0].split() == ["TENANT", "GPU", "TYPE", "GPU-HOURS", "JOBS"]
    other = service.get("/v1/usage", headers={"Authorization": f"Bearer {TOKEN_ADMIN}"}).json()["rows"]
    assert [r["tenant"] for r in other] == ["team-a"]  # the admin sees everyone's


def test_logs_print_the_attempts_output_and_follow_ends_with_the_attempt(
    service: TestClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    auth = ("--token", TOKEN_A)
    for i in range(8):  # more than the cluster holds at once: some stay queued (which, the scheduler decides)
        _run(capsys, "submit", _job_file(tmp_path, LONG, f"l{i}"), *auth, "--json")
    jobs = json.loads(_run(capsys, "jobs", *auth, "--json")[1])["items"]  # the states now, after the decisions
    running = next(j for j in jobs if j["state"] == "running")
    queued = next(j for j in jobs if j["state"] == "queued")
    code, out, _ = _run(capsys, "logs", running["id"], *auth)
    assert code == 0 and out.startswith(f"simulated attempt 1 of {running['id']}: ")
    code, out, err = _run(capsys, "logs", queued["id"], *auth)
    assert code == 0 and out == "" and "no attempt has started yet" in err
    # The queue table shows where a queued job stands.
    rows = {r.split()[0]: r for r in _run(capsys, "jobs", *auth)[1].splitlines()[1:]}
    assert "#1" in "".join(rows[j["id"]] for j in jobs if j["state"] == "queued")
    # Once the attempt ended, --follow prints all it wrote and returns.
    assert _run(capsys, "cancel", running["id"], *auth)[0] == 0
    code, out, _ = _run(capsys, "logs", running["id"], "--follow", *auth)
    lines = out.splitlines()
    assert (
        code == 0 and lines[0].startswith("simulated attempt 1") and lines[-1] == "stopped: the attempt was cancelled"
    )
    code, out, _ = _run(capsys, "logs", running["id"], "--json", *auth)
    assert json.loads(out)["attempt"] == 1 and json.loads(out)["log"].splitlines() == lines
    code, _, err = _run(capsys, "logs", running["id"], "--json", "--follow", *auth)
    assert code == 1 and "do not go together" in err


def test_the_client_over_http_follows_a_job_of_a_live_server_to_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real thing: ``frenzy serve``'s uvicorn server on 127.0.0.1 and the client's own connection."""
    from frenzy_opt.api.server import background_server

    monkeypatch.setenv("FRENZY_CONFIG", str(tmp_path / "absent.yaml"))
    monkeypatch.delenv("FRENZY_TOKEN", raising=False)
    # A million cluster seconds per wall second: LONG runs for a few wall seconds.
    config = simulated_service(f"sqlite:///{tmp_path / 'jobs.db'}", 1e6, decision_wait_s=5.0)
    with background_server(config) as url:
        monkeypatch.setenv("FRENZY_SERVER", url)
        code, out, _ = _run(capsys, "submit", _job_file(tmp_path, LONG, "live"), "--json")
        job = json.loads(out)
        assert code == 0 and job["state"] == "running"
        code, out, _ = _run(capsys, "logs", job["id"], "--follow")
        assert code == 0 and out.splitlines()[-1] == "completed 100000 steps"
        code, out, _ = _run(capsys, "status", job["id"], "--json")
        assert code == 0 and json.loads(out)["state"] == "succeeded"
