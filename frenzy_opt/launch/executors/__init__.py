"""The executor protocol: how the orchestrator hands a placement to something that runs it.

An executor starts one attempt of a job on the GPUs of its placement (:meth:`Executor.launch`), reports its
end through the ``on_exit`` callback (from any thread), stops it on request (:meth:`Executor.cancel`) and
says which jobs it is still running (:meth:`Executor.running`) so that the orchestrator can reconcile after
a restart. Executors: ``simulated`` (:mod:`frenzy_opt.launch.executors.simulated`, time scaled, the embedded
default), ``local`` (:mod:`frenzy_opt.launch.executors.local`, torchrun processes running
:mod:`frenzy_opt.launch.worker.train`) and ``ray`` (:mod:`frenzy_opt.launch.executors.ray`, a placement group
and one actor per rank; ``RAY_ADDRESS`` names the cluster). The protocol is :class:`Executor` (below):
besides launching it says which plans it can run (``supports``: the planner offers only those), whether a
stopped attempt resumes (``preemptible``) and takes over runs that survived a restart (``adopt``).

Recovery contract (the orchestrator's ``recover()``): after a restart it calls :meth:`Executor.running` and,
for every active job in it, ``adopt(job_id, attempt, on_exit)``; any other active job is retried as lost.
So ``running()`` lists the jobs whose processes are alive *and* those that finished while the service was
down (the local executor: a report ending with the worker's ``end`` record, whatever the exit). ``adopt``
registers the run as if this executor had launched it — its devices are taken and :meth:`Executor.cancel`
and :meth:`Executor.shutdown` stop it — and reports its end through ``on_exit`` (from any thread; at once for
a run that already ended): ``ok=True`` with the measured summary when the run's own record says it
completed, else ``ok=False`` with the cause.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from frenzy_opt.core.registry import Registry
from frenzy_opt.core.spec import JobSpec
from frenzy_opt.planning.problem import Option, PlanFilter

if TYPE_CHECKING:
    from frenzy_opt.models.arch import ModelArch
    from frenzy_opt.planning.plans import Plan


@dataclass(frozen=True, slots=True, kw_only=True)
class Launch:
    """One attempt of a job on its placement."""

    job_id: str
    attempt: int
    spec: JobSpec
    option: Option
    """The plan chosen (GPU type, count, parallel config, predicted memory and step time)."""
    nodes: tuple[str, ...]
    """Node names, one per node the placement takes."""
    gpus_per_node: int
    duration_s: float
    """Predicted run time in cluster seconds."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExitInfo:
    ok: bool
    cause: str = ""
    measured: dict[str, Any] = field(default_factory=dict)
    """What the run measured (per-rank peak memory, step time), when it knows."""


@dataclass(frozen=True, slots=True)
class LogChunk:
    """A piece of an attempt's output (:meth:`Executor.read_log`)."""

    data: bytes
    offset: int
    """Where ``data`` starts in the whole output."""
    size: int
    """The output's length so far."""

    @property
    def next_offset(self) -> int:
        return self.offset + len(self.data)


def read_chunk(path: Path, offset: int | None, limit: int) -> LogChunk | None:
    """At most ``limit`` bytes of a growing file from ``offset`` (None: its last ``limit`` bytes); None if
    there is no such file."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = max(size - limit, 0) if offset is None else min(max(offset, 0), size)
            f.seek(start)
            return LogChunk(f.read(limit), start, size)
    except FileNotFoundError:
        return None


def attempt_log(workdir: Path, job_id: str, attempt: int) -> Path:
    """Where the local and Ray executors write an attempt's output (all ranks' stdout and stderr)."""
    return workdir / job_id / f"attempt-{attempt}.log"


OnExit = Callable[[str, int, ExitInfo], None]
OnReport = Callable[[str, int, dict[str, Any]], None]
"""A worker report of a running attempt (one JSON object per step, see :mod:`frenzy_opt.launch.worker.train`)."""


class Executor(Protocol):
    """Runs attempts of jobs on their placements (the contract in :mod:`frenzy_opt.launch.executors`)."""

    name: str
    preemptible: bool
    """Whether a stopped attempt resumes where it stopped (so the scheduler may preempt and grow jobs)."""

    def launch(self, launch: Launch, on_exit: OnExit, on_report: OnReport | None = None) -> None: ...

    def cancel(self, job_id: str, why: str | None = None) -> None:
        """Stop the job's attempt; ``why`` (a move of the scheduler's: what it gains) goes into its log."""

    def running(self) -> set[str]:
        """Jobs it still runs, or whose run ended while the service was down (for recovery)."""

    def shutdown(self) -> None: ...

    def supports(self, plan: Plan, arch: ModelArch) -> bool:
        """Whether it can run the plan (the planner offers only those)."""

    def plan_filter(self) -> PlanFilter | None:
        """:meth:`supports` as a module-level function of the plan and the job's spec, which a worker process
        can run (it pickles by name): the same answer as ``supports(plan, spec.model)`` for every plan; None
        when it supports every plan."""

    def adopt(self, job_id: str, attempt: int, on_exit: OnExit) -> None:
        """Take over a run that :meth:`running` listed after a restart; its end comes through ``on_exit``."""

    def placement_problem(self, gpu_type: str, gpus_per_node: int) -> str | None:
        """Why it cannot run ``gpus_per_node`` ranks of ``gpu_type`` per node where it runs (e.g. this machine
        has no such GPU), or None if it can; ``frenzy launch`` refuses a job none of whose plans it can place."""

    def read_log(self, job_id: str, attempt: int, offset: int | None, limit: int) -> LogChunk | None:
        """At most ``limit`` bytes of the attempt's output from ``offset`` (None: its last ``limit`` bytes),
        while it runs and after; None if the attempt left none."""


EXECUTORS: Registry[Executor] = Registry("executor")
"""The executors by name; ``frenzy serve`` passes every setting, each factory takes the ones it uses."""


@EXECUTORS.register("simulated")
def _simulated(*, time_scale: float = 1.0, fail_rate: float = 0.0, seed: int = 0, **_: object) -> Executor:
    from frenzy_opt.launch.executors.simulated import SimulatedExecutor

    return SimulatedExecutor(time_scale=time_scale, fail_rate=fail_rate, seed=seed)


@EXECUTORS.register("local")
def _local(*, workdir: str | None = None, max_steps: int | None = None, **_: object) -> Executor:
    from frenzy_opt.launch.executors.local import LocalExecutor

    return LocalExecutor(workdir or "frenzy-runs", max_steps=max_steps)


@EXECUTORS.register("ray")
def _ray(*, workdir: str | None = None, max_steps: int | None = None, **_: object) -> Executor:
    from frenzy_opt.launch.executors.ray import RayExecutor

    return RayExecutor(workdir or "frenzy-runs", address=os.environ.get("RAY_ADDRESS"), max_steps=max_steps)


def make_executor(name: str, **settings: object) -> Executor:
    """An executor by name (``simulated``, ``local``, ``ray``); ``ValueError`` names the allowed ones."""
    return EXECUTORS.make(name, **settings)
