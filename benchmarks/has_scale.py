"""How the HAS's decision cost grows with the cluster and the queue: the online replay (``frenzy solve``'s greedy) at
2,048 and 16,384 GPUs with 512, 4,096 and 10,000 jobs, queued at once or arriving by a Poisson process, the bound on
a decision's work against its quality, and the preemptive policy's decisions in the simulator.

    .venv/bin/python benchmarks/has_scale.py [--out benchmarks/results/has_scale.md] [--cap-s 20] [--seeds 8]

(a) The replay of ``GreedyHAS.solve`` (decide at every arrival and completion) on 8-GPU nodes split over A100, H100
and V100 with the job pool of ``scheduler_benchmarks.py``: per decision the mean and p99 wall time, and the whole
schedule's wall time per job, and the jobs a decision priced (mean and most). Poisson arrivals have a mean gap that
shrinks with the cluster (60 s at 2,160 GPUs) so that the offered load per GPU is the same. A case stops after
``--cap-s`` seconds of decisions (a design choice, to keep the run under ~15 minutes); its per-decision figures are
then those of the decisions made, with the queue at its deepest, and the whole-schedule column says "capped". (b)
The bound K on a decision's work (``PRICED_JOBS``) against its quality: ``greedy_bound.py``'s table (sum of weight x
JCT against the unbounded decision, ``--seeds`` instances each). (c) The ``frenzy`` simulator policy (preemptive,
elastic) on ``cluster2048-llm`` (1,000 jobs, 2,048 GPUs) under the model truth: the simulator's mean and p99 wall
time per decision."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import greedy_bound
import scheduler_benchmarks as bench

from frenzy_opt.hardware.topology import Topology
from frenzy_opt.planning.problem import Assignment, OptionCache, SchedulingProblem
from frenzy_opt.planning.scenario import load_scenario
from frenzy_opt.simulation.simulator import Simulator, sim_jobs
from frenzy_opt.solvers.base import make_policy
from frenzy_opt.solvers.greedy import BACKFILL_TESTS, PRICED_JOBS, GreedyState

GPUS = (2048, 16384)
JOBS = (512, 4096, 10000)
BASE_GAP_S = 60.0  # mean arrival gap at 2,160 GPUs (the earlier version of this benchmark), scaled per GPU
BASE_GPUS = 2160
# Issue 26's targets (at 2,160 and 16,392 GPUs there; measured here on the nearest grid sizes, 2,048 and 16,384).
TARGET_DECISION_MS = 1.0  # mean per decision at 2,048 GPUs with 10,000 queued
TARGET_SMALL_MS_PER_JOB = 1.0  # whole schedule, ~2,048 GPUs, 512 queued at once
TARGET_LARGE_MS_PER_JOB = 2.0  # whole schedule, ~16,384 GPUs, 4,096 queued at once


def replay(problem: SchedulingProblem, cap_s: float) -> tuple[list[Assignment], list[float], list[int], bool]:
    """``GreedyHAS.solve``'s loop, stopped after ``cap_s`` seconds of decisions: the assignments, each decision's
    wall time and jobs priced, and whether the schedule finished."""
    state = GreedyState(problem)
    arrivals = sorted(problem.jobs, key=lambda j: (j.arrival_s, j.id))
    assignments: list[Assignment] = []
    times: list[float] = []
    priced: list[int] = []
    i = 0
    while i < len(arrivals) or state.queue:
        if sum(times) > cap_s:
            return assignments, times, priced, False
        next_arrival = arrivals[i].arrival_s if i < len(arrivals) else float("inf")
        now = min(next_arrival, state.running[0][0] if state.running else float("inf"))
        state.complete_until(now)
        while i < len(arrivals) and arrivals[i].arrival_s <= now:
            state.queue[arrivals[i].id] = arrivals[i]
            i += 1
        tick = time.perf_counter()
        assignments += state.decide(now)
        times.append(time.perf_counter() - tick)
        priced.append(state.priced)
    return assignments, times, priced, True


def case(problem: SchedulingProblem, cap_s: float, at_once: bool) -> dict[str, object]:
    start = time.perf_counter()
    _, times, priced, done = replay(problem, cap_s)
    wall = time.perf_counter() - start
    ms = 1e3 * np.array(times)
    return {
        "gpus": sum(problem.topology.num_gpus_of(t) for t in problem.topology.gpu_types),
        "jobs": len(problem.jobs),
        "arrivals": "at once" if at_once else "Poisson",
        "decisions": len(times),
        "mean_ms": float(ms.mean()),
        "p99_ms": float(np.percentile(ms, 99)),
        "ms_per_job": 1e3 * wall / len(problem.jobs) if done else None,
        "priced_mean": float(np.mean(priced)),
        "priced_max": max(priced),
    }


def simulate() -> dict[str, float]:
    scenario = load_scenario("cluster2048-llm")
    topology = Topology(scenario.cluster)
    jobs, _ = sim_jobs(scenario, OptionCache(scenario.cluster, topology))
    result = Simulator(topology, jobs, make_policy("frenzy")).run()  # type: ignore[arg-type]
    return {k: float(v) for k, v in result.metrics().items()}


def _met(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/has_scale.md"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cap-s", type=float, default=20.0, help="seconds of decisions per case at most")
    parser.add_argument("--seeds", type=int, default=8, help="(b): instances per case")
    parser.add_argument("--bounds", default="16,24,32,48,64,96", help="(b): values of K")
    args = parser.parse_args()
    load_start = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    started = time.perf_counter()
    rows = []
    for gpus in GPUS:
        topology = Topology(bench.decision_cluster(gpus))
        pool = bench.template_pool(topology.cluster, topology)
        for jobs in JOBS:
            for at_once in (True, False):
                gap = None if at_once else BASE_GAP_S * BASE_GPUS / gpus
                problem = bench.random_instance(np.random.default_rng(args.seed), pool, topology, jobs, gap)
                rows.append(case(problem, args.cap_s, at_once))
                bench.log(f"  {rows[-1]}")
    bounds = greedy_bound.sweep(args.seeds, args.bounds)
    sim = simulate()
    load_end = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    by = {(r["gpus"], r["jobs"], r["arrivals"]): r for r in rows}
    deep = by[(2048, 10000, "at once")]
    small = by[(2048, 512, "at once")]["ms_per_job"]
    large = by[(16384, 4096, "at once")]["ms_per_job"]

    def per_job(value: object) -> str:
        return "capped" if value is None else f"{value:.2f}"

    lines = [
        "# HAS cost with scale",
        "",
        "- Command: `.venv/bin/python benchmarks/has_scale.py`",
        f"- Machine: {platform.platform()}; nproc {os.cpu_count()}; Python {platform.python_version()}",
        f"- 1/5/15-min load average at start: {load_start}; at end: {load_end}; "
        f"took {time.perf_counter() - started:.0f} s",
        "- A shared, noisy VM: other work ran at the same time when the load average is above 1.",
        "",
        f"## (a) Online replay (`frenzy solve`'s greedy), at most {args.cap_s:g} s of decisions per case",
        "",
        f"A decision prices fully at most K = {PRICED_JOBS} jobs (`PRICED_JOBS`) and tests at most "
        f"{BACKFILL_TESTS} more (`BACKFILL_TESTS`), only jobs that could fit now (`solvers/greedy.py`).",
        "",
        "| GPUs | jobs | arrivals | decisions | mean decision ms | p99 decision ms | whole schedule ms per job "
        "| jobs priced per decision, mean / most |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
        *(
            f"| {r['gpus']:,} | {r['jobs']:,} | {r['arrivals']} | {r['decisions']:,} | {r['mean_ms']:.3f} | "
            f"{r['p99_ms']:.3f} | {per_job(r['ms_per_job'])} | {r['priced_mean']:.1f} / {r['priced_max']} |"
            for r in rows
        ),
        "",
        "Issue 26's targets (its sizes 2,160 and 16,392 GPUs measured at 2,048 and 16,384):",
        f"- < {TARGET_DECISION_MS:g} ms mean per decision at 2,048 GPUs with 10,000 queued at once: "
        f"{_met(float(deep['mean_ms']) < TARGET_DECISION_MS)} ({float(deep['mean_ms']):.2f} ms over the first "  # type: ignore[arg-type]
        f"{deep['decisions']:,} decisions);",
        f"- < {TARGET_SMALL_MS_PER_JOB:g} ms per job, whole schedule, 2,048 GPUs / 512 queued at once: "
        f"{_met(small is not None and small < TARGET_SMALL_MS_PER_JOB)} ({per_job(small)});",
        f"- < {TARGET_LARGE_MS_PER_JOB:g} ms per job, whole schedule, 16,384 GPUs / 4,096 queued at once: "
        f"{_met(large is not None and large < TARGET_LARGE_MS_PER_JOB)} ({per_job(large)}).",
        "",
        f"## (b) The bound K against quality and cost ({args.seeds} instances per case)",
        "",
        *greedy_bound.table(bounds, args.seeds),
        "",
        "## (c) Preemptive `frenzy` policy in the simulator, `cluster2048-llm` (model truth)",
        "",
        "| jobs | decisions | mean decision ms | p99 decision ms | restarts | avg JCT h |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {sim['num_jobs']:,.0f} | {sim['num_decisions']:,.0f} | {sim['mean_decision_ms']:.3f} | "
        f"{sim['p99_decision_ms']:.3f} | {sim['restarts']:,.0f} | {sim['avg_jct_s'] / 3600:.2f} |",
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
