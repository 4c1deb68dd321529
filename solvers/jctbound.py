"""A proven lower bound on the average JCT any policy can reach in a simulation: preemptive or not, knowing
every arrival and every true step time.

It is the LP relaxation of a time-indexed model in which a job may run any of its admissible configurations
(``SimJob.per_count``: GPU type and count) at any time after its arrival, switch between them at no cost
and be split over time, the cluster's GPUs of each type shared as a fluid (node placement relaxed away). Time is cut
into ``T`` slots of length ``L``; ``y[j,k,t]`` is the share of slot ``t`` job ``j`` runs configuration ``k``,
whose true duration is ``d[j,k]`` (its steps at the truth's step time, plus its start-up stall). Then:

* work: ``sum_{k,t} y[j,k,t] L / d[j,k] = 1``; one configuration at a time: ``sum_k y[j,k,t] <= 1``, and
  in the slot of its arrival only the part after it;
* capacity: ``sum_{j,k of type} g[j,k] y[j,k,t] <= GPUs of the type`` in every slot;
* completion: a job whose work rate never exceeds ``1 / dmin[j]`` (its fastest configuration) has a mean
  busy time ``M[j] <= C[j] - dmin[j] / 2`` (the work packed at full rate just before ``C[j]`` is the latest
  mean any schedule reaches), and ``M[j] >= sum_{k,t} y[j,k,t] L / d[j,k] * max(t L, a[j])`` (each slot's
  work counted at the slot's start). So ``C[j] >= that + dmin[j] / 2`` and ``C[j] >= a[j] + dmin[j]``.

Every real schedule (restarts cost time, placement constrains more) gives a feasible point of this LP at no
more than its own sum of completion times, so the LP's optimum over the number of jobs, less the mean
arrival, is a lower bound on every policy's average JCT -- the mean-busy-time relaxation of Goemans et al.
(2002, "Single machine scheduling with release dates", SIAM J. Discrete Math. 15(2)) carried to moldable
jobs on a fluid cluster. It holds only where HiGHS reports the LP optimal; a time-out proves nothing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import highspy

from frenzy_opt.hardware.topology import Topology
from frenzy_opt.planning.problem import Option, undominated
from frenzy_opt.simulation.simulator import SimJob, Truth
from frenzy_opt.solvers.roundbased import _highs, highs_lp

# The most LP columns (job x configuration x slot) the bound builds: a 2-CPU machine solves about this many in
# seconds to a minute with HiGHS's simplex (measured on the shipped scenarios); more jobs get longer slots.
MAX_COLUMNS = 200_000
MAX_SLOTS = 400
# Where a job's slot boundaries go, in multiples of its fastest run after its arrival (module _grid), and the
# even floor of slots over the horizon: design choices, dense where completions lie.
GRID_FRACTIONS = (0.0, 0.5, 1.0, 1.1, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 11.0, 16.0, 24.0, 32.0)
EVEN_SLOTS = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class JctBound:
    """The bound on the average JCT (None: the LP was not solved to optimality), and its grid."""

    avg_jct_s: float | None
    slots: int
    slot_s: float
    solve_s: float
    status: str


def jct_lower_bound(
    jobs: Sequence[SimJob], topology: Topology, truth: Truth, *, time_limit_s: float = 300.0
) -> JctBound:
    """The bound of the module docstring for ``jobs`` on ``topology`` under ``truth``. The horizon starts
    at the last arrival plus twice the work's least GPU-time over the cluster's GPUs plus the longest job,
    and doubles while the LP is infeasible (up to every job run one after the other, which always fits)."""
    started = time.perf_counter()
    configs: list[list[tuple[Option, float]]] = []
    for job in jobs:
        timed = [(o, job.startup_s + job.steps * truth.step_s(job, o)) for o in job.per_count.values()]
        configs.append(undominated(timed, lambda od: (od[0].gpu_type, od[0].num_gpus, od[1])))
    dmin = [min(d for _, d in c) for c in configs]
    arrivals = [j.arrival_s for j in jobs]
    gpus = sum(topology.num_gpus_of(t) for t in topology.gpu_types)
    least_gpu_s = sum(min(o.num_gpus * d for o, d in c) for c in configs)
    serial = max(arrivals) + sum(dmin)
    horizon = min(serial, max(arrivals) + 2 * least_gpu_s / gpus + max(dmin))
    while True:
        bound = _solve(jobs, configs, dmin, arrivals, topology, horizon, time_limit_s)
        if bound.status != "Infeasible" or horizon >= serial:
            return JctBound(
                avg_jct_s=bound.avg_jct_s,
                slots=bound.slots,
                slot_s=bound.slot_s,
                solve_s=time.perf_counter() - started,
                status=bound.status,
            )
        horizon = min(serial, 2 * horizon)


def _grid(
    dmin: list[float], arrivals: list[float], configs: list[list[tuple[Option, float]]], horizon: float
) -> list[float]:
    """Slot boundaries: dense after each arrival, where a job's completion can lie (its arrival plus multiples of
    its fastest run, :data:`GRID_FRACTIONS`), and an even floor over the horizon; halved (every other interior
    boundary dropped) until the LP has at most :data:`MAX_SLOTS` slots and :data:`MAX_COLUMNS` columns. Any
    partition gives a valid bound; a finer one where the work is gives a tighter one."""
    start = min(arrivals)
    points = {start, horizon}
    points.update(start + (horizon - start) * i / EVEN_SLOTS for i in range(1, EVEN_SLOTS))
    for a, d in zip(arrivals, dmin, strict=True):
        points.update(a + f * d for f in GRID_FRACTIONS if a + f * d < horizon)
    grid = sorted(points)

    def columns(bounds: list[float]) -> int:
        return sum(len(c) * sum(1 for b in bounds[1:] if b > a) for a, c in zip(arrivals, configs, strict=True))

    while len(grid) > 3 and (len(grid) - 1 > MAX_SLOTS or columns(grid) > MAX_COLUMNS):
        grid = [grid[0], *grid[1:-1:2], grid[-1]]
    return grid


def _solve(
    jobs: Sequence[SimJob],
    configs: list[list[tuple[Option, float]]],
    dmin: list[float],
    arrivals: list[float],
    topology: Topology,
    horizon: float,
    time_limit_s: float,
) -> JctBound:
    capacity = {t: topology.num_gpus_of(t) for t in topology.gpu_types}
    started = time.perf_counter()
    grid = _grid(dmin, arrivals, configs, horizon)
    slots = len(grid) - 1
    cost: list[float] = []
    upper: list[float] = []
    rows: list[tuple[list[int], list[float], float]] = []
    load: dict[tuple[str, int], tuple[list[int], list[float]]] = {}
    for j in range(len(jobs)):
        c = len(cost)  # C[j]
        cost.append(1.0)
        upper.append(highspy.kHighsInf)
        rows.append(([c], [-1.0], -(arrivals[j] + dmin[j])))
        work_idx: list[int] = []
        work_coef: list[float] = []
        mean_idx: list[int] = [c]
        mean_coef: list[float] = [-1.0]
        for t in range(slots):
            begin, end = grid[t], grid[t + 1]
            if end <= arrivals[j]:
                continue
            length = end - begin
            share = min(1.0, (end - arrivals[j]) / length)
            in_slot: list[int] = []
            for option, d in configs[j]:
                y = len(cost)
                cost.append(0.0)
                upper.append(share)
                in_slot.append(y)
                done = length / d
                work_idx.append(y)
                work_coef.append(done)
                mean_idx.append(y)
                mean_coef.append(done * max(begin, arrivals[j]))
                idx, coef = load.setdefault((option.gpu_type, t), ([], []))
                idx.append(y)
                coef.append(float(option.num_gpus))
            if len(in_slot) > 1:
                rows.append((in_slot, [1.0] * len(in_slot), share))
        rows.append((work_idx, work_coef, 1.0))
        rows.append((work_idx, [-v for v in work_coef], -1.0))
        rows.append((mean_idx, mean_coef, -dmin[j] / 2))
    for (gpu_type, _), (idx, coef) in load.items():
        rows.append((idx, coef, float(capacity[gpu_type])))
    lp = highs_lp(cost, upper, rows)
    h = _highs()
    h.setOptionValue("time_limit", float(time_limit_s))
    h.passModel(lp)
    h.run()
    status = h.getModelStatus()
    solve_s = time.perf_counter() - started
    name = h.modelStatusToString(status)
    mean_slot = (grid[-1] - grid[0]) / slots
    if status != highspy.HighsModelStatus.kOptimal:
        return JctBound(avg_jct_s=None, slots=slots, slot_s=mean_slot, solve_s=solve_s, status=name)
    total = float(h.getInfo().objective_function_value)
    avg = (total - sum(arrivals)) / len(jobs)
    return JctBound(
        avg_jct_s=math.nextafter(avg, -math.inf), slots=slots, slot_s=mean_slot, solve_s=solve_s, status=name
    )
