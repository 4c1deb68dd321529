"""The constants of the frenzy policy's moves (:mod:`frenzy_opt.solvers.greedy_review`), chosen by
cross-validation between Sia's two trace sets: the restart budget ``MAX_OVERHEAD`` and the gain margin
``MOVE_MARGIN``::

    .venv/bin/python benchmarks/overhead_sweep.py --out benchmarks/results/overhead_sweep.md
    .venv/bin/python benchmarks/overhead_sweep.py --constant MOVE_MARGIN --out benchmarks/results/move_margin_sweep.md

Every workload file of Sia's ``philly`` and ``saturn`` sets is replayed on ``sia-64`` with Sia's tables as the
truth (``frenzy compare --sections sia-traces``), under ``sia`` once and under ``frenzy`` at each value (the
other constants as shipped). Per set and value: 1 - frenzy's / sia's average JCT, paired by file, mean and
Student-t 95 % half-width, and p99 the same way. Cross-validation: the value best on one set (highest mean
reduction, the smallest value on a tie) is then read on the other set, which took no part in choosing it. Needs
Sia's artefact (``../shared/traces``).
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

SWEEPS: dict[str, tuple[tuple[float, ...], str]] = {
    "MAX_OVERHEAD": (
        (0.05, 0.1, 0.2, 0.3, 0.5, 1.0),
        "a job may be moved only while its restarts, the next one included, take at most this fraction of its time "
        "since its first start",
    ),
    "MOVE_MARGIN": (
        (0.0, 0.15, 0.3, 0.45, 0.6, 0.75, 1.0, 1.5),
        "a preemption must save the waiting job this many times what it costs the stopped jobs, and a growth save "
        "this many restarts",
    ),
}
"""Per constant: the values swept by default, and what it bounds."""
Series = list[tuple[float, float]]
"""(average, p99) JCT per workload file."""


def _jct(result: SimResult) -> tuple[float, float]:
    metrics = result.metrics()
    return float(metrics["avg_jct_s"]), float(metrics["p99_jct_s"])


def run(constant: str, values: tuple[float, ...]) -> tuple[dict[str, Series], dict[tuple[str, float], Series]]:
    """Sia's (avg, p99) JCT per set and file, and frenzy's per (set, value of ``constant``) and file."""
    cluster = load_cluster_ref(DEFAULT_SIA_CLUSTER)
    sia: dict[str, Series] = {}
    frenzy: dict[tuple[str, float], Series] = {}
    saved = getattr(greedy_review, constant)
    try:
        for name in DEFAULT_SIA_SETS:
            files = sorted((SIA_WORKLOADS / name).glob("workload-*.csv"))
            runs = run_sia_workloads(files, ["sia"], cluster=cluster, label=name)
            sia[name] = [_jct(e.results["sia"]) for e in runs.experiments]
            for value in values:
                setattr(greedy_review, constant, value)
                runs = run_sia_workloads(files, ["frenzy"], cluster=cluster, label=name)
                frenzy[(name, value)] = [_jct(e.results["frenzy"]) for e in runs.experiments]
                print(f"{name} {value:g}: done", file=sys.stderr, flush=True)
    finally:
        setattr(greedy_review, constant, saved)
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
    constant: str,
    sia: dict[str, Series],
    frenzy: dict[tuple[str, float], Series],
    values: tuple[float, ...],
    command: str,
    wall_s: float,
) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# The frenzy policy's `{constant}` on Sia's traces",
        "",
        f"- Command: `{command}`",
        f"- Machine: {platform.platform()}; nproc {len(os.sched_getaffinity(0))}; CPU {cpu_model()}",
        f"- Python {platform.python_version()}; frenzy-opt {package_version('frenzy-opt')}; date {now}; "
        f"took {wall_s / 60:.1f} min",
        "",
        f"`{constant}` (solvers/greedy_review.py): {SWEEPS[constant][1]}. Every file of each set on "
        f"`{DEFAULT_SIA_CLUSTER}` with Sia's tables as the truth; reduction = 1 - frenzy's / sia's JCT, paired by "
        "file, mean ± Student-t 95 % half-width (positive: frenzy lower).",
        "",
        "| set | files | value | avg JCT reduction | p99 JCT reduction |",
        "|---|---:|---:|---:|---:|",
    ]
    best: dict[str, float] = {}
    for name in sia:
        scores = {}
        for value in values:
            avg, avg_h = reduction(frenzy[(name, value)], sia[name], 0)
            p99, p99_h = reduction(frenzy[(name, value)], sia[name], 1)
            scores[value] = avg
            lines.append(
                f"| {name} | {len(sia[name])} | {value:g} | {avg:+.1%} ± {avg_h:.1%} | {p99:+.1%} ± {p99_h:.1%} |"
            )
        best[name] = max(values, key=lambda b: (round(scores[b], 6), -b))
    lines += ["", "Cross-validation (the value best on one set, read on the other):", ""]
    lines += [
        "| chosen on | value | measured on | avg JCT reduction | p99 JCT reduction |",
        "|---|---:|---|---:|---:|",
    ]
    names = list(sia)
    for chosen, held in zip(names, names[::-1], strict=True):
        value = best[chosen]
        lines.append(f"| {chosen} | {value:g} | {held} | {cells(frenzy[(held, value)], sia[held])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the Markdown table here (default: stdout only)")
    parser.add_argument("--constant", choices=sorted(SWEEPS), default="MAX_OVERHEAD", help="the constant swept")
    parser.add_argument("--values", "--budgets", help="comma-separated values (default: the constant's own)")
    args = parser.parse_args(argv)
    defaults = SWEEPS[args.constant][0]
    values = tuple(float(b) for b in args.values.split(",")) if args.values else defaults
    tick = time.perf_counter()
    sia, frenzy = run(args.constant, values)
    command = "python benchmarks/overhead_sweep.py" + (
        f" --constant {args.constant}" if args.constant != "MAX_OVERHEAD" else ""
    )
    command += f" --values {args.values}" if args.values else ""
    command += f" --out {args.out}" if args.out else ""
    text = render(args.constant, sia, frenzy, values, command, time.perf_counter() - tick)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
