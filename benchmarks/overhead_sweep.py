"""The restart budget of the frenzy policy's moves (``MAX_OVERHEAD`` of :mod:`frenzy_opt.solvers.greedy_review`),
chosen by cross-validation between Sia's two trace sets:

    .venv/bin/python benchmarks/overhead_sweep.py --out benchmarks/results/overhead_sweep.md

Every workload file of Sia's ``philly`` and ``saturn`` sets is replayed on ``sia-64`` with Sia's tables as the
truth (``frenzy compare --sections sia-traces``), under ``sia`` once and under ``frenzy`` at each budget. Per
set and budget: 1 - frenzy's / sia's average JCT, paired by file, mean and Student-t 95 % half-width, and p99 the
same way. Cross-validation: the budget best on one set (highest mean reduction, the smallest budget on a tie)
is then read on the other set, which took no part in choosing it. Needs Sia's artefact (``../shared/traces``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from frenzy_opt.core.machine import cpu_model, package_version
from frenzy_opt.planning.scenario import load_cluster_ref
from frenzy_opt.research.compare import DEFAULT_SIA_CLUSTER, DEFAULT_SIA_SETS, SIA_WORKLOADS, run_sia_workloads
from frenzy_opt.research.stats import ci95_half_width
from frenzy_opt.simulation.simulator import SimResult
from frenzy_opt.solvers import greedy_review

BUDGETS = (0.05, 0.1, 0.2, 0.3, 0.5, 1.0)
Series = list[tuple[float, float]]
"""(average, p99) JCT per workload file."""


def _jct(result: SimResult) -> tuple[float, float]:
    metrics = result.metrics()
    return float(metrics["avg_jct_s"]), float(metrics["p99_jct_s"])


def run(budgets: tuple[float, ...]) -> tuple[dict[str, Series], dict[tuple[str, float], Series]]:
    """Sia's (avg, p99) JCT per set and file, and frenzy's per (set, budget) and file."""
    cluster = load_cluster_ref(DEFAULT_SIA_CLUSTER)
    sia: dict[str, Series] = {}
    frenzy: dict[tuple[str, float], Series] = {}
    saved = greedy_review.MAX_OVERHEAD
    try:
        for name in DEFAULT_SIA_SETS:
            files = sorted((SIA_WORKLOADS / name).glob("workload-*.csv"))
            runs = run_sia_workloads(files, ["sia"], cluster=cluster, label=name)
            sia[name] = [_jct(e.results["sia"]) for e in runs.experiments]
            for budget in budgets:
                greedy_review.MAX_OVERHEAD = budget
                runs = run_sia_workloads(files, ["frenzy"], cluster=cluster, label=name)
                frenzy[(name, budget)] = [_jct(e.results["frenzy"]) for e in runs.experiments]
                print(f"{name} {budget:g}: done", file=sys.stderr, flush=True)
    finally:
        greedy_review.MAX_OVERHEAD = saved
    return sia, frenzy


def reduction(ours: Series, theirs: Series, k: int) -> tuple[float, float]:
    """1 - ours / theirs per file (``k``: 0 average, 1 p99): mean and 95 % half-width."""
    values = [1.0 - a[k] / b[k] for a, b in zip(ours, theirs, strict=True)]
    return statistics.mean(values), ci95_half_width(values) or 0.0


def cells(ours: Series, theirs: Series) -> str:
    """The average and p99 reduction cells of a row."""
    (avg, avg_h), (p99, p99_h) = reduction(ours, theirs, 0), reduction(ours, theirs, 1)
    return f"{avg:+.1%} ± {avg_h:.1%} | {p99:+.1%} ± {p99_h:.1%}"


def render(
    sia: dict[str, Series],
    frenzy: dict[tuple[str, float], Series],
    budgets: tuple[float, ...],
    command: str,
    wall_s: float,
) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# The frenzy policy's restart budget on Sia's traces",
        "",
        f"- Command: `{command}`",
        f"- Machine: {platform.platform()}; nproc {len(os.sched_getaffinity(0))}; CPU {cpu_model()}",
        f"- Python {platform.python_version()}; frenzy-opt {package_version('frenzy-opt')}; date {now}; "
        f"took {wall_s / 60:.1f} min",
        "",
        "`MAX_OVERHEAD` (solvers/greedy_review.py): a job may be moved only while its restarts, the next one "
        "included, take at most this fraction of its time since its first start. Every file of each set on "
        f"`{DEFAULT_SIA_CLUSTER}` with Sia's tables as the truth; reduction = 1 - frenzy's / sia's JCT, paired by "
        "file, mean ± Student-t 95 % half-width (positive: frenzy lower).",
        "",
        "| set | files | budget | avg JCT reduction | p99 JCT reduction |",
        "|---|---:|---:|---:|---:|",
    ]
    best: dict[str, float] = {}
    for name in sia:
        scores = {}
        for budget in budgets:
            avg, avg_h = reduction(frenzy[(name, budget)], sia[name], 0)
            p99, p99_h = reduction(frenzy[(name, budget)], sia[name], 1)
            scores[budget] = avg
            lines.append(
                f"| {name} | {len(sia[name])} | {budget:g} | {avg:+.1%} ± {avg_h:.1%} | {p99:+.1%} ± {p99_h:.1%} |"
            )
        best[name] = max(budgets, key=lambda b: (round(scores[b], 6), -b))
    lines += ["", "Cross-validation (the budget best on one set, read on the other):", ""]
    lines += [
        "| chosen on | budget | measured on | avg JCT reduction | p99 JCT reduction |",
        "|---|---:|---|---:|---:|",
    ]
    names = list(sia)
    for chosen, held in zip(names, names[::-1], strict=True):
        budget = best[chosen]
        lines.append(f"| {chosen} | {budget:g} | {held} | {cells(frenzy[(held, budget)], sia[held])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the Markdown table here (default: stdout only)")
    parser.add_argument("--budgets", default=",".join(f"{b:g}" for b in BUDGETS), help="comma-separated budgets")
    args = parser.parse_args(argv)
    budgets = tuple(float(b) for b in args.budgets.split(","))
    tick = time.perf_counter()
    sia, frenzy = run(budgets)
    command = "python benchmarks/overhead_sweep.py" + (f" --out {args.out}" if args.out else "")
    text = render(sia, frenzy, budgets, command, time.perf_counter() - tick)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
