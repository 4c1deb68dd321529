"""The runtime capability table (frenzy_opt/core/runtimes.py) bounds the plan space, refuses pinned fields
outside it naming the runtime, and reaches the worker and the reference page; a pinned micro-batch is kept."""

from __future__ import annotations

import json
from typing import Any

import pytest

from frenzy_opt.cli import main
from frenzy_opt.cli.fieldref import render
from frenzy_opt.core.runtimes import CAPABILITIES, capability_table, runtime_refusal
from frenzy_opt.core.spec import JobSpec, ParallelConfig, parse_job
from frenzy_opt.hardware.cluster import parse_cluster
from frenzy_opt.planning.candidates import MICRO_BATCH_CHOICES
from frenzy_opt.planning.plans import enumerate_plans

CLUSTER = parse_cluster(
    {
        "name": "runtimes",
        "node_groups": [{"gpu": "A100-SXM4-80GB", "num_nodes": 2, "gpus_per_node": 8}],
        "network": {"inter_node_gbps": 100},
    }
)


def _job(runtime: str, model: str = "llama2-7b", parallel: dict[str, Any] | None = None, **training: Any) -> JobSpec:
    train = {"seq_len": 2048, "global_batch_size": 32, "runtime": runtime, **training}
    return parse_job({"model": model, "training": train, "parallel": parallel or {}})


def _refusal(runtime: str, p: ParallelConfig, precision: str = "bf16") -> str | None:
    return runtime_refusal(
        runtime, tp=p.tp, pp=p.pp, vpp=p.vpp, cp=p.cp, ep=p.ep, sequence_parallel=p.sequence_parallel,
        zero_stage=p.zero_stage, recompute=p.recompute, precision=precision,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("runtime", "model"), [(r.value, m) for r in CAPABILITIES for m in ("gpt3-1.3b", "mixtral-8x7b")]
)
def test_every_plan_lies_inside_its_runtimes_row(runtime: str, model: str) -> None:
    search = enumerate_plans(_job(runtime, model), CLUSTER)
    assert search.plans or runtime == "hf"  # hf keeps 16 bytes a parameter on every GPU: mixtral fits nowhere
    for plan in search.plans:
        assert _refusal(runtime, plan.parallel) is None, (runtime, plan.parallel)


def test_hf_gets_data_parallel_plans_only() -> None:
    plans = enumerate_plans(_job("hf", "gpt3-1.3b"), CLUSTER).plans
    assert plans
    assert {(p.parallel.tp, p.parallel.pp, p.parallel.cp, p.parallel.vpp) for p in plans} == {(1, 1, 1, 1)}
    assert not any(p.parallel.sequence_parallel for p in plans)
    assert {p.parallel.recompute for p in plans} <= {"none", "full"}
    assert {p.parallel.zero_stage for p in plans} == {0}


def test_deepspeed_plans_keep_its_pipeline_and_autotp_limits() -> None:
    plans = enumerate_plans(_job("deepspeed", "llama2-13b"), CLUSTER).plans
    assert any(p.parallel.pp > 1 for p in plans) and any(p.parallel.tp > 1 for p in plans)
    assert all(p.parallel.vpp == 1 and p.parallel.cp == 1 and not p.parallel.sequence_parallel for p in plans)
    assert all(p.parallel.zero_stage <= 1 for p in plans if p.parallel.pp > 1)
    assert all(p.parallel.zero_stage <= 2 for p in plans if p.parallel.tp > 1)
    assert "selective" not in {p.parallel.recompute for p in plans}


def test_fsdp2_runs_sequence_parallel_whenever_it_runs_tp() -> None:
    plans = enumerate_plans(_job("fsdp2", "llama2-13b"), CLUSTER).plans
    assert any(p.parallel.tp > 1 for p in plans)
    assert all(p.parallel.sequence_parallel == (p.parallel.tp > 1) for p in plans)
    assert _job("fsdp2", parallel={"tp": 2}).parallel.sequence_parallel  # the parser's default follows the row


@pytest.mark.parametrize(
    ("runtime", "parallel", "training", "words"),
    [
        ("hf", {"tp": 2}, {}, "parallel.tp 2 is not available with training.runtime hf"),
        ("hf", {"pp": 2}, {}, "parallel.pp 2 is not available with training.runtime hf"),
        ("hf", {"recompute": "selective"}, {}, "parallel.recompute selective is not available with training.runtime"),
        ("hf", {}, {"precision": "fp8"}, "training.precision fp8 is not available with training.runtime hf"),
        ("deepspeed", {"pp": 2, "vpp": 2}, {}, "parallel.vpp 2 is not available with training.runtime deepspeed"),
        ("deepspeed", {"cp": 2}, {}, "parallel.cp 2 is not available with training.runtime deepspeed"),
        ("deepspeed", {"dp": 2, "pp": 2, "zero_stage": 2}, {}, "zero_stage 2 is not available with training.runtime"),
        ("deepspeed", {"tp": 2, "sequence_parallel": True}, {}, "sequence_parallel true with tp 2"),
        ("fsdp2", {"tp": 2, "sequence_parallel": False}, {}, "sequence_parallel false with tp 2"),
    ],
)  # fmt: skip
def test_a_pinned_field_outside_the_row_is_refused_naming_the_runtime(
    runtime: str, parallel: dict[str, Any], training: dict[str, Any], words: str
) -> None:
    with pytest.raises(ValueError, match="allowed: ") as err:
        _job(runtime, parallel=parallel, **training)
    assert words in str(err.value)


def test_the_worker_refuses_a_plan_its_jobs_runtime_cannot_run() -> None:
    pytest.importorskip("torch")
    from frenzy_opt.launch.worker.train import check_plan

    job = _job("hf", "gpt3-125m", seq_len=256, global_batch_size=8)
    with pytest.raises(ValueError, match=r"train: parallel\.tp 2 is not available with training\.runtime hf"):
        check_plan(job, ParallelConfig(dp=2, tp=2), 2, 4)
    assert check_plan(job, ParallelConfig(dp=2), 2, 2) == 2


def test_the_reference_page_prints_the_table() -> None:
    page = render()
    for row in capability_table():
        assert "| " + " | ".join(row) + " |" in page
    assert "| hf (Hugging Face Trainer on DDP with autocast) | 1 only |" in page


# --- item 3: a pinned micro-batch -----------------------------------------------------------------------


def test_a_pinned_micro_batch_is_kept_and_an_unpinned_one_searched() -> None:
    free = enumerate_plans(_job("megatron", "gpt3-1.3b", micro_batch_size=2), CLUSTER).plans
    assert len({p.micro_batch_size for p in free}) > 1
    pinned = _job("megatron", "gpt3-1.3b", micro_batch_size=2, pin_micro_batch=True)
    assert "micro_batch_size" in pinned.pinned
    plans = enumerate_plans(pinned, CLUSTER).plans
    assert plans and {p.micro_batch_size for p in plans} == {2}
    again = parse_job(pinned.to_mapping())
    assert again == pinned  # the flag round-trips through the contract-1 mapping


def test_pin_micro_batch_must_be_a_boolean() -> None:
    with pytest.raises(ValueError, match=r"training\.pin_micro_batch must be true or false"):
        _job("megatron", pin_micro_batch="yes")


def test_plan_says_whether_the_micro_batch_was_pinned(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    spec = {"model": "gpt3-125m", "training": {"seq_len": 1024, "global_batch_size": 16, "micro_batch_size": 2}}
    cluster = tmp_path / "c.yaml"
    cluster.write_text(
        json.dumps({"name": "c", "node_groups": [{"gpu": "A100-SXM4-80GB", "num_nodes": 1, "gpus_per_node": 8}]})
    )
    for pin, expected in ((True, {"pinned": True, "searched": [2]}), (False, None)):
        path = tmp_path / f"job-{pin}.json"
        path.write_text(json.dumps({**spec, "training": {**spec["training"], "pin_micro_batch": pin}}))
        assert main(["plan", str(path), "--cluster", str(cluster), "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        if expected is not None:
            assert out["micro_batch"] == expected
            assert {p["micro_batch_size"] for p in out["plans"]} == {2}
        else:
            assert out["micro_batch"] == {"pinned": False, "searched": [m for m in MICRO_BATCH_CHOICES if 16 % m == 0]}
        assert main(["plan", str(path), "--cluster", str(cluster)]) == 0
        text = capsys.readouterr().out
        assert ("micro-batch: pinned at 2" in text) == pin
        assert ("micro-batch: searched over" in text) != pin


def test_the_api_refuses_outside_the_row_and_reports_the_micro_batch(tmp_path: Any) -> None:
    from factories import simulated_service
    from fastapi.testclient import TestClient

    from frenzy_opt.api.app import create_app

    config = simulated_service(f"sqlite:///{tmp_path / 'jobs.db'}", 1e9, None, decision_wait_s=5.0)
    body = {"model": "gpt3-125m", "training": {"seq_len": 1024, "global_batch_size": 16, "runtime": "hf"}}
    with TestClient(create_app(config)) as client:
        refused = client.post("/v1/plans", json={**body, "parallel": {"tp": 2}})
        assert refused.status_code == 422
        assert "parallel.tp 2 is not available with training.runtime hf" in refused.text
        refused = client.post("/v1/jobs", json={**body, "parallel": {"tp": 2}})
        assert refused.status_code == 422 and "training.runtime hf" in refused.text
        pinned = {**body, "training": {**body["training"], "micro_batch_size": 2, "pin_micro_batch": True}}
        answer = client.post("/v1/plans", json=pinned).json()
        assert answer["micro_batch"] == {"pinned": True, "searched": [2]}
        assert {p["micro_batch_size"] for p in answer["plans"]} == {2}
        assert all(p["parallel"]["tp"] == 1 and p["parallel"]["pp"] == 1 for p in answer["plans"])
        assert client.post("/v1/plans", json=body).json()["micro_batch"]["pinned"] is False
