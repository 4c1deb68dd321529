"""The local executor across a service restart and the launcher's refusals, without training anything.

A restart is a fresh :class:`LocalExecutor` on the same run folder; the run it adopts is a stand-in process
group (``sleep``) with the ``pids`` file and worker report a real attempt leaves behind, so what is checked
is the executor's bookkeeping (the contract in :mod:`frenzy_opt.launch.executors`): adopted runs are registered
(devices taken, cancel and shutdown stop them), and a run that finished while the service was down is
reported from its report's ``end`` record instead of being retried as lost.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from frenzy_opt.launch.executors import ExitInfo
from frenzy_opt.launch.executors.local import LocalExecutor

REPORT = [
    {"event": "start", "resumed_from": 0, "world": 2, "backend": "gloo"},
    {"event": "memory", "step": 1, "peak_memory_bytes": [1000, 1000], "source": "MemTracker"},
    {"event": "step", "step": 1, "loss": 5.0, "step_time_s": 0.2, "tokens_per_s": 100.0},
    {"event": "step", "step": 2, "loss": 4.0, "step_time_s": 0.1, "tokens_per_s": 200.0},
]
END = {"event": "end", "steps": 2}


class Exits:
    """An ``on_exit`` callback that records what it is told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, ExitInfo]] = []
        self.done = threading.Event()

    def __call__(self, job_id: str, attempt: int, info: ExitInfo) -> None:
        self.calls.append((job_id, attempt, info))
        self.done.set()


def _run_folder(workdir: Path, job: str, pgids: list[int], records: list[dict[str, Any]], **devices: list[int]) -> None:
    folder = workdir / job
    folder.mkdir(parents=True)
    pids = {"attempt": 1, "pgids": pgids, "devices": devices}
    (folder / "pids").write_text(json.dumps(pids), encoding="utf-8")
    (folder / "report.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def _group() -> subprocess.Popen[bytes]:
    """A live process group standing in for a torchrun agent started by the previous service process."""
    return subprocess.Popen(["sleep", "600"], start_new_session=True)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()
    return proc.pid


def _gone(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> bool:
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False
    return True


@pytest.mark.parametrize("stop", ["cancel", "shutdown"])
def test_an_adopted_run_takes_its_devices_and_cancel_or_shutdown_stops_it(tmp_path: Path, stop: str) -> None:
    proc = _group()
    _run_folder(tmp_path, "job-a", [proc.pid], REPORT[:3], node0=[0, 1])
    executor = LocalExecutor(tmp_path, grace_s=2)
    exits = Exits()
    assert executor.running() == {"job-a"}
    executor.adopt("job-a", 1, exits)
    assert executor.devices_in_use() == {"node0": {0, 1}}  # the next launch on node0 gets devices 2, 3
    if stop == "cancel":
        executor.cancel("job-a")
    else:
        executor.shutdown()
    assert _gone(proc), f"{stop} left the adopted process group running"
    deadline = time.monotonic() + 5
    while executor.devices_in_use() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert executor.devices_in_use() == {}
    assert exits.calls == []  # a cancelled attempt reports nothing, as a launched one


def test_a_run_that_finished_while_the_service_was_down_is_adopted_and_succeeds_at_once(tmp_path: Path) -> None:
    _run_folder(tmp_path, "job-done", [_dead_pid()], [*REPORT, END])
    _run_folder(tmp_path, "job-died", [_dead_pid()], REPORT)  # died mid-run: no end record
    executor = LocalExecutor(tmp_path)
    assert executor.running() == {"job-done"}  # job-died is left to the orchestrator's retry
    exits = Exits()
    executor.adopt("job-done", 1, exits)
    assert exits.done.wait(5)
    ((job, attempt, info),) = exits.calls
    assert (job, attempt, info.ok, info.cause) == ("job-done", 1, True, "")
    assert info.measured["steps_run"] == 2 and info.measured["loss_last"] == 4.0
    assert info.measured["peak_memory_bytes"] == [1000, 1000]


def test_an_adopted_run_that_dies_without_its_end_record_fails_with_the_cause(tmp_path: Path) -> None:
    proc = _group()
    _run_folder(tmp_path, "job-b", [proc.pid], REPORT)
    executor = LocalExecutor(tmp_path)
    exits = Exits()
    executor.adopt("job-b", 1, exits)
    proc.kill()
    proc.wait()
    assert exits.done.wait(5)
    ((_, _, info),) = exits.calls
    assert not info.ok and "without the worker's end record" in info.cause
    assert info.measured["steps_run"] == 2


def test_adopting_another_attempt_than_the_run_folder_holds_fails_at_once(tmp_path: Path) -> None:
    _run_folder(tmp_path, "job-c", [_dead_pid()], [*REPORT, END])
    exits = Exits()
    LocalExecutor(tmp_path).adopt("job-c", 2, exits)
    assert exits.done.wait(5)
    ((_, attempt, info),) = exits.calls
    assert attempt == 2 and not info.ok and "holds attempt 1, not attempt 2" in info.cause


# --- what the planner offers the local executor -----------------------------------------------------------

TINY = {
    "name": "tiny",
    "model": {"num_layers": 4, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4,
              "num_kv_heads": 2, "vocab_size": 256, "mlp": "swiglu", "norm": "rmsnorm", "tied_embeddings": False},
    "training": {"seq_len": 32, "micro_batch_size": 2, "global_batch_size": 8, "train_steps": 4, "precision": "fp32"},
}  # fmt: skip


def _local_options(job: dict[str, Any]) -> list[Any]:
    from frenzy_opt.core.spec import parse_job
    from frenzy_opt.hardware.topology import Topology
    from frenzy_opt.planning.problem import OptionCache
    from frenzy_opt.planning.scenario import load_cluster_ref

    cluster = load_cluster_ref("local-4slot")
    executor = LocalExecutor(Path("unused-runs"))
    spec = parse_job(job)
    cache = OptionCache(cluster, Topology(cluster), plan_filter=lambda plan, s: executor.supports(plan, s.model))
    return list(cache.options(spec))


def test_a_pinned_dp2_tp2_layout_gets_the_zero0_plan_the_dominance_rule_had_pruned() -> None:
    """Megatron's distributed optimizer (ZeRO 1) is the planner's choice at dp > 1, and the worker cannot run it
    with tp > 1: the filter runs before that rule, so the ZeRO-0 layout stands in."""
    options = _local_options({**TINY, "parallel": {"dp": 2, "tp": 2}})
    assert options, "no plan the local executor can run"
    for option in options:
        p = option.plan.parallel
        assert (p.dp, p.tp, p.zero_stage) == (2, 2, 0)


@pytest.mark.parametrize("runtime", ["megatron", "fsdp2", "deepspeed"])
def test_every_plan_offered_to_the_local_executor_is_one_the_worker_accepts(runtime: str) -> None:
    """The worker's refusals (train.check_plan, and torch's 1F1B needing at least pp micro-batches) against
    what the planner offers through the executor's filter, for every pipeline depth the tiny job allows."""
    from frenzy_opt.core.spec import parse_job
    from frenzy_opt.launch.worker.support import worker_supports
    from frenzy_opt.launch.worker.train import check_plan
    from frenzy_opt.planning.plans import enumerate_plans
    from frenzy_opt.planning.scenario import load_cluster_ref

    for pp in (2, 4):
        job = {**TINY, "training": {**TINY["training"], "runtime": runtime}, "parallel": {"pp": pp}}
        spec = parse_job(job)
        unfiltered = enumerate_plans(spec, load_cluster_ref("local-4slot")).plans
        assert any((p.num_micro_batches or 0) < pp for p in unfiltered)  # the planner alone offers them
        for option in _local_options(job):
            plan = option.plan
            assert worker_supports(plan.parallel, spec.model, plan.num_micro_batches) is None
            micro = check_plan(spec, plan.parallel, plan.micro_batch_size, plan.num_gpus)
            assert micro == plan.num_micro_batches and micro >= plan.parallel.pp


def test_fewer_micro_batches_than_pipeline_stages_are_refused_with_the_reason() -> None:
    from frenzy_opt.core.spec import ParallelConfig, parse_job
    from frenzy_opt.launch.worker.support import worker_supports

    arch = parse_job(TINY).model
    why = worker_supports(ParallelConfig(dp=2, pp=2, zero_stage=3), arch, num_micro_batches=1)
    assert why is not None and "pp=2 with 1 micro-batch" in why
    assert worker_supports(ParallelConfig(dp=2, pp=2, zero_stage=3), arch, num_micro_batches=2) is None


@pytest.mark.slow
def test_frenzy_launch_trains_a_pinned_dp2_tp2_layout_on_the_cpu_slots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from frenzy_opt.cli import main

    spec = tmp_path / "tiny.json"
    spec.write_text(json.dumps({**TINY, "parallel": {"dp": 2, "tp": 2}}), encoding="utf-8")
    code = main(["launch", str(spec), "--cluster", "local-4slot", "--steps", "3", "--workdir", str(tmp_path), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["state"] == "succeeded", out["cause"]
    assert (out["plan"]["parallel"]["dp"], out["plan"]["parallel"]["tp"]) == (2, 2) and out["steps_run"] == 3
