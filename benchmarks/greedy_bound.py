"""Quality and cost of the greedy's bounded decision (``GreedyState.priced_jobs``, issue 26 item 1) against the
unbounded one, per bound K (the backfill tests bounded alike, :data:`~frenzy_opt.solvers.greedy.BACKFILL_TESTS`):

    .venv/bin/python benchmarks/greedy_bound.py [--seeds 8] [--bounds 16,24,32,48,64,96]   # a table on stdout

(a) ``frenzy solve``'s greedy (``GreedyHAS``), 512 jobs queued at once on 2,160 GPUs (8-GPU nodes, A100/H100/V100,
the job pool of ``scheduler_benchmarks.py``), one instance per seed; (b) the same with Poisson arrivals (mean gap
60 s); (c) the ``frenzy`` policy (preemptive, elastic) in the simulator on ``paper3type-llm`` and ``sia64-llm``,
workload and the noisy truth moved per seed as in ``frenzy compare``. Quality: sum of weight x JCT, the change per
instance against the unbounded decision on the same instance (mean, Student-t 95 % CI, worst); cost: whole
schedule ms per job ((a), (b)) or mean ms per decision ((c)), wall time on this machine. ``has_scale.py`` (b)
puts this table in ``benchmarks/results/has_scale.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scheduler_benchmarks as bench

from frenzy_opt.hardware.topology import Topology
from frenzy_opt.planning.problem import SchedulingProblem
from frenzy_opt.research.experiment import prepare
from frenzy_opt.research.stats import ci95_half_width
from frenzy_opt.simulation.simulator import Simulator
from frenzy_opt.simulation.truth import TruthKind, TruthSpec
from frenzy_opt.solvers.greedy import GreedyHAS
from frenzy_opt.solvers.policies import FrenzyPolicy

GPUS = 2160
JOBS = 512
GAP_S = 60.0
SCENARIOS = ("paper3type-llm", "sia64-llm")

Run = tuple[float, float]  # (sum of weight x JCT, cost in ms: per job or per decision)


def solve(problem: SchedulingProblem, bound: int | None) -> Run:
    weights = {job.id: job.weight for job in problem.jobs}
    arrivals = {job.id: job.arrival_s for job in problem.jobs}
    tick = time.perf_counter()
    schedule = GreedyHAS(priced_jobs=bound, backfill_tests=bound or 0).solve(problem)
    wall = time.perf_counter() - tick
    assert len(schedule.assignments) == len(problem.jobs)
    cost = sum(weights[a.job] * (a.end_s - arrivals[a.job]) for a in schedule.assignments)
    return cost, 1e3 * wall / len(problem.jobs)


def instances(seeds: int) -> dict[str, list[Callable[[int | None], Run]]]:
    topology = Topology(bench.decision_cluster(GPUS))
    pool = bench.template_pool(topology.cluster, topology)
    out: dict[str, list[Callable[[int | None], Run]]] = {}
    for label, gap in (
        (f"{JOBS} at once, {GPUS:,} GPUs", None),
        (f"{JOBS} Poisson ({GAP_S:g} s), {GPUS:,} GPUs", GAP_S),
    ):
        problems = [bench.random_instance(np.random.default_rng(s), pool, topology, JOBS, gap) for s in range(seeds)]
        out[label] = [lambda bound, p=p: solve(p, bound) for p in problems]
    for name in SCENARIOS:
        runs, cache = [], None
        for k in range(seeds):
            experiment = prepare(name, truth=TruthSpec(kind=TruthKind.NOISY).make(k), seed_offset=k, cache=cache)
            cache = experiment.cache

            def simulate(bound: int | None, e=experiment) -> Run:
                policy = FrenzyPolicy(priced_jobs=bound)
                result = Simulator(e.topology, e.jobs, policy, truth=e.truth).run()  # type: ignore[arg-type]
                cost = sum(s.job.weight * (s.end_s - s.job.arrival_s) for s in result.jobs.values() if s.end_s)
                return cost, float(result.metrics()["mean_decision_ms"])

            runs.append(simulate)
        out[f"simulator `frenzy`, {name}"] = runs
    return out


Row = tuple[str, int | None, float, float, float, float]  # case, K, cost ms, mean change %, half-width, worst


def sweep(seeds: int, bounds_csv: str) -> list[Row]:
    """Every case of the module docstring under the unbounded decision and each K of ``bounds_csv``."""
    bounds: list[int | None] = [None, *(int(b) for b in bounds_csv.split(","))]
    rows: list[Row] = []
    for label, runs in instances(seeds).items():
        results = {bound: [run(bound) for run in runs] for bound in bounds}
        base = [cost for cost, _ in results[None]]
        for bound in bounds:
            change = [100.0 * (cost / b - 1.0) for (cost, _), b in zip(results[bound], base, strict=True)]
            ms = float(np.mean([m for _, m in results[bound]]))
            half = ci95_half_width(change) or 0.0
            rows.append((label, bound, ms, float(np.mean(change)), half, max(change, key=abs)))
            bench.log(f"  {rows[-1]}")
    return rows


def table(rows: list[Row], seeds: int) -> list[str]:
    return [
        "K: jobs a decision prices fully (`PRICED_JOBS`), and at most K more tested for a fit now "
        "(`BACKFILL_TESTS`); unbounded: every job the decision reaches. Change: sum of weight x JCT against the "
        f"unbounded decision on the same instance, mean ± Student-t 95 % half-width over {seeds} seeds, "
        "and the change of largest magnitude. Cost: the whole schedule's wall time per job for `frenzy solve`'s "
        "greedy, the mean per decision in the simulator.",
        "",
        "| instances | K | cost ms | change of sum w x JCT % | worst % |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {label} | {'unbounded' if bound is None else bound} | {ms:.3f} | {mean:+.2f} ± {half:.2f} | "
            f"{worst:+.2f} |"
            for label, bound, ms, mean, half, worst in rows
        ),
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--bounds", default="16,24,32,48,64,96", help="values of K, comma-separated")
    args = parser.parse_args()
    load_start = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    started = time.perf_counter()
    rows = sweep(args.seeds, args.bounds)
    load_end = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        "# The greedy's bounded decision against the unbounded one",
        "",
        f"- Command: `.venv/bin/python benchmarks/greedy_bound.py --seeds {args.seeds} --bounds {args.bounds}`",
        f"- Machine: {platform.platform()}; nproc {os.cpu_count()}; Python {platform.python_version()}",
        f"- 1/5/15-min load average at start: {load_start}; at end: {load_end}; "
        f"took {time.perf_counter() - started:.0f} s (a shared VM: wall times are inflated when the load is over 1)",
        "",
        *table(rows, args.seeds),
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
