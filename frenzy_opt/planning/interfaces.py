"""What a plug-in of the scheduling problem implements, beside the types it speaks of: a :class:`Solver`
(``frenzy solve``, found by name in :data:`frenzy_opt.solvers.base.SOLVERS`) and an :class:`Admission` hook
(who may use which GPUs: the service's per-tenant quotas)."""

from __future__ import annotations

from typing import Protocol

from frenzy_opt.planning.problem import Option, Schedule, SchedulingProblem


class Solver(Protocol):
    """Schedules a whole :class:`SchedulingProblem` offline."""

    name: str

    def solve(self, problem: SchedulingProblem) -> Schedule: ...


class Admission(Protocol):
    """Who may use what (e.g. per-tenant quotas per GPU type, enforced by the scheduler itself)."""

    def allows(self, job: str, option: Option) -> bool: ...

    def take(self, job: str, option: Option) -> None: ...
