"""A lower bound on the weighted-JCT objective of the offline problem CP-SAT solves: the LP relaxation of a
time-indexed model, solved with HiGHS (interior point) through PuLP. It proves how far a schedule is from
the optimum where CP-SAT's own bound is loose (20 jobs and more, ``benchmarks/results/greedy_gap.md``).

**The relaxation.** Time is cut into slots at boundaries ``b_0 < b_1 < ...``. A schedule that starts job
``j`` with option ``k`` (``g`` GPUs of one type for ``p`` seconds) at ``s >= a_j`` maps to the *rounded* start
``b_i``, the last boundary at or before ``s``, holding the ``g`` GPUs in the slots ``u >= i`` with
``b_{u+1} <= b_i + p``, at cost ``w_j (max(b_i, a_j) + p - a_j)``. Every real schedule maps to a feasible
rounded one at no more than its cost: the cost is at most ``w_j (s + p - a_j)`` since ``s >= a_j`` and
``s >= b_i``; a job counted in slot ``u`` runs at the instant just before ``b_{u+1}`` (it started before
``b_{i+1} <= b_{u+1}`` and ends at ``s + p >= b_i + p >= b_{u+1}``), so the rounded jobs of any slot all run at
one real instant and fit the type's GPUs. Node placement and GPUs busy before the schedule are relaxed away.
The time-indexed program over rounded starts (Dyer & Wolsey 1990; Sousa & Wolsey 1992) is then a relaxation
and its LP relaxation a lower bound on the optimum. A cruder rounding -- starts rounded *up* on a uniform grid
and two slots of occupancy dropped -- gave bounds 18-39 % below the greedy's objective on the first two 20-job
instances of ``greedy_gap.md`` where this one, on the same uniform 120 s grid, gives 8 % (a scratch comparison).

**Size.** With an upper bound ``U`` on the optimum (the objective of an incumbent schedule: the greedy's,
CP-SAT's best), job ``j`` completes by ``a_j + (U - sum_{i != j} w_i dmin_i) / w_j`` in every optimal schedule
(every other job takes at least its fastest run: the tightening CP-SAT's model uses, ``solvers/cpsat.py``),
which bounds its start slots. Options another of the same type dominates (no fewer GPUs and no shorter) are
dropped: they leave the LP's optimum unchanged. The slots are dense (one length, the shortest whole second
that keeps the start variables under ``max_columns``) over the first :data:`DENSE_SHARE` of the incumbent's
span, where an optimum's completions lie, and lengthen geometrically after it (on those two instances 9.6 and
10.9 % below the greedy with uniform slots at 120,000 columns, 4.4-4.6 and 7.6-7.7 % with dense ones). The
starts are cumulative variables (``X[j,k,i]`` = share of job ``j`` started with option ``k`` at boundaries up to
``i``), so a slot's capacity row reads two entries per option instead of one per start that covers it.

PuLP reports "Optimal" even when a time limit stopped the solver; the bound is used only when HiGHS reports
an optimal LP (``solution status``), never on a time-out. The interior point method solves these LPs in tens
of seconds where the dual simplex had not finished in ten minutes (the same scratch comparison).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable
from dataclasses import dataclass

import pulp

from frenzy_opt.core.enums import SolverStatus
from frenzy_opt.planning.problem import Option, ProblemJob, Schedule, SchedulingProblem, undominated
from frenzy_opt.planning.problem import objective as objective_of
from frenzy_opt.solvers.base import register
from frenzy_opt.solvers.greedy import GreedyHAS
from frenzy_opt.solvers.roundbased import _highs

# Start variables the LP builds by default: HiGHS's interior point solves 120,000 in 20-60 s on a 2-CPU machine
# (the 10- and 20-job instances of benchmarks/results/greedy_gap.md; 170,000 took 80-140 s and 300,000 did not
# finish in 300 s, scratch runs); more shorten the slots and tighten the bound.
MAX_COLUMNS = 120_000
# The optimum HiGHS reports is exact to its tolerances (primal and dual feasibility 1e-7); the bound is moved
# down by this relative margin so a rounding there never lifts it above the true LP optimum.
SAFETY = 1e-6
# Past the dense part, each slot is this many times the one before it (a design choice: late completions weigh
# little in an optimum, and few columns go there).
GROWTH = 1.1
# The dense slots cover this share of the incumbent's span (a design choice: 0.25-0.6 gave bounds within 0.5 % of
# each other on the first two 20-job instances of greedy_gap.md, 1.0 two to three points looser).
DENSE_SHARE = 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class LpBound:
    """A proven lower bound on the weighted-JCT objective (None: the LP was not solved to optimality)."""

    objective: float | None
    slot_s: float
    """The dense slots' length."""
    slots: int
    columns: int
    solve_s: float
    status: str


def _latest(problem: SchedulingProblem, upper_bound: float) -> dict[str, float]:
    """Per job, the latest completion of any optimal schedule (module docstring)."""
    jobs = problem.jobs
    least = sum(j.weight * j.fastest_s for j in jobs)
    return {j.id: j.arrival_s + (upper_bound - (least - j.weight * j.fastest_s)) / j.weight for j in jobs}


def grid(begin: float, dense_until: float, end: float, step: float) -> list[float]:
    """Slot boundaries from ``begin`` past ``end``: ``step`` apart up to ``dense_until``, then each slot
    :data:`GROWTH` times the last (any partition gives a valid bound, module docstring; a fine one where the
    completions lie gives a tight one)."""
    bounds = [begin]
    while bounds[-1] < end:
        last = bounds[-1]
        length = step if last < dense_until or len(bounds) < 2 else max(step, GROWTH * (last - bounds[-2]))
        bounds.append(last + length)
    return bounds


def _starts(job: ProblemJob, option: Option, latest: float, bounds: list[float]) -> range:
    """The rounded start slots (indices into ``bounds``) of ``option`` for ``job``: from the slot holding
    its arrival to the last that can still end by ``latest`` (at least one, so every job keeps an option)."""
    first = bisect.bisect_right(bounds, job.arrival_s) - 1
    last = bisect.bisect_right(bounds, latest - option.duration_s) - 1
    return range(first, max(first, last) + 1)


def _columns(
    problem: SchedulingProblem, fronts: dict[str, list[Option]], latest: dict[str, float], bounds: list[float]
) -> int:
    return sum(len(_starts(j, o, latest[j.id], bounds)) for j in problem.jobs for o in fronts[j.id])


def time_indexed_bound(
    problem: SchedulingProblem,
    *,
    incumbents: Iterable[Schedule] = (),
    max_columns: int = MAX_COLUMNS,
    time_limit_s: float = 300.0,
) -> LpBound:
    """The bound of the module docstring. The incumbent is the schedule of least objective among
    ``incumbents`` that hold one (the first on a tie; the greedy's if none does): its objective bounds the
    horizon, and the slots lengthen past :data:`DENSE_SHARE` of its makespan."""
    started = time.perf_counter()
    found = [(objective_of(problem, s), s) for s in incumbents if s.assignments]
    incumbent = min(found, key=lambda f: f[0])[1] if found else GreedyHAS().solve(problem)
    fronts = {j.id: undominated(j.options, lambda o: (o.gpu_type, o.num_gpus, o.duration_s)) for j in problem.jobs}
    latest = _latest(problem, objective_of(problem, incumbent))
    begin, end = min(j.arrival_s for j in problem.jobs), max(latest.values())
    makespan = max(a.end_s for a in incumbent.assignments)
    dense = min(begin + DENSE_SHARE * (makespan - begin), end)
    low, high = 1, 1  # the shortest whole-second dense step within the column budget (bisection: fewer as it grows)
    while _columns(problem, fronts, latest, grid(begin, dense, end, high)) > max_columns:
        low, high = high + 1, high * 2
    while low < high:
        middle = (low + high) // 2
        if _columns(problem, fronts, latest, grid(begin, dense, end, middle)) > max_columns:
            low = middle + 1
        else:
            high = middle
    bounds = grid(begin, dense, end, high)
    lp = pulp.LpProblem("weighted_jct_bound", pulp.LpMinimize)
    terms: list[tuple[pulp.LpVariable, float]] = []
    load: dict[tuple[str, int], dict[pulp.LpVariable, float]] = {}
    columns = 0
    for j, job in enumerate(problem.jobs):
        finals = []
        for k, option in enumerate(fronts[job.id]):
            starts = _starts(job, option, latest[job.id], bounds)
            cumulative = [lp.add_variable(f"X_{j}_{k}_{i}", lowBound=0, upBound=1) for i in starts]
            columns += len(cumulative)
            costs = [job.weight * (max(bounds[i], job.arrival_s) + option.duration_s - job.arrival_s) for i in starts]
            # sum_i cost_i (X_i - X_{i-1}) = sum_i X_i (cost_i - cost_{i+1}) + X_last cost_last
            for i, x in enumerate(cumulative):
                terms.append((x, costs[i] - (costs[i + 1] if i + 1 < len(costs) else 0.0)))
                if i:
                    lp += cumulative[i - 1] - x <= 0
            finals.append(cumulative[-1])
            first, last = starts[0], starts[-1]
            gpus = float(option.num_gpus)
            # Slot u holds the starts i <= u with bounds[u + 1] <= bounds[i] + duration: i from lo(u) to u.
            for u in range(first, len(bounds) - 1):
                lo = max(first, bisect.bisect_left(bounds, bounds[u + 1] - option.duration_s))
                if lo > min(u, last):
                    if lo > last:
                        break
                    continue
                row = load.setdefault((option.gpu_type, u), {})
                now = cumulative[min(u, last) - first]
                row[now] = row.get(now, 0.0) + gpus
                if lo > first:
                    before = cumulative[lo - 1 - first]
                    row[before] = row.get(before, 0.0) - gpus
        lp += pulp.lpSum(finals) == 1
    for (gpu_type, _), row in load.items():
        held = [(x, c) for x, c in row.items() if c != 0.0]
        if held:
            lp += pulp.LpAffineExpression(held) <= problem.topology.num_gpus_of(gpu_type)
    lp += pulp.LpAffineExpression(terms)
    _highs()  # HiGHS's banner, printed by a process's first instance, goes to /dev/null (not into --json output)
    lp.solve(pulp.HiGHS(msg=False, timeLimit=time_limit_s, solver="ipm"))
    solve_s = time.perf_counter() - started
    status = pulp.LpStatus[lp.status]
    value = float(pulp.value(lp.objective)) if lp.sol_status == pulp.LpSolutionOptimal else None
    return LpBound(
        objective=None if value is None else value - SAFETY * abs(value),
        slot_s=float(high),
        slots=len(bounds) - 1,
        columns=columns,
        solve_s=solve_s,
        status=status,
    )


def lp_lower_bound(
    problem: SchedulingProblem, *, max_columns: int = MAX_COLUMNS, time_limit_s: float = 60.0
) -> float | None:
    """A lower bound on the optimal objective, or None when the LP was not solved to optimality."""
    return time_indexed_bound(problem, max_columns=max_columns, time_limit_s=time_limit_s).objective


@register("lpbound")
class LpBoundSolver:
    """The bound as a solver entry: no schedule, ``bound`` set when proven."""

    name = "lpbound"

    def __init__(self, *, time_limit_s: float = 60.0, max_columns: int = MAX_COLUMNS, **_: object) -> None:
        self.time_limit_s, self.max_columns = time_limit_s, max_columns

    def solve(self, problem: SchedulingProblem) -> Schedule:
        start = time.perf_counter()
        bound = lp_lower_bound(problem, max_columns=self.max_columns, time_limit_s=self.time_limit_s)
        return Schedule(
            solver=self.name,
            status=SolverStatus.OPTIMAL if bound is not None else SolverStatus.UNKNOWN,
            assignments=(),
            solve_time_s=time.perf_counter() - start,
            bound=bound,
        )
