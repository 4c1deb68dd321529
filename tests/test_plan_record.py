"""One plan record and one measurement record (issue 29 items 2 and 5): the dry run and a job answer a plan in
the one shape :meth:`Plan.to_dict` writes, measurements round-trip through their one reader and writer, and
the scheduler's plan cache is written by its loop alone."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from factories import simulated_service
from fastapi.testclient import TestClient

from frenzy_opt.api.app import create_app
from frenzy_opt.core.measurement import Measurement
from frenzy_opt.core.plan import Plan
from frenzy_opt.core.spec import parse_job
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.launch.executors.common import summarize
from frenzy_opt.planning.problem import OptionCache
from frenzy_opt.planning.scenario import load_cluster_ref

SMALL = {"model": "gpt3-125m", "training": {"seq_len": 1024, "global_batch_size": 32, "train_steps": 50}}
OTHER = {"model": "gpt3-125m", "training": {"seq_len": 2048, "global_batch_size": 32, "train_steps": 50}}


def _done(client: TestClient, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        body: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        if body["state"] == "succeeded" or time.monotonic() > deadline:
            return body
        time.sleep(0.02)


def test_the_dry_run_and_the_job_answer_one_plan_shape_and_only_the_loop_writes_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every write of a plan cache (a search, an adoption, a recency refresh) is recorded with its thread: while
    the API checks a new shape (searched in the plan-search worker, adopted by the loop), a known one, and runs
    a dry run, only the scheduling loop writes. The dry run's plans and the job's plan have the same keys and
    read back to the same record type, with the micro-batch size at the top and inside ``parallel``."""
    writers: list[str] = []
    checked = OptionCache._writing

    def record(cache: OptionCache) -> None:
        writers.append(threading.current_thread().name)
        checked(cache)

    monkeypatch.setattr(OptionCache, "_writing", record)
    config = simulated_service(f"sqlite:///{tmp_path / 'jobs.db'}", 1e9, None, decision_wait_s=5.0)
    with TestClient(create_app(config)) as client:
        dry = client.post("/v1/plans?top=3", json=SMALL)
        assert dry.status_code == 200
        first = client.post("/v1/jobs", json=SMALL)
        assert first.status_code == 202, first.text
        job = _done(client, first.json()["id"])
        assert client.post("/v1/jobs", json=SMALL).status_code == 202  # a known shape: read from the cache
        assert client.post("/v1/jobs", json=OTHER).status_code == 202  # a new shape: searched, then adopted
        assert client.get("/v1/cluster").status_code == 200
    assert writers and set(writers) == {"frenzy-orchestrator"}, writers

    plan, listed = job["plan"], dry.json()["plans"][0]
    assert set(listed) == set(plan)
    for shape in (plan, listed):
        assert shape["parallel"]["micro_batch_size"] == shape["micro_batch_size"]
        assert isinstance(Plan.from_dict(shape), Plan)
    assert Plan.from_dict(plan).to_dict() == plan


def test_a_claimed_cache_refuses_writes_from_other_threads() -> None:
    """The assertion behind the rule: once the loop claimed the cache, another thread's lookup (which may search
    and insert) or adoption fails; a read of what is cached does not."""
    cluster = load_cluster_ref("paper-3type")
    cache = OptionCache(cluster, Topology(cluster))
    spec = parse_job(SMALL)
    assert cache.options(spec)  # unclaimed: whoever uses it writes
    cache.claim()
    errors: list[BaseException] = []

    def other() -> None:
        assert cache.cached(spec) is not None
        for write in (lambda: cache.options(spec), lambda: cache.adopt(spec, cache._search(spec))):
            try:
                write()
            except AssertionError as err:
                errors.append(err)

    thread = threading.Thread(target=other, name="api")
    thread.start()
    thread.join()
    assert len(errors) == 2 and "'api'" in str(errors[0])
    assert cache.options(spec)  # the writer itself goes on


def test_a_measurement_has_one_wire_shape() -> None:
    """What the executors summarise reads back equal from the mapping it writes, fields unknown are left out
    (a run that measured nothing is ``{}``), and an unknown field is refused by name."""
    records = [
        {"event": "step", "loss": 5.0, "step_time_s": 2.0, "tokens_per_s": 10.0},
        {"event": "step", "loss": 4.0, "step_time_s": 1.0, "tokens_per_s": 20.0},
        {"event": "memory", "peak_memory_bytes": [7, 9], "source": "MemTracker"},
    ]
    measured = summarize(records)
    assert measured == Measurement(
        steps_run=2, loss_first=5.0, loss_last=4.0, step_time_s=1.0, tokens_per_s=20.0,
        peak_memory_bytes=(7, 9), memory_source="MemTracker",
    )  # fmt: skip
    wire = measured.to_dict()
    assert wire["peak_memory_bytes"] == [7, 9] and "source" not in wire
    assert Measurement.from_dict(wire) == measured
    assert Measurement().to_dict() == {} and Measurement.from_dict(None) == Measurement()
    with pytest.raises(ValueError, match="step_time"):
        Measurement.from_dict({"step_time": 1.0})
