"""The simulated executor: a job "runs" for its predicted duration, scaled to wall time.

``time_scale`` cluster seconds pass per wall second (3,600: an hour of training per second), so the whole
serverless flow — plan, queue, place, run, complete — can be watched in seconds. Runs live in this process
only: after a restart the executor knows none of them, and the orchestrator fails and retries what was
running (what a real executor would report for processes that died with the node). ``fail_rate`` makes that
fraction of attempts fail half-way (seeded), to exercise retries.

What it "measures" is the prediction itself (marked ``"source": "simulated"``): real measurements come from
the torchrun executor (issue 6).
"""

from __future__ import annotations

import random
import threading

from frenzy_opt.launch.executors import ExitInfo, Launch, OnExit, OnReport
from frenzy_opt.models.arch import ModelArch
from frenzy_opt.planning.plans import Plan


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
            cause = "" if not fails else "simulated failure (rank 0 exited with code 1)"
            on_exit(launch.job_id, launch.attempt, ExitInfo(ok=not fails, cause=cause, measured=measured))

        timer = threading.Timer(wall_s, finish)
        timer.daemon = True
        with self._lock:
            self._timers[launch.job_id] = timer
        timer.start()

    def cancel(self, job_id: str) -> None:
        with self._lock:
            timer = self._timers.pop(job_id, None)
        if timer is not None:
            timer.cancel()

    def running(self) -> set[str]:
        with self._lock:
            return set(self._timers)

    def supports(self, plan: Plan, arch: ModelArch) -> bool:
        """Every plan: nothing really runs."""
        return True

    def adopt(self, job_id: str, attempt: int, on_exit: OnExit) -> None:
        """Never called after a restart (runs live in this process only, so :meth:`running` lists none of an
        earlier service's); a direct call reports the run lost."""
        on_exit(job_id, attempt, ExitInfo(ok=False, cause="the simulated executor keeps no runs across a restart"))

    def shutdown(self) -> None:
        with self._lock:
            timers, self._timers = list(self._timers.values()), {}
        for timer in timers:
            timer.cancel()
