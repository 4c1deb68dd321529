"""Where each policy's GPU-hours go when step times are not what the model predicts (the ``noisy`` truth)::

    .venv/bin/python benchmarks/placement_truth.py --out benchmarks/results/placement_truth.md

Each policy runs the same scenario and seeds as ``frenzy compare`` does (noisy truth: the prediction x exp(r), r
drawn per (seed, job, GPU type) from the step-time model's cross-validated log residuals,
:mod:`frenzy_opt.simulation.truth`). Per policy and seed, over every run segment of every job:

* GPU-hours held, and the part spent restarting (checkpoint load, warm-up: ``Segment.restart_s``);
* *predicted GPU-hours of the steps done*: the steps each segment made times the GPUs x predicted step time of its
  configuration: what the work would have cost had every step run as predicted. Equal across policies when they
  choose configurations (GPU type and count) of equal predicted efficiency;
* *width efficiency*: the same steps at the leanest count of the segment's GPU type over that (1 = every step on the
  count of fewest GPU-seconds per step on its type);
* *true / predicted*: GPU-hours run (restarts excluded) over the predicted GPU-hours of the same steps: above 1 the
  policy's steps ran slower than predicted, below 1 faster;
* *true-speed rank of the type*: per segment, the place of its GPU type among the job's GPU types ordered by the
  job's true factor exp(r) there (0: the type where the job runs fastest against its prediction), averaged over
  GPU-hours. A policy that does not react to measurements holds each job on a type of rank about (types - 1) / 2 on
  average; one that moves jobs off the types where they turn out slow holds less.

It explains a policy's makespan (and so the JCT of its last jobs) by how much work it does, and how much of that
comes from where it placed jobs against their true speeds rather than from the configurations it predicted.
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
from frenzy_opt.planning.scenario import load_scenario
from frenzy_opt.research.experiment import Experiment, prepare, run_policies
from frenzy_opt.simulation.truth import NoisyTruth, TruthKind, TruthSpec

COLUMNS = (
    ("gpu_h", "GPU-h", "{:,.0f}"),
    ("restart_h", "restarting GPU-h", "{:,.0f}"),
    ("predicted_h", "predicted GPU-h of the steps done", "{:,.0f}"),
    ("width", "width efficiency", "{:.3f}"),
    ("true_over_predicted", "true / predicted", "{:.3f}"),
    ("rank", "true-speed rank of the type", "{:.2f}"),
    ("makespan_h", "makespan h", "{:.2f}"),
    ("avg_jct_h", "avg JCT h", "{:.2f}"),
    ("p99_jct_h", "p99 JCT h", "{:.2f}"),
)


def measure(experiment: Experiment, policy: str) -> dict[str, float]:
    """The module docstring's figures for one policy's run of ``experiment``."""
    truth = experiment.truth
    assert isinstance(truth, NoisyTruth)
    result = experiment.results[policy]
    gpu_h = restart_h = predicted_h = lean_h = rank_h = 0.0
    for state in result.jobs.values():
        job = state.job
        lean: dict[str, float] = {}
        for (gpu_type, count), option in job.per_count.items():
            lean[gpu_type] = min(lean.get(gpu_type, float("inf")), count * option.duration_s)
        factors = sorted(truth.factor(job.id, gpu_type) for gpu_type in lean)
        for segment in state.segments:
            held = segment.num_gpus * (segment.end_s - segment.start_s) / 3600
            restarting = segment.num_gpus * min(segment.restart_s, segment.end_s - segment.start_s) / 3600
            gpu_h += held
            restart_h += restarting
            option = job.per_count[(segment.gpu_type, segment.num_gpus)]  # one step of that configuration
            steps = max(segment.end_s - segment.start_s - segment.restart_s, 0.0) / segment.step_s
            predicted_h += steps * segment.num_gpus * option.duration_s / 3600
            lean_h += steps * lean[segment.gpu_type] / 3600
            rank_h += held * factors.index(truth.factor(job.id, segment.gpu_type))
    metrics = result.metrics()
    return {
        "gpu_h": gpu_h,
        "restart_h": restart_h,
        "predicted_h": predicted_h,
        "width": lean_h / predicted_h,
        "true_over_predicted": (gpu_h - restart_h) / predicted_h,
        "rank": rank_h / gpu_h,
        "makespan_h": float(metrics["makespan_s"]) / 3600,
        "avg_jct_h": float(metrics["avg_jct_s"]) / 3600,
        "p99_jct_h": float(metrics["p99_jct_s"]) / 3600,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="cluster2048-llm", help="a scenario name or file (default %(default)s)")
    parser.add_argument("--policy", default="frenzy,sia", help="comma-separated policies (default %(default)s)")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds (default %(default)s)")
    parser.add_argument("--out", type=Path, help="write the Markdown report here (default: print it)")
    args = parser.parse_args(argv)
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds: comma-separated integers, got {args.seeds!r}")
    started, load = time.time(), os.getloadavg()
    scenario = load_scenario(args.scenario)
    rows: dict[str, list[dict[str, float]]] = {p: [] for p in policies}
    for seed in seeds:
        experiment = prepare(scenario, truth=TruthSpec(kind=TruthKind.NOISY).make(seed), seed_offset=seed)
        run_policies(experiment, policies)
        for policy in policies:
            rows[policy].append(measure(experiment, policy))
            print(f"seed {seed} {policy}: {rows[policy][-1]}", file=sys.stderr, flush=True)
    took = time.time() - started
    lines = [
        "# Where the GPU-hours go under the noisy truth",
        "",
        f"- Command: `.venv/bin/python benchmarks/placement_truth.py --scenario {args.scenario} --policy "
        f"{','.join(policies)} --seeds {','.join(map(str, seeds))}`",
        f"- Machine: {platform.platform()}; nproc {os.cpu_count()}; CPU {cpu_model()}; Python "
        f"{platform.python_version()}; frenzy-opt {package_version('frenzy-opt')}",
        f"- Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; load average at start "
        f"{load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}; took {took / 60:.1f} min",
        "",
        "What each column means: the module docstring of `benchmarks/placement_truth.py`. Per seed, then the mean.",
        "",
        "| policy | seed | " + " | ".join(title for _, title, _ in COLUMNS) + " |",
        "|---|---:|" + "---:|" * len(COLUMNS),
    ]
    for policy in policies:
        for seed, row in zip(seeds, rows[policy], strict=True):
            cells = " | ".join(fmt.format(row[key]) for key, _, fmt in COLUMNS)
            lines.append(f"| `{policy}` | {seed} | {cells} |")
        means = " | ".join(fmt.format(statistics.mean(r[key] for r in rows[policy])) for key, _, fmt in COLUMNS)
        lines.append(f"| `{policy}` | mean | {means} |")
    text = "\n".join(lines) + "\n"
    if args.out is None:
        print(text, end="")
    else:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
