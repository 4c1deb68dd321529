"""An independent lower bound on the weighted-JCT objective: the LP relaxation of a time-indexed model,
solved with HiGHS through PuLP. A cross-check of CP-SAT's proven bound on small instances.

Time is cut into slots of ``slot_s`` seconds. A schedule with start ``s`` maps to the grid start
``s' = ceil(s / slot) x slot``; the job is certainly running in the ``floor(p / slot) - 1`` whole slots
from ``s'`` (all inside ``[s, s + p)``), and its completion ``s + p > s' - slot + p``. So the time-indexed
program with those occupancies, capacity per GPU type (node placement relaxed away) and cost
``w (s' - slot + p - a)`` admits every real schedule at no more than its real cost: its optimum, and a
fortiori its LP relaxation, is a lower bound (the time-indexed formulation of Dyer & Wolsey 1990).

PuLP reports "Optimal" even when a time limit stopped the solver; the bound is used only when HiGHS
reports an optimal LP (``solution status``), never on a time-out.
"""

from __future__ import annotations

import math
import time

import pulp

from frenzy_opt.core.enums import SolverStatus
from frenzy_opt.planning.problem import Schedule, SchedulingProblem
from frenzy_opt.solvers.base import register


def lp_lower_bound(problem: SchedulingProblem, *, slots: int = 200, time_limit_s: float = 60.0) -> float | None:
    """A lower bound on the optimal objective, or None when the LP was not solved to optimality."""
    horizon = max(j.arrival_s for j in problem.jobs) + sum(max(o.duration_s for o in j.options) for j in problem.jobs)
    slot = max(1.0, math.ceil(horizon / slots))
    num_slots = math.ceil(horizon / slot) + 1
    lp = pulp.LpProblem("weighted_jct_bound", pulp.LpMinimize)
    load: dict[tuple[str, int], list[tuple[int, pulp.LpVariable]]] = {}
    cost = []
    for j, job in enumerate(problem.jobs):
        first = math.ceil(job.arrival_s / slot)
        chosen = []
        for k, option in enumerate(job.options):
            occupied = max(math.floor(option.duration_s / slot) - 1, 0)
            for t in range(first, num_slots):
                x = lp.add_variable(f"x_{j}_{k}_{t}", lowBound=0, upBound=1)
                chosen.append(x)
                completion = max(t * slot - slot + option.duration_s, job.arrival_s + option.duration_s)
                cost.append(job.weight * (completion - job.arrival_s) * x)
                for tau in range(t, min(t + occupied, num_slots)):
                    load.setdefault((option.gpu_type, tau), []).append((option.num_gpus, x))
        lp += pulp.lpSum(chosen) == 1
    for (gpu_type, _tau), terms in load.items():
        lp += pulp.lpSum(n * x for n, x in terms) <= problem.topology.num_gpus_of(gpu_type)
    lp += pulp.lpSum(cost)
    solver = pulp.HiGHS(msg=False, timeLimit=time_limit_s)
    lp.solve(solver)
    if lp.sol_status != pulp.LpSolutionOptimal:
        return None
    return float(pulp.value(lp.objective))


@register("lpbound")
class LpBound:
    """The bound as a solver entry: no schedule, ``bound`` set when proven."""

    name = "lpbound"

    def __init__(self, *, time_limit_s: float = 60.0, slots: int = 200, **_: object) -> None:
        self.time_limit_s, self.slots = time_limit_s, slots

    def solve(self, problem: SchedulingProblem) -> Schedule:
        start = time.perf_counter()
        bound = lp_lower_bound(problem, slots=self.slots, time_limit_s=self.time_limit_s)
        return Schedule(
            solver=self.name,
            status=SolverStatus.OPTIMAL if bound is not None else SolverStatus.UNKNOWN,
            assignments=(),
            solve_time_s=time.perf_counter() - start,
            bound=bound,
        )
