"""The torch.distributed training worker under torchrun (gloo on CPU): every parallel layout starts from the
same weights and data, so its losses equal the single-process run's; a run killed mid-way resumes from its
checkpoint onto the same trajectory. Each torchrun start costs seconds here: the layouts are few and tiny."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TINY = {
    "name": "tiny",
    "model": {
        "num_layers": 4, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4, "num_kv_heads": 2,
        "vocab_size": 256, "mlp": "swiglu", "norm": "rmsnorm", "tied_embeddings": False,
    },
    "training": {"seq_len": 32, "micro_batch_size": 2, "global_batch_size": 8, "train_steps": 20, "precision": "fp32"},
}  # fmt: skip
LAYOUTS = {
    "ddp": {"dp": 2},
    "fsdp2": {"dp": 2, "zero_stage": 3},
    "zero1": {"dp": 2, "zero_stage": 1},
    "tp": {"tp": 2},
    "tp + sequence parallel": {"tp": 2, "sequence_parallel": True},
    "pp": {"pp": 2},
    "pp interleaved (vpp 2)": {"pp": 2, "vpp": 2},
    "pp x tp": {"pp": 2, "tp": 2},
    "hsdp dp x tp": {"dp": 2, "tp": 2, "zero_stage": 3},
}


def run_worker(tmp: Path, parallel: dict[str, int], *extra: str, steps: int = 3) -> tuple[int, list[dict[str, Any]]]:
    """torchrun the worker; its exit code and report lines."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "job.json").write_text(json.dumps(TINY), encoding="utf-8")
    (tmp / "plan.json").write_text(json.dumps({"parallel": parallel, "micro_batch_size": 2}), encoding="utf-8")
    report = tmp / "report.jsonl"
    ranks = parallel.get("dp", 1) * parallel.get("tp", 1) * parallel.get("pp", 1)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    command += ["-m", "frenzy_opt.train", "--job", "job.json", "--plan", "plan.json", "--steps", str(steps)]
    command += ["--report", str(report), "--cpu", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONSAFEPATH": "1"}
    done = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    lines = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()] if report.exists() else []
    return done.returncode, lines


def losses(lines: list[dict[str, Any]]) -> list[float]:
    return [r["loss"] for r in lines if r["event"] == "step"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    code, lines = run_worker(tmp_path_factory.mktemp("single"), {})
    assert code == 0
    return losses(lines)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_layout_reproduces_the_single_process_losses(tmp_path: Path, reference: list[float], name: str) -> None:
    code, lines = run_worker(tmp_path, LAYOUTS[name])
    assert code == 0
    assert losses(lines) == pytest.approx(reference, rel=1e-4)
    assert reference[-1] < reference[0]
    memory = next(r for r in lines if r["event"] == "memory")
    ranks = LAYOUTS[name].get("dp", 1) * LAYOUTS[name].get("tp", 1) * LAYOUTS[name].get("pp", 1)
    assert len(memory["peak_memory_bytes"]) == ranks and all(m > 0 for m in memory["peak_memory_bytes"])
    start = lines[0]
    assert (
        start["event"] == "start"
        and start["backend"] == "gloo"
        and start["num_micro"] == 8 // (2 * LAYOUTS[name].get("dp", 1))
    )


@pytest.mark.slow
def test_a_killed_rank_fails_the_run_and_the_rerun_resumes_on_the_same_trajectory(tmp_path: Path) -> None:
    straight_code, straight = run_worker(tmp_path / "straight", {"dp": 2}, steps=6)
    assert straight_code == 0
    checkpoint = ["--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "2"]
    code, first = run_worker(
        tmp_path / "run", {"dp": 2}, *checkpoint, "--fail-at-step", "3", "--fail-rank", "1", steps=6
    )
    assert code != 0 and len(losses(first)) == 3
    code, second = run_worker(tmp_path / "run", {"dp": 2}, *checkpoint, steps=6)
    assert code == 0
    resumed = [r for r in second if r["event"] == "start"][-1]["resumed_from"]
    assert resumed == 2
    tail = [r["loss"] for r in second if r["event"] == "step" and r["step"] > 3]
    assert tail == pytest.approx(losses(straight)[3:], rel=1e-5)


def test_unsupported_plans_are_refused_with_the_reason() -> None:
    from frenzy_opt.spec import ParallelConfig, parse_job
    from frenzy_opt.train import check_plan

    job = parse_job(TINY)
    with pytest.raises(ValueError, match="cp=2"):
        check_plan(job, ParallelConfig(cp=2), 2, 2)
    with pytest.raises(ValueError, match="torchrun started 4"):
        check_plan(job, ParallelConfig(dp=2), 2, 4)
    with pytest.raises(ValueError, match="multiple of micro_batch_size x dp = 6"):
        check_plan(job, ParallelConfig(dp=3), 2, 3)
    assert check_plan(job, ParallelConfig(dp=2, tp=2), 2, 4) == 2


def test_token_files_feed_windows_of_the_file_and_synthetic_data_is_learnable(tmp_path: Path) -> None:
    import numpy as np

    from frenzy_opt.spec import parse_job
    from frenzy_opt.train import batch_for

    job = parse_job(TINY)
    tokens = np.arange(10_000, dtype=np.uint16) % 256
    path = tmp_path / "tokens.bin"
    tokens.tofile(path)
    mapped = np.memmap(path, dtype="uint16", mode="r")
    inputs, targets = batch_for(3, job, 0, mapped)
    assert inputs.shape == targets.shape == (8, 32)
    assert bool(((inputs[:, 1:] - inputs[:, :-1]) % 256 == 1).all())  # contiguous windows of the file
    assert bool((targets[:, :-1] == inputs[:, 1:]).all())
    again, _ = batch_for(3, job, 0, mapped)
    assert bool((again == inputs).all())  # the same step gives the same batch on every rank and layout
    synthetic, synthetic_targets = batch_for(3, job, 0, None)
    assert bool((synthetic_targets == (synthetic + 1) % 256).all())
