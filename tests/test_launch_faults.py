"""The local executor across a service restart and the launcher's refusals, without training anything.

A restart is a fresh :class:`LocalExecutor` on the same run folder; the run it adopts is a stand-in process
group (``sleep``) with the ``pids`` file and worker report a real attempt leaves behind, so what is checked
is the executor's bookkeeping (the contract in :mod:`frenzy_opt.executors`): adopted runs are registered
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

from frenzy_opt.executors import ExitInfo
from frenzy_opt.executors.local import LocalExecutor

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
