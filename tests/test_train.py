"""The torch.distributed training worker under torchrun (gloo on CPU): every parallel layout starts from the
same weights and data, so its losses equal the single-process run's; a run killed mid-way resumes from its
checkpoint onto the same trajectory. Each torchrun start costs seconds here, so the layouts of one world size
train one after another in one torchrun (``--plan`` with a list), each torn down before the next."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
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
LAYOUTS: dict[str, dict[str, Any]] = {
    "ddp": {"dp": 2},
    "fsdp2": {"dp": 2, "zero_stage": 3},
    "zero1": {"dp": 2, "zero_stage": 1},
    "tp": {"tp": 2},
    "tp + sequence parallel": {"tp": 2, "sequence_parallel": True},
    "pp": {"pp": 2},
    "pp interleaved (vpp 2)": {"pp": 2, "vpp": 2},
    "pp x tp": {"pp": 2, "tp": 2},
    "hsdp dp x tp": {"dp": 2, "tp": 2, "zero_stage": 3},
    "fsdp2 x pp": {"dp": 2, "pp": 2, "zero_stage": 3},
}
# What the worker prints when a process group (or a thread) outlived its teardown: the cause of the gloo
# "terminate called without an active exception" at interpreter exit that made these tests flaky.
LINGERING = "threads still alive after destroy_process_group"


def ranks(parallel: dict[str, Any]) -> int:
    return int(parallel.get("dp", 1) * parallel.get("tp", 1) * parallel.get("pp", 1))


@dataclass
class Run:
    """One torchrun of the worker: its exit code, rank 0's report lines and the captured stderr."""

    code: int
    lines: list[dict[str, Any]]
    stderr: str

    def why(self) -> str:
        """The tail of torchrun's stderr (the ranks' own output included), for assertion messages."""
        return f"torchrun exited {self.code}; stderr (tail):\n{self.stderr[-8000:]}"

    def assert_ok(self) -> None:
        assert self.code == 0, self.why()
        assert LINGERING not in self.stderr, self.why()


def run_worker(tmp: Path, parallel: dict[str, Any] | list[dict[str, Any]], *extra: str, steps: int = 3) -> Run:
    """torchrun the worker on one plan, or on several plans of one world size in turn."""
    tmp.mkdir(parents=True, exist_ok=True)
    layouts = parallel if isinstance(parallel, list) else [parallel]
    plans = [{"parallel": p, "micro_batch_size": 2} for p in layouts]
    (tmp / "job.json").write_text(json.dumps(TINY), encoding="utf-8")
    plan = plans if isinstance(parallel, list) else plans[0]
    (tmp / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    report = tmp / "report.jsonl"
    (world,) = {ranks(p) for p in layouts}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}"]
    command += [
        "-m",
        "frenzy_opt.launch.worker.train",
        "--job",
        "job.json",
        "--plan",
        "plan.json",
        "--steps",
        str(steps),
    ]
    command += ["--report", str(report), "--cpu", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    lines = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()] if report.exists() else []
    return Run(done.returncode, lines, done.stderr)


def losses(lines: list[dict[str, Any]]) -> list[float]:
    return [r["loss"] for r in lines if r["event"] == "step"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    run = run_worker(tmp_path_factory.mktemp("single"), {})
    run.assert_ok()
    return losses(run.lines)


def layout_problems(name: str, lines: list[dict[str, Any]], reference: list[float]) -> list[str]:
    """What is wrong with one layout's report lines (nothing: an empty list)."""
    parallel = LAYOUTS[name]
    problems = []
    if losses(lines) != pytest.approx(reference, rel=1e-4):
        problems.append(f"losses {losses(lines)} != single-process {reference}")
    memory = [r for r in lines if r["event"] == "memory"]
    peaks = memory[0]["peak_memory_bytes"] if memory else []
    if len(peaks) != ranks(parallel) or not all(m > 0 for m in peaks):
        problems.append(f"peak memory per rank: {peaks}")
    start = lines[0] if lines else {}
    expected = {"event": "start", "backend": "gloo", "num_micro": 8 // (2 * parallel.get("dp", 1))}
    if {k: start.get(k) for k in expected} != expected:
        problems.append(f"start event {start} lacks {expected}")
    return [f"{name}: {p}" for p in problems]


@pytest.mark.slow
@pytest.mark.parametrize("world", sorted({ranks(p) for p in LAYOUTS.values()}))
def test_every_layout_reproduces_the_single_process_losses(tmp_path: Path, reference: list[float], world: int) -> None:
    names = [name for name, parallel in LAYOUTS.items() if ranks(parallel) == world]
    run = run_worker(tmp_path, [LAYOUTS[name] for name in names])
    run.assert_ok()
    assert reference[-1] < reference[0]
    problems = []
    for index, name in enumerate(names):
        problems += layout_problems(name, [r for r in run.lines if r.get("run") == index], reference)
    assert not problems, "\n".join(problems)


def test_a_layout_that_does_not_match_is_reported() -> None:
    """The comparison above can fail: a wrong loss, a missing rank's memory and a wrong start are named."""
    reference = [5.0, 4.0, 3.0]
    lines = [
        {"event": "start", "backend": "gloo", "num_micro": 4},
        {"event": "memory", "peak_memory_bytes": [10]},
        *({"event": "step", "loss": loss} for loss in (5.0, 4.0, 3.01)),
    ]
    problems = layout_problems("ddp", lines, reference)
    assert len(problems) == 3 and all(p.startswith("ddp: ") for p in problems)
    good = [{"event": "start", "backend": "gloo", "num_micro": 2}, {"event": "memory", "peak_memory_bytes": [1, 1]}]
    assert layout_problems("ddp", [*good, *({"event": "step", "loss": x} for x in reference)], reference) == []


@pytest.mark.slow
def test_a_killed_rank_fails_the_run_and_the_rerun_resumes_on_the_same_trajectory(tmp_path: Path) -> None:
    straight = run_worker(tmp_path / "straight", {"dp": 2}, steps=6)
    straight.assert_ok()
    checkpoint = ["--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "2"]
    first = run_worker(tmp_path / "run", {"dp": 2}, *checkpoint, "--fail-at-step", "3", "--fail-rank", "1", steps=6)
    assert first.code != 0 and len(losses(first.lines)) == 3, first.why()
    second = run_worker(tmp_path / "run", {"dp": 2}, *checkpoint, steps=6)
    second.assert_ok()
    resumed = [r for r in second.lines if r["event"] == "start"][-1]["resumed_from"]
    assert resumed == 2
    tail = [r["loss"] for r in second.lines if r["event"] == "step" and r["step"] > 3]
    assert tail == pytest.approx(losses(straight.lines)[3:], rel=1e-5)


def test_unsupported_plans_are_refused_with_the_reason() -> None:
    from frenzy_opt.core.spec import ParallelConfig, parse_job
    from frenzy_opt.launch.worker.train import check_plan

    job = parse_job(TINY)
    with pytest.raises(ValueError, match="cp=2"):
        check_plan(job, ParallelConfig(cp=2), 2, 2)
    with pytest.raises(ValueError, match="torchrun started 4"):
        check_plan(job, ParallelConfig(dp=2), 2, 4)
    with pytest.raises(ValueError, match="multiple of micro_batch_size x dp = 6"):
        check_plan(job, ParallelConfig(dp=3), 2, 3)
    assert check_plan(job, ParallelConfig(dp=2, tp=2), 2, 4) == 2
    assert check_plan(job, ParallelConfig(dp=2, pp=2, zero_stage=3), 2, 4) == 2  # FSDP2 x pp runs
    with pytest.raises(ValueError, match="1F1B needs at least pp"):  # the executors' filter's own words
        check_plan(job, ParallelConfig(dp=2, pp=2), job.training.global_batch_size // 2, 4)
    with pytest.raises(ValueError, match="sequence_parallel with pp > 1"):
        check_plan(job, ParallelConfig(dp=2, pp=2, zero_stage=2, sequence_parallel=True, tp=2), 2, 8)


def test_token_files_feed_windows_of_the_file_and_synthetic_data_is_learnable(tmp_path: Path) -> None:
    import numpy as np

    from frenzy_opt.core.spec import parse_job
    from frenzy_opt.launch.worker.train import batch_for

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
