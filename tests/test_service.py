"""The HTTP service through the real app (TestClient): submission, idempotency, listing, cancel, tenants and
quotas, bad input, dry-run plans, cluster view, health and metrics."""

from __future__ import annotations

import asyncio
import json
import re
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from factories import simulated_service
from fastapi.testclient import TestClient

from frenzy_opt.api.app import create_app
from frenzy_opt.api.plansearch import Throttled
from frenzy_opt.api.schemas import STATES
from frenzy_opt.core.enums import JobState
from frenzy_opt.core.spec import parse_job

A, B, ADMIN = "token-team-a", "token-team-b", "token-admin-1"
TENANTS = {
    "tokens": [
        {"token": A, "tenant": "team-a"},
        {"token": B, "tenant": "team-b"},
        {"token": ADMIN, "tenant": "ops", "admin": True},
    ],
    "quotas": {"team-b": {"A100-SXM4-80GB": 0, "V100-SXM2-32GB": 0, "RTX-3090": 4}},
}
SMALL = {"model": "gpt3-125m", "training": {"seq_len": 1024, "global_batch_size": 32, "train_steps": 50}}
LONG = {"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 512, "train_steps": 100_000}}


def _client(tmp_path: Path, time_scale: float, tenants: dict[str, Any] | None = TENANTS, **settings: Any) -> TestClient:
    config = simulated_service(
        f"sqlite:///{tmp_path / 'jobs.db'}", time_scale, tenants, decision_wait_s=5.0, **settings
    )
    return TestClient(create_app(config))


@pytest.fixture
def fast(tmp_path: Path) -> Iterator[TestClient]:
    """Jobs finish in milliseconds (a billion cluster seconds per second)."""
    with _client(tmp_path, 1e9) as client:
        yield client


@pytest.fixture
def slow(tmp_path: Path) -> Iterator[TestClient]:
    """Jobs run for minutes of wall time: states stay put while a test looks."""
    with _client(tmp_path, 1.0) as client:
        yield client


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def wait_for(client: TestClient, job_id: str, token: str, states: set[str], timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = client.get(f"/v1/jobs/{job_id}", headers=auth(token)).json()
        if body["state"] in states or time.monotonic() > deadline:
            return body
        time.sleep(0.02)


def test_submit_answers_202_with_the_plan_and_the_job_runs_to_success(fast: TestClient) -> None:
    answer = fast.post("/v1/jobs", json=SMALL, headers=auth(A))
    assert answer.status_code == 202
    body = answer.json()
    assert body["id"].startswith("job-") and body["tenant"] == "team-a"
    assert body["state"] in ("running", "succeeded") and body["plan"]["num_gpus"] >= 1
    done = wait_for(fast, body["id"], A, {"succeeded"})
    assert [e["state"] for e in done["history"]] == ["queued", "scheduled", "running", "succeeded"]
    assert done["predicted"]["peak_allocated_bytes"] == done["plan"]["peak_allocated_bytes"]
    assert done["measured"]["step_time_s"] == pytest.approx(done["predicted"]["step_time_s"])
    assert len(done["placement"]["nodes"]) >= 1


def test_idempotency_key_returns_the_same_job_and_refuses_a_different_body(fast: TestClient) -> None:
    key = {"Idempotency-Key": "submit-42", **auth(A)}
    first = fast.post("/v1/jobs", json=SMALL, headers=key).json()
    again = fast.post("/v1/jobs", json=SMALL, headers=key)
    assert again.status_code == 202 and again.json()["id"] == first["id"]
    other = fast.post("/v1/jobs", json={**SMALL, "weight": 2.0}, headers=key)
    assert other.status_code == 409
    assert fast.get("/v1/jobs", headers=auth(A)).json()["total"] == 1
    # Keys are per tenant: team-b's "submit-42" is another job.
    assert fast.post("/v1/jobs", json=SMALL, headers={**key, **auth(B)}).json()["id"] != first["id"]


def test_list_filters_by_state_and_paginates(fast: TestClient) -> None:
    ids = [fast.post("/v1/jobs", json=SMALL, headers=auth(A)).json()["id"] for _ in range(5)]
    for job_id in ids:
        wait_for(fast, job_id, A, {"succeeded"})
    page = fast.get("/v1/jobs", params={"limit": 2, "offset": 2}, headers=auth(A)).json()
    assert [j["id"] for j in page["items"]] == ids[2:4]
    assert page["total"] == 5 and page["next_offset"] == 4
    last = fast.get("/v1/jobs", params={"limit": 2, "offset": 4}, headers=auth(A)).json()
    assert last["next_offset"] is None
    assert fast.get("/v1/jobs", params={"state": "succeeded"}, headers=auth(A)).json()["total"] == 5
    assert fast.get("/v1/jobs", params={"state": "queued"}, headers=auth(A)).json()["total"] == 0
    for bad in ({"limit": 0}, {"limit": 501}, {"offset": -1}, {"state": "done"}):
        assert fast.get("/v1/jobs", params=bad, headers=auth(A)).status_code == 422


def test_cancel_queued_and_running_jobs_releases_their_gpus(slow: TestClient) -> None:
    running = [slow.post("/v1/jobs", json=LONG, headers=auth(A)).json() for _ in range(4)]
    states = [j["state"] for j in running]
    assert "running" in states and "queued" in states  # the cluster is full: later ones wait
    queued = next(j for j in running if j["state"] == "queued")
    assert "waiting for" in queued["reason"] or "no GPU free" in queued["reason"]
    answer = slow.post(f"/v1/jobs/{queued['id']}/cancel", headers=auth(A))
    assert answer.status_code == 200 and answer.json()["state"] == "cancelled"
    assert slow.post(f"/v1/jobs/{queued['id']}/cancel", headers=auth(A)).status_code == 409
    for job in running:
        slow.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(A))
    cluster = slow.get("/v1/cluster", headers=auth(ADMIN)).json()
    assert all(t["used"] == 0 for t in cluster["gpu_types"].values()) and cluster["running"] == []
    assert {j["state"] for j in slow.get("/v1/jobs", headers=auth(A)).json()["items"]} == {"cancelled"}


def test_tenants_see_only_their_jobs_and_the_admin_sees_all(fast: TestClient) -> None:
    mine = fast.post("/v1/jobs", json=SMALL, headers=auth(A)).json()["id"]
    assert fast.post("/v1/jobs", json=SMALL).status_code == 401
    assert fast.get("/v1/jobs", headers=auth("wrong-token")).status_code == 401
    assert fast.get(f"/v1/jobs/{mine}", headers=auth(B)).status_code == 404
    assert fast.post(f"/v1/jobs/{mine}/cancel", headers=auth(B)).status_code == 404
    assert fast.get("/v1/jobs", headers=auth(B)).json()["total"] == 0
    assert fast.get(f"/v1/jobs/{mine}", headers=auth(ADMIN)).status_code == 200
    assert fast.get("/v1/jobs", headers=auth(ADMIN)).json()["total"] == 1


def test_quotas_are_enforced_by_the_scheduler_with_the_reason(slow: TestClient) -> None:
    # team-b may hold 4 RTX-3090 and nothing else: a job needing more waits, over quota, on an empty cluster.
    big = slow.post("/v1/jobs", json=LONG, headers=auth(B)).json()
    assert big["state"] == "queued" and "over quota for tenant 'team-b'" in big["reason"]
    small = slow.post("/v1/jobs", json=SMALL, headers=auth(B)).json()
    assert small["state"] == "running" and small["plan"]["gpu_type"] == "RTX-3090"
    assert small["plan"]["num_gpus"] <= 4
    # team-a has no quota: the same big job starts.
    assert slow.post("/v1/jobs", json=LONG, headers=auth(A)).json()["state"] == "running"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({**SMALL, "training": {"precision": "fp64"}}, "'bf16', 'fp16', 'fp32' or 'fp8'"),
        ({"model": "gpt-9"}, "allowed: gpt3-1.3b"),
        ({**SMALL, "training": {"seq_len": 10**12}}, "less than or equal to 1048576"),
        ({**SMALL, "gpus": 8}, "Extra inputs are not permitted"),
        ({"model": "llama3.1-405b"}, "the largest GPU available is A100-SXM4-80GB with 80.0 GiB"),
        ({**SMALL, "parallel": {"dp": 3, "ep": 2}}, "parallel.ep (2) must divide parallel.dp (3)"),
    ],
)
def test_bad_input_is_422_naming_the_field_and_stores_nothing(
    fast: TestClient, body: dict[str, Any], expected: str
) -> None:
    answer = fast.post("/v1/jobs", json=body, headers=auth(A))
    assert answer.status_code == 422
    assert expected in str(answer.json()["detail"])
    assert fast.get("/v1/jobs", headers=auth(ADMIN)).json()["total"] == 0


ARCH = {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1000}


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('{"model": "gpt3-125m", "training": {"seq_len": true}}', "seq_len"),
        ('{"model": "gpt3-125m", "weight": "1.5"}', "weight"),
        ('{"model": "gpt3-125m", "training": {"train_steps": 10.0}}', "train_steps"),
        ('{"model": ' + json.dumps({**ARCH, "linear_bias": 0}) + "}", "linear_bias"),
        ('{"model": "gpt3-125m", "weight": NaN}', "weight"),
        ('{"model": "gpt3-125m", "training": {"memory_headroom": Infinity}}', "memory_headroom"),
    ],
)
def test_input_types_are_strict_and_errors_name_the_field(fast: TestClient, raw: str, field: str) -> None:
    answer = fast.post("/v1/jobs", content=raw, headers={**auth(A), "Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert any(field in [str(part) for part in error["loc"]] for error in answer.json()["detail"]), answer.text
    assert fast.get("/v1/jobs", headers=auth(ADMIN)).json()["total"] == 0


def test_oversize_bodies_are_refused(fast: TestClient) -> None:
    answer = fast.post(
        "/v1/jobs", content=b"{" + b" " * (2 << 20) + b"}", headers={**auth(A), "Content-Type": "application/json"}
    )
    assert answer.status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
        yield b"{"
        for _ in range(20):
            yield b" " * (1 << 16)
        yield b"}"

    chunked = fast.post("/v1/jobs", content=chunks(), headers={**auth(A), "Content-Type": "application/json"})
    assert chunked.status_code == 413, chunked.text
    assert fast.get("/v1/jobs", headers=auth(ADMIN)).json()["total"] == 0
    small = fast.post(
        "/v1/jobs", content=iter([json.dumps(SMALL).encode()]), headers={**auth(A), "Content-Type": "application/json"}
    )
    assert small.status_code == 202, small.text  # a chunked body under the limit goes through


def test_openapi_documents_every_answer(fast: TestClient) -> None:
    paths = fast.get("/openapi.json").json()["paths"]
    assert {"400", "409", "413", "422", "503"} <= set(paths["/v1/jobs"]["post"]["responses"])
    assert {"409", "503"} <= set(paths["/v1/jobs/{job_id}/cancel"]["post"]["responses"])
    assert "429" in paths["/v1/plans"]["post"]["responses"]


def test_per_tenant_metrics_need_the_admin_token(fast: TestClient) -> None:
    fast.post("/v1/jobs", json=SMALL, headers=auth(A))
    for headers in ({}, auth(A), auth("not-a-token")):
        text = fast.get("/metrics", headers=headers).text
        assert "frenzy_queue_length" in text and "team-a" not in text and "frenzy_jobs_submitted" not in text
    assert 'frenzy_jobs_submitted_total{tenant="team-a"} 1.0' in fast.get("/metrics", headers=auth(ADMIN)).text


def test_plans_dry_run_lists_ranked_plans_and_stores_nothing(fast: TestClient) -> None:
    answer = fast.post("/v1/plans", params={"top": 5}, json=LONG, headers=auth(A))
    assert answer.status_code == 200
    body = answer.json()
    times = [p["step_time_s"] for p in body["plans"]]
    assert len(times) == 5 and times == sorted(times)
    assert body["num_plans"] >= 5 and set(body["min_gpus_per_type"]) <= {"A100-SXM4-80GB", "V100-SXM2-32GB", "RTX-3090"}
    assert fast.get("/v1/jobs", headers=auth(ADMIN)).json()["total"] == 0
    assert fast.post("/v1/plans", params={"top": 0}, json=LONG, headers=auth(A)).status_code == 422


def test_plan_searches_are_cached_by_what_changes_them_and_bounded(tmp_path: Path) -> None:
    with _client(tmp_path, 1e9, plan_cache_bytes=120_000, plans_burst=1000) as client:
        searches = client.app.state.service.searches  # type: ignore[attr-defined]
        first = None
        for steps in range(1, 101):  # 100 distinct requests that differ only in their step count
            body = {**LONG, "name": f"run-{steps}", "training": {**LONG["training"], "train_steps": steps}}
            answer = client.post("/v1/plans", params={"top": 3}, json=body, headers=auth(A))
            assert answer.status_code == 200
            plans = answer.json()["plans"]
            first = first or plans
            assert [p["step_time_s"] for p in plans] == [p["step_time_s"] for p in first]
            assert plans[0]["est_runtime_s"] == pytest.approx(plans[0]["step_time_s"] * steps)
        assert searches.searches == 1
        for seq_len in (512, 1024, 2048):  # each a search of its own (about 50 kB of results each)
            body = {**LONG, "training": {**LONG["training"], "seq_len": seq_len}}
            assert client.post("/v1/plans", json=body, headers=auth(A)).status_code == 200
        assert searches.searches == 4 and 0 < searches.cache_bytes <= 120_000
        assert len(searches) < 4  # the least recently used went


def test_plan_searches_are_rate_limited_per_tenant(tmp_path: Path) -> None:
    with _client(tmp_path, 1e9, plans_per_minute=1, plans_burst=2) as client:
        for _ in range(2):
            assert client.post("/v1/plans", json=SMALL, headers=auth(A)).status_code == 200
        refused = client.post("/v1/plans", json=SMALL, headers=auth(A))
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert "rate" in refused.json()["detail"]
        assert client.post("/v1/plans", json=SMALL, headers=auth(B)).status_code == 200  # another tenant's own
        assert client.post("/v1/jobs", json=SMALL, headers=auth(A)).status_code == 202  # submissions are not


def test_plan_searches_run_at_most_n_at_once_per_tenant(tmp_path: Path) -> None:
    async def two_at_once(searches: Any) -> str:
        one = parse_job(SMALL)
        other = parse_job({**SMALL, "training": {**SMALL["training"], "seq_len": 512}})
        running = asyncio.ensure_future(searches.summary(one, "team-a"))
        await asyncio.sleep(0)
        try:
            await searches.summary(other, "team-a")
        except Throttled as err:
            message = str(err)
        else:
            message = "not throttled"
        await running
        await searches.summary(other, "team-b")  # another tenant may search meanwhile
        return message

    with _client(tmp_path, 1e9, plan_searches_per_tenant=1) as client:
        message = asyncio.run(two_at_once(client.app.state.service.searches))  # type: ignore[attr-defined]
        assert "already has 1 plan searches running" in message


def test_cluster_health_and_metrics(slow: TestClient) -> None:
    job = slow.post("/v1/jobs", json=SMALL, headers=auth(A)).json()
    cluster = slow.get("/v1/cluster", headers=auth(A)).json()
    assert cluster["gpu_types"]["A100-SXM4-80GB"]["gpus"] == 16 and len(cluster["nodes"]) == 8
    assert [r["job"] for r in cluster["running"]] == [job["id"]]
    assert slow.get("/v1/cluster", headers=auth(B)).json()["running"] == []  # not team-b's job
    assert slow.get("/healthz").json()["status"] == "ok"
    text = slow.get("/metrics").text
    for name in (
        "frenzy_queue_length",
        "frenzy_gpus_used{",
        "frenzy_decisions_total",
        "frenzy_decision_seconds_bucket",
    ):
        assert name in text
    used = sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("frenzy_gpus_used{"))
    assert used == job["plan"]["num_gpus"]


def test_local_mode_needs_no_token(tmp_path: Path) -> None:
    with _client(tmp_path, 1e9, tenants=None) as client:
        body = client.post("/v1/jobs", json=SMALL).json()
        assert body["tenant"] == "local"
        assert client.get(f"/v1/jobs/{body['id']}").status_code == 200


def test_the_demo_line_of_a_start_shows_every_parallel_dimension() -> None:
    from frenzy_opt.api.server import _describe

    plan = {"gpu_type": "A100-SXM4-80GB", "num_gpus": 16, "est_runtime_s": 3600.0}
    plan["parallel"] = {"dp": 1, "tp": 4, "pp": 2, "vpp": None, "cp": 2, "ep": 1, "zero_stage": 1}
    item = {"state": "running", "plan": plan, "placement": {"nodes": ["n0", "n1"]}}
    line = _describe(item, "job", 0.0, 0.0)
    assert line is not None and "dp1 tp4 pp2 cp2 zero1" in line and "ep" not in line.split("zero")[0]


def test_the_dashboard_and_the_docs_are_served_without_another_host(fast: TestClient) -> None:
    page = fast.get("/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for asset in ("/ui/static/app.js", "/ui/static/style.css"):
        assert fast.get(asset).status_code == 200
    assert fast.get("/ui/static/../app.py").status_code == 404
    for path in ("/docs", "/redoc"):
        html = fast.get(path).text
        sources = re.findall(r'(?:src|href)="([^"]+)"', html) + re.findall(r"url: '([^']+)'", html)
        assert sources and all(s.startswith("/") for s in sources), sources
        for source in sources:
            assert fast.get(source).status_code == 200, source
    assert "fonts.googleapis" not in fast.get("/redoc").text
    assert "/docs" not in fast.get("/openapi.json").json()["paths"]


def test_the_api_state_filter_names_every_job_state() -> None:
    assert set(typing.get_args(STATES)) == set(JobState)


def test_queued_jobs_show_their_queue_position_and_estimated_start(slow: TestClient) -> None:
    jobs = [slow.post("/v1/jobs", json=LONG, headers=auth(A)).json() for _ in range(5)]
    listed = slow.get("/v1/jobs", params={"state": "queued"}, headers=auth(A)).json()["items"]
    assert listed and {j["id"] for j in listed} <= {j["id"] for j in jobs}
    assert sorted(j["queue_position"] for j in listed) == list(range(1, len(listed) + 1))
    first = next(j for j in listed if j["queue_position"] == 1)
    assert first["estimated_start_in_s"] is not None and first["estimated_start_in_s"] > 0
    assert first["waiting_for"].endswith(first["waiting_for"].split(" x ")[1]) and " x " in first["waiting_for"]
    running = slow.get("/v1/jobs", params={"state": "running"}, headers=auth(A)).json()["items"]
    assert running and all(j["queue_position"] is None and j["estimated_start_in_s"] is None for j in running)


def test_logs_of_a_simulated_attempt_show_its_progress_and_follow_ends_with_it(tmp_path: Path) -> None:
    # A million cluster seconds per wall second: the 100,000-step job of LONG runs for a few wall seconds.
    with _client(tmp_path, 1e6) as client:
        job = client.post("/v1/jobs", json=LONG, headers=auth(A)).json()
        assert job["state"] == "running"
        first = client.get(f"/v1/jobs/{job['id']}/logs", headers=auth(A))
        assert first.status_code == 200 and first.headers["x-log-attempt"] == "1"
        assert first.text.startswith("simulated attempt 1 of " + job["id"])
        assert client.get(f"/v1/jobs/{job['id']}/logs", headers=auth(B)).status_code == 404  # not B's job
        with client.stream("GET", f"/v1/jobs/{job['id']}/logs", params={"follow": 1}, headers=auth(A)) as stream:
            followed = b"".join(stream.iter_bytes()).decode()
        # The stream ended on its own once the attempt ended, with every line of it.
        lines = followed.splitlines()
        assert lines[0] == first.text.splitlines()[0] and lines[-1] == "completed 100000 steps"
        assert [line.split(" ")[1] for line in lines[1:-1]] == [f"{k * 10_000}/100000" for k in range(1, 11)]
        assert wait_for(client, job["id"], A, {"succeeded"})["state"] == "succeeded"
        whole = client.get(f"/v1/jobs/{job['id']}/logs", params={"offset": 0}, headers=auth(A))
        assert whole.text == followed and whole.headers["x-log-offset"] == whole.headers["x-log-size"]
        tail = client.get(f"/v1/jobs/{job['id']}/logs", params={"limit": 10}, headers=auth(A))
        assert tail.content == followed.encode()[-10:]
