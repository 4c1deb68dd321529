"""The simulated executor: a job "runs" for its predicted duration, scaled to wall time.

``time_scale`` cluster seconds pass per wall second (3,600: an hour of training per second), so the whole
serverless flow — plan, queue, place, run, complete — can be watched in seconds. Runs live in this process
only: after a restart the executor knows none of them, and the orchestrator fails and retries what was
running (what a real executor would report for processes that died with the node). ``fail_rate`` makes that
fraction of attempts fail half-way (seeded), to exercise retries.

What it "measures" is the prediction itself (marked ``"source": "simulated"``): real measurements come from
the torchrun executor (issue 6). Its log (:meth:`SimulatedExecutor.read_log`) is a line at the start, one per
tenth of the steps done so far by the clock, and one at the end, written from the attempt's timing when read;
the last :data:`KEPT_LOGS` attempts' logs are kept in memory.
"""

from __future__ import annotations

import random
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from frenzy_opt.launch.executors import ExitInfo, Launch, LogChunk, OnExit, OnReport
from frenzy_opt.models.arch import ModelArch
from frenzy_opt.planning.plans import Plan

KEPT_LOGS = 10_000
TENTHS = 10


@dataclass(slots=True)
class _Log:
    """What an attempt's log is written from."""

    launch: Launch
    started: float
    """time.monotonic() at launch."""
    wall_s: float
    """The whole run's wall time (a failing attempt stops half-way)."""
    fails: bool
    ended: float | None = None
    cancelled: bool = False
    why: str | None = None
    """Why it was stopped (a move of the scheduler's), when the orchestrator said."""

    def text(self, now: float) -> str:
        launch, plan = self.launch, self.launch.option.plan
        steps = launch.spec.training.train_steps
        step_s = "unknown" if plan.step_time_s is None else f"{plan.step_time_s:.4g} s"
        lines = [
            f"simulated attempt {launch.attempt} of {launch.job_id}: {launch.option.num_gpus} x "
            f"{launch.option.gpu_type} on {', '.join(launch.nodes)}; {steps} steps of {step_s} predicted, "
            f"{launch.duration_s:,.0f} s in all"
        ]
        elapsed = (min(now, self.ended) if self.ended is not None else now) - self.started
        for tenth in range(1, TENTHS + 1):
            if (self.fails and tenth > TENTHS // 2) or tenth * self.wall_s / TENTHS > elapsed + 1e-9:
                break
            lines.append(
                f"step {steps * tenth // TENTHS}/{steps} ({tenth * 100 // TENTHS} %), "
                f"{launch.duration_s * tenth / TENTHS:,.0f} s in"
            )
        if self.ended is not None:
            if self.cancelled:
                lines.append(f"stopped: {self.why}" if self.why else "stopped: the attempt was cancelled")
            elif self.fails:
                lines.append("failed: simulated failure (rank 0 exited with code 1)")
            else:
                lines.append(f"completed {steps} steps")
        return "".join(line + "\n" for line in lines)


class SimulatedExecutor:
    name = "simulated"
    preemptible = True
    """A cancelled attempt resumes where it stopped (the orchestrator relaunches it with the steps it has
    left), as a real run does from its last checkpoint."""

    def __init__(self, *, time_scale: float = 1.0, fail_rate: float = 0.0, seed: int = 0) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        if not 0 <= fail_rate <= 1:
            raise ValueError(f"fail_rate must be in [0, 1], got {fail_rate}")
        self.time_scale, self.fail_rate = time_scale, fail_rate
        self._rng = random.Random(seed)
        self._timers: dict[str, threading.Timer] = {}
        self._logs: OrderedDict[tuple[str, int], _Log] = OrderedDict()
        self._current: dict[str, _Log] = {}
        """The log of each job's running attempt."""
        self._lock = threading.Lock()

    def launch(self, launch: Launch, on_exit: OnExit, on_report: OnReport | None = None) -> None:
        with self._lock:
            fails = self._rng.random() < self.fail_rate
        wall_s = launch.duration_s / self.time_scale * (0.5 if fails else 1.0)
        plan = launch.option.plan
        measured = {
            "source": "simulated",
            "step_time_s": plan.step_time_s,
            "peak_memory_bytes": [plan.peak_allocated_bytes] * launch.option.num_gpus,
        }

        def finish() -> None:
            with self._lock:
                if self._timers.get(launch.job_id) is not timer:
                    return  # cancelled, or superseded by a later attempt
                del self._timers[launch.job_id]
                del self._current[launch.job_id]
                log.ended = time.monotonic()
            cause = "" if not fails else "simulated failure (rank 0 exited with code 1)"
            on_exit(launch.job_id, launch.attempt, ExitInfo(ok=not fails, cause=cause, measured=measured))

        timer = threading.Timer(wall_s, finish)
        timer.daemon = True
        log = _Log(launch, time.monotonic(), launch.duration_s / self.time_scale, fails)
        with self._lock:
            self._timers[launch.job_id] = timer
            self._logs[(launch.job_id, launch.attempt)] = self._current[launch.job_id] = log
            while len(self._logs) > KEPT_LOGS:
                self._logs.popitem(last=False)
        timer.start()

    def cancel(self, job_id: str, why: str | None = None) -> None:
        with self._lock:
            timer = self._timers.pop(job_id, None)
            log = self._current.pop(job_id, None)
            if log is not None and log.ended is None:
                log.ended, log.cancelled, log.why = time.monotonic(), True, why
        if timer is not None:
            timer.cancel()

    def read_log(self, job_id: str, attempt: int, offset: int | None, limit: int) -> LogChunk | None:
        """The attempt's progress lines (module docstring)."""
        with self._lock:
            log = self._logs.get((job_id, attempt))
            if log is None:
                return None
            data = log.text(time.monotonic()).encode()
        start = max(len(data) - limit, 0) if offset is None else min(max(offset, 0), len(data))
        return LogChunk(data[start : start + limit], start, len(data))

    def running(self) -> set[str]:
        with self._lock:
            return set(self._timers)

    def supports(self, plan: Plan, arch: ModelArch) -> bool:
        """Every plan: nothing really runs."""
        return True

    def plan_filter(self) -> None:
        """None: it supports every plan."""
        return None

    def placement_problem(self, gpu_type: str, gpus_per_node: int) -> str | None:
        """None: simulated GPUs are wherever the cluster file says."""
        return None

    def adopt(self, job_id: str, attempt: int, on_exit: OnExit) -> None:
        """Never called after a restart (runs live in this process only, so :meth:`running` lists none of an
        earlier service's); a direct call reports the run lost."""
        on_exit(job_id, attempt, ExitInfo(ok=False, cause="the simulated executor keeps no runs across a restart"))

    def shutdown(self) -> None:
        with self._lock:
            timers, self._timers = list(self._timers.values()), {}
            for log in self._current.values():
                log.ended, log.cancelled = time.monotonic(), True
            self._current.clear()
        for timer in timers:
            timer.cancel()
