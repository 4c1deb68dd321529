"""Health that tells the truth, and the store's smaller refusals (issue 23, items 5 and 7): a write stalled on
another connection's lock fails later requests fast and shows in ``/healthz`` until a write probe succeeds; a
malformed page found while serving is permanent; an unknown state is quarantined; a table of another shape
and a missing store are refused at start with the reason; an older store gains the new columns;
``/v1/calibration`` shows a tenant only its own jobs; the dry run documents its 400 and refuses an empty model
name in its schema."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from factories import simulated_service
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from test_service_faults import SMALL, _write_lock

from frenzy_opt.api.app import create_app
from frenzy_opt.api.server import serve
from frenzy_opt.cli import main
from frenzy_opt.service.store import Store, StoreMissing, StoreSchema

TOKENS = {
    "tokens": [
        {"token": "token-team-a", "tenant": "team-a"},
        {"token": "token-team-b", "tenant": "team-b"},
        {"token": "token-admin-0", "tenant": "ops", "admin": True},
    ]
}


@contextmanager
def _service(db_url: str, **settings: Any) -> Iterator[TestClient]:
    with TestClient(create_app(simulated_service(db_url, 1e9, decision_wait_s=5.0, **settings))) as client:
        yield client


def _until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_write_stalled_on_another_connections_lock_fails_fast_and_shows_in_healthz(db_url: str) -> None:
    with _service(db_url, busy_timeout_s=20.0) as client:
        store = client.app.state.service.store  # type: ignore[attr-defined]
        store.stall_s = 1.0
        answers: list[int] = []
        with _write_lock(db_url):
            stuck = threading.Thread(target=lambda: answers.append(client.post("/v1/jobs", json=SMALL).status_code))
            stuck.start()
            _until(lambda: client.get("/healthz").status_code == 503, 10, "healthz to see the stalled write")
            health = client.get("/healthz")
            assert "waited" in health.json()["detail"] and int(health.headers["retry-after"]) > 0
            started = time.monotonic()
            refused = client.post("/v1/jobs", json=SMALL)
            assert refused.status_code == 503 and time.monotonic() - started < 2.0  # fails fast, does not queue
            answers.append(refused.status_code)
        stuck.join(30)
        # The lock is gone: the stalled write goes through, a probe clears the fault.
        _until(lambda: client.get("/healthz").status_code == 200, 15, "a write probe to clear the fault")
        after = client.post("/v1/jobs", json=SMALL)
        assert after.status_code == 202
        answers.append(after.status_code)
        assert client.get("/v1/jobs").json()["total"] == answers.count(202)  # nothing half-written, nothing lost


def test_a_malformed_page_found_while_serving_is_a_permanent_fault(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = Store(f"sqlite:///{path}")
    for i in range(300):  # several pages of finished jobs (nothing for recovery to touch)
        store.add_job(
            job_id=f"old-{i}", tenant="local", name="n" * 200, spec=SMALL, request_hash="h", idempotency_key=None,
            max_retries=0, weight=1.0, predicted=None,
        )  # fmt: skip
        store.transition(f"old-{i}", "succeeded", "done long ago")
    store.close()  # checkpointed: every page is in the main file
    with _service(f"sqlite:///{path}") as client:
        service = client.app.state.service  # type: ignore[attr-defined]
        service.store.engine.dispose()  # no page cached anywhere: the next read reads the file
        with path.open("r+b") as raw:
            raw.seek(3 * 4096)
            raw.write(b"\xa5" * (4 * 4096))  # four pages of the jobs table are garbage now
        listed = client.get("/v1/jobs", params={"limit": 500})
        assert listed.status_code == 503 and "malformed" in listed.json()["detail"]
        for _ in range(3):  # and it stays so: no probe clears a damaged database
            time.sleep(0.6)
            health = client.get("/healthz")
            assert health.status_code == 503 and "damaged" in health.json()["detail"]
            assert "retry-after" not in health.headers and "retry later" not in health.json()["detail"]
        refused = client.post("/v1/jobs", json=SMALL)
        assert refused.status_code == 503 and "retry-after" not in refused.headers
        assert "restore the database from a backup" in refused.json()["detail"]


def test_a_row_in_an_unknown_state_is_quarantined_at_start(db_url: str) -> None:
    store = Store(db_url)
    record = store.add_job(
        job_id="job-paused", tenant="local", name="n", spec=SMALL, request_hash="h", idempotency_key=None,
        max_retries=0, weight=1.0, predicted=None,
    )  # fmt: skip
    with store.engine.begin() as conn:  # as a newer version (or a hand edit) could leave it
        conn.execute(text("UPDATE jobs SET state = 'paused' WHERE id = :id"), {"id": record.id})
    store.close()
    with _service(db_url) as client:
        job = client.get(f"/v1/jobs/{record.id}").json()
        assert job["state"] == "failed" and "quarantined" in job["reason"] and "'paused'" in job["reason"]
        assert client.get("/healthz").status_code == 200


def test_a_jobs_table_of_another_shape_is_refused_with_the_reason(db_url: str) -> None:
    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE jobs (id VARCHAR(40) PRIMARY KEY, payload TEXT)"))
    engine.dispose()
    with pytest.raises(StoreSchema, match=r"table jobs has columns id, payload but lacks .*tenant"):
        Store(db_url)
    with pytest.raises(SystemExit, match=r"frenzy serve: .*lacks"):
        serve(simulated_service(db_url, 1.0), "127.0.0.1", 0)


def test_an_older_store_gains_the_new_columns(db_url: str) -> None:
    store = Store(db_url)
    store.add_job(
        job_id="job-old", tenant="local", name="n", spec=SMALL, request_hash="h", idempotency_key=None,
        max_retries=0, weight=1.0, predicted=None,
    )  # fmt: skip
    with store.engine.begin() as conn:  # the store as the release before the counters made it
        conn.execute(text("ALTER TABLE jobs DROP COLUMN failures"))
        conn.execute(text("ALTER TABLE jobs DROP COLUMN moves"))
    store.close()
    again = Store(db_url, create=False)
    record = again.get("job-old")
    assert record is not None and (record.failures, record.moves) == (0, 0)
    again.close()


def test_a_missing_store_is_refused_unless_asked_to_create_it(tmp_path: Path, db_url: str) -> None:
    if db_url.startswith("sqlite"):
        path = tmp_path / "volume" / "jobs.db"  # the folder exists, the file does not: a volume not mounted
        path.parent.mkdir()
        with pytest.raises(SystemExit, match=r"frenzy serve: .*does not exist .*--create"):
            main(["serve", "--db", str(path), "--port", "0"])
        assert not path.exists()  # nothing created
    else:
        with pytest.raises(StoreMissing, match="no jobs table"):
            Store(db_url, create=False)
        with pytest.raises(SystemExit, match="--create"):
            serve(simulated_service(db_url, 1.0, create_store=False), "127.0.0.1", 0)
    Store(db_url if not db_url.startswith("sqlite") else f"sqlite:///{tmp_path / 'volume' / 'jobs.db'}").close()


def test_calibration_shows_a_tenant_only_its_own_jobs(tmp_path: Path) -> None:
    with TestClient(create_app(simulated_service(f"sqlite:///{tmp_path / 'db'}", 1e9, TOKENS))) as client:
        orchestrator = client.app.state.service.orchestrator  # type: ignore[attr-defined]
        for job, tenant in (("job-of-a", "team-a"), ("job-of-b", "team-b")):  # two measured runs
            orchestrator.samples.append(
                SimpleNamespace(
                    job_id=job, gpu=SimpleNamespace(name="A100-SXM4-80GB"), memory_source="MemTracker",
                    peak_memory_bytes=(10 << 30,), predicted_peak_bytes=11 << 30,
                )
            )  # fmt: skip
            orchestrator.sample_tenants[job] = tenant

        def jobs_seen(token: str) -> set[str]:
            body = client.get("/v1/calibration", headers={"Authorization": f"Bearer {token}"}).json()
            return {row["job"] for row in body["memory"]}

        assert jobs_seen("token-team-a") == {"job-of-a"}
        assert jobs_seen("token-team-b") == {"job-of-b"}
        assert jobs_seen("token-admin-0") == {"job-of-a", "job-of-b"}


def test_the_dry_run_documents_its_400_and_refuses_an_empty_model_in_its_schema(tmp_path: Path) -> None:
    with _service(f"sqlite:///{tmp_path / 'db'}") as client:
        spec = client.get("/openapi.json").json()
        assert "400" in spec["paths"]["/v1/plans"]["post"]["responses"]
        assert "400" in spec["paths"]["/v1/jobs"]["post"]["responses"]
        job_in = spec["components"]["schemas"]["JobIn"]["properties"]["model"]
        assert any(choice.get("minLength") == 1 for choice in job_in["anyOf"])
        answer = client.post("/v1/plans", json={"model": ""})
        assert answer.status_code == 422 and answer.json()["detail"][0]["loc"][:2] == ["body", "model"]
        not_json = client.post("/v1/plans", content=b"{not json", headers={"content-type": "application/json"})
        assert not_json.status_code in (400, 422)
