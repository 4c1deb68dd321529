"""End to end on CPU: the service with the local executor on a 4-slot embedded cluster. A tiny decoder job
submitted over HTTP is planned, placed and really trained with torch.distributed (gloo) — one test per
parallel mode, forced by pinning the spec's parallel fields — and a run whose rank is killed fails, releases
its slots and succeeds on retry from its checkpoint. Also ``frenzy launch`` and ``make run``'s optional path."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from frenzy_opt.api.app import ServiceConfig
from frenzy_opt.api.server import background_server
from frenzy_opt.cli import main
from frenzy_opt.launch.executors.local import LocalExecutor
from frenzy_opt.planning.scenario import load_cluster_ref

MODEL = {
    "num_layers": 4, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4, "num_kv_heads": 2,
    "vocab_size": 256, "mlp": "swiglu", "norm": "rmsnorm", "tied_embeddings": False,
}  # fmt: skip
TRAINING = {"seq_len": 32, "micro_batch_size": 2, "global_batch_size": 8, "train_steps": 20, "precision": "fp32"}
MODES = {
    "ddp": ({"dp": 2, "tp": 1, "pp": 1, "zero_stage": 0}, "megatron"),
    "fsdp": ({"dp": 2, "tp": 1, "pp": 1, "zero_stage": 3}, "fsdp2"),
    "tp": ({"dp": 1, "tp": 2, "pp": 1, "sequence_parallel": False}, "megatron"),
    "pp": ({"dp": 1, "tp": 1, "pp": 2}, "megatron"),
    "2d pp x tp": ({"dp": 1, "tp": 2, "pp": 2, "sequence_parallel": False}, "megatron"),
}


def _job(parallel: dict[str, Any], runtime: str) -> dict[str, Any]:
    return {"name": "tiny", "model": MODEL, "training": {**TRAINING, "runtime": runtime}, "parallel": parallel}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, Path]]:
    tmp = tmp_path_factory.mktemp("e2e")
    executor = LocalExecutor(tmp / "runs", max_steps=20, checkpoint_every=5, grace_s=5)
    config = ServiceConfig(
        cluster=load_cluster_ref("local-4slot"),
        db_url=f"sqlite:///{tmp / 'jobs.db'}",
        executor=executor,
        decision_wait_s=5.0,
        calibration="e2e-profile",
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FRENZY_CALIBRATIONS", str(tmp / "profiles"))
        with background_server(config) as url, httpx.Client(base_url=url, timeout=60) as client:
            yield client, tmp / "runs"


def _wait(client: httpx.Client, job_id: str, states: set[str], timeout: float = 240) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        if body["state"] in states:
            return body
        assert time.monotonic() < deadline, f"job still {body['state']}: {body['reason']}"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_each_parallel_mode_trains_to_success_through_the_service(
    service: tuple[httpx.Client, Path], mode: str
) -> None:
    client, _ = service
    parallel, runtime = MODES[mode]
    answer = client.post("/v1/jobs", json=_job(parallel, runtime))
    assert answer.status_code == 202, answer.text
    job = answer.json()
    done = _wait(client, job["id"], {"succeeded", "failed"})
    assert done["state"] == "succeeded", done["history"]
    plan = done["plan"]["parallel"]
    for key, value in parallel.items():
        assert plan[key] == value
    measured = done["measured"]
    assert measured["steps_run"] == 20
    assert measured["loss_last"] < measured["loss_first"]
    assert len(measured["peak_memory_bytes"]) == done["plan"]["num_gpus"]
    assert measured["step_time_s"] > 0 and measured["tokens_per_s"] > 0
    assert done["predicted"]["peak_allocated_bytes"] > 0 and done["predicted"]["step_time_s"] > 0
    cluster = client.get("/v1/cluster").json()
    assert cluster["gpu_types"]["CPU-SLOT"]["used"] == 0  # slots released


def _rank_pids(agent: int) -> list[int]:
    """Training ranks: the torchrun agent's children (each in its own session), from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat[1]) == agent and "frenzy_opt.launch.worker.train" in cmdline:
            pids.append(int(entry.name))
    return sorted(pids)


@pytest.mark.slow
def test_a_killed_rank_fails_the_attempt_releases_its_slots_and_the_retry_resumes(
    service: tuple[httpx.Client, Path],
) -> None:
    client, runs = service
    slow = {**TRAINING, "train_steps": 20, "seq_len": 64}
    body = {
        "name": "tiny-kill",
        "model": MODEL,
        "training": slow,
        "parallel": {"dp": 2, "tp": 1, "pp": 1, "zero_stage": 0},
    }
    job = client.post("/v1/jobs", json=body).json()
    report = runs / job["id"] / "report.jsonl"
    deadline = time.monotonic() + 120
    while True:  # wait until the first checkpoint (step 5) is written and training is past it
        steps = [json.loads(x) for x in report.read_text().splitlines()] if report.exists() else []
        if any(r.get("event") == "step" and r["step"] >= 7 for r in steps):
            break
        assert time.monotonic() < deadline, "the job never reached step 7"
        time.sleep(0.05)
    pgid = json.loads((runs / job["id"] / "pids").read_text())["pgids"][0]
    victim = _rank_pids(pgid)[-1]
    os.kill(victim, signal.SIGKILL)
    done = _wait(client, job["id"], {"succeeded", "failed"})
    assert done["state"] == "succeeded", done["history"]
    states = [e["state"] for e in done["history"]]
    assert states == ["queued", "scheduled", "running", "failed", "queued", "scheduled", "running", "succeeded"]
    failure = next(e for e in done["history"] if e["state"] == "failed")
    assert "exited with code" in failure["detail"]
    # Each attempt's output is its own: the first ends with the killed rank, the retry completes.
    first = client.get(f"/v1/jobs/{job['id']}/logs", params={"attempt": 1, "offset": 0, "limit": 4 << 20}).text
    retry = client.get(f"/v1/jobs/{job['id']}/logs").text
    assert "step 7/20" in first and "completed 20 steps" not in first
    assert "completed 20 steps" in retry and "step 1/20" not in retry  # resumed from its checkpoint
    assert done["attempts"] == 2
    restarts = [json.loads(x) for x in report.read_text().splitlines() if '"start"' in x]
    assert restarts[-1]["resumed_from"] >= 5  # the retry started from the checkpoint, not from step 0
    assert done["measured"]["loss_last"] < done["measured"]["loss_first"]
    assert client.get("/v1/cluster").json()["gpu_types"]["CPU-SLOT"]["used"] == 0


@pytest.mark.slow
def test_frenzy_launch_runs_the_plan_the_service_would_choose_and_reports_measured_vs_predicted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "tiny.json"
    spec.write_text(json.dumps({"name": "tiny", "model": MODEL, "training": TRAINING}), encoding="utf-8")
    code = main(["launch", str(spec), "--steps", "20", "--workdir", str(tmp_path / "runs"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["state"] == "succeeded"
    for key in ("state", "plan", "placement", "steps_run", "loss_first", "loss_last", "measured", "predicted"):
        assert key in out
    assert out["steps_run"] == 20 and out["loss_last"] < out["loss_first"]
    assert len(out["measured"]["peak_memory_bytes"]) == out["plan"]["num_gpus"]
    assert out["predicted"]["step_time_s"] > 0


@pytest.mark.slow
def test_the_closed_loop_refits_the_cpu_slot_efficiency_from_the_runs(service: tuple[httpx.Client, Path]) -> None:
    """A measured run refits CPU-SLOT's efficiency (its own job, so the test does not depend on the others)."""
    from frenzy_opt.hardware.gpus import lookup_gpu
    from frenzy_opt.planning.plans import DEFAULT_STEP_MODEL

    client, _ = service
    parallel, runtime = MODES["ddp"]
    job = client.post("/v1/jobs", json=_job(parallel, runtime)).json()
    assert _wait(client, job["id"], {"succeeded", "failed"})["state"] == "succeeded"
    body = client.get("/v1/calibration").json()
    entry = body["report"]["CPU-SLOT@fp32"]
    assert body["samples"] >= 1 and entry["samples"] >= 1
    assert entry["step_time_error_after"] <= entry["step_time_error_before"]
    default = DEFAULT_STEP_MODEL.efficiency_of(lookup_gpu("CPU-SLOT"), "fp32")
    assert body["efficiency"]["CPU-SLOT@fp32"] == entry["efficiency_after"] != default
    # The service plans with profile e2e-profile, so its closed loop wrote the refit into the profile.
    from frenzy_opt.prediction.calibrations import CalibrationStore

    profile = CalibrationStore().read("e2e-profile")
    assert profile["parameters"]["efficiency"]["CPU-SLOT@fp32"] == entry["efficiency_after"]
    assert profile["closed_loop"]["CPU-SLOT@fp32"]["samples"] >= 1
    assert all(m["source"] == "MemTracker" for m in body["memory"])
