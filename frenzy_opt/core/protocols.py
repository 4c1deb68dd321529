"""The interfaces a plug-in implements, in one place: a solver (``frenzy solve``), a simulator policy
(``frenzy simulate``), an executor (what the orchestrator launches through) and an admission hook (who may
use which GPUs). Each is found by name in a :class:`frenzy_opt.core.registry.Registry`.

The types these interfaces mention live in higher layers; they are imported for type checking only, so the
core stays the lowest layer at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from frenzy_opt.core.plan import Plan
    from frenzy_opt.launch.executors import Launch, LogChunk, OnExit, OnReport
    from frenzy_opt.models.arch import ModelArch
    from frenzy_opt.planning.problem import Option, PlanFilter, Schedule, SchedulingProblem
    from frenzy_opt.simulation.simulator import Action, SimJob, Simulator


class Solver(Protocol):
    """Schedules a whole :class:`SchedulingProblem` offline."""

    name: str

    def solve(self, problem: SchedulingProblem) -> Schedule: ...


class Policy(Protocol):
    """A scheduling policy plugged into the simulator."""

    name: str
    round_s: float | None
    """None: decide after every event batch; else only at ticks every ``round_s`` seconds."""

    def attach(self, sim: Simulator) -> None:
        """Called once before the first event."""

    def on_arrival(self, job: SimJob, now: float) -> None: ...

    def on_end(self, job: SimJob, now: float, finished: bool) -> None:
        """A running job ended: finished, failed (``finished`` False) or was stopped by the policy."""

    def on_node(self, node: int, now: float, up: bool, until_s: float) -> None:
        """A node failed (``up`` False, back at ``until_s``) or was repaired."""

    def decide(self, now: float) -> list[Action]: ...


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


class Admission(Protocol):
    """Who may use what (e.g. per-tenant quotas per GPU type, enforced by the scheduler itself)."""

    def allows(self, job: str, option: Option) -> bool: ...

    def take(self, job: str, option: Option) -> None: ...
