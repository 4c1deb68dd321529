"""Simulator speed at Philly scale: replay 82,000 synthetic jobs on the 2,048-GPU cluster.

The scenario `philly-82k` (scenarios/philly-82k.yaml) draws 82,000 jobs from the Philly distribution at the
trace's mean arrival rate and maps them to LLM jobs (frenzy_opt/simulation/tracemap.py). Measured separately:

* **build** — generating the trace, mapping it to LLM jobs and searching the plans of every distinct job
  shape (a dozen searches, shared by all jobs: problem.OptionCache);
* **replay** — the discrete-event simulation under a policy, every decision included.

When ``../shared/traces/philly-pollux/traces/philly.csv`` exists (the public Philly trace as published by
Pollux, 82,247 jobs, CC BY 4.0; read in place, never copied), the script also replays the real trace on the
same cluster (``--trace`` to point elsewhere, ``--trace none`` to skip).

Goal (issue 4): the 82,000-job trace simulated in under 60 s on this machine. Sia and Gavel are not run
here: Sia's round-based ILP takes about as long per 60 s round at this scale as the whole frenzy replay
(see compare.md for its decision times on the 1,000-job 2,048-GPU scenario).

Usage, from the repository root::

    .venv/bin/python benchmarks/simulator_speed.py [--scenario philly-82k] [--policy frenzy,fifo]
        [--trace ../shared/traces/philly-pollux/traces/philly.csv] [--out benchmarks/results/simulator_speed.md]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from frenzy_opt.core.machine import describe_machine
from frenzy_opt.planning.scenario import parse_scenario
from frenzy_opt.research.experiment import Experiment, parse_policies, prepare, run_policies

PHILLY = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "philly-pollux" / "traces" / "philly.csv"


def _rows(experiment: Experiment, policies: list[str], label: str) -> list[str]:
    rows = []
    for name in policies:
        run_policies(experiment, [name])
        m = experiment.results[name].metrics()
        total = experiment.build_s + float(m["sim_wall_s"])
        rows.append(
            f"| {label} | {name} | {len(experiment.jobs):,} | {experiment.build_s:.1f} | {float(m['sim_wall_s']):.1f} "
            f"| {total:.1f} | {m['num_decisions']:,} | {float(m['mean_decision_ms']):.3f} "
            f"| {float(m['p99_decision_ms']):.3f} | {float(m['avg_jct_s']) / 3600:.2f} "
            f"| {float(m['utilization']):.1%} |"
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--scenario", default="philly-82k")
    parser.add_argument("--policy", default="frenzy,fifo")
    parser.add_argument("--out", default="benchmarks/results/simulator_speed.md")
    parser.add_argument("--trace", default=str(PHILLY), help="a Philly-style CSV to replay too, or 'none'")
    args = parser.parse_args()
    started = time.perf_counter()
    policies = parse_policies(args.policy)
    experiment = prepare(args.scenario)
    rows = _rows(experiment, policies, f"`{args.scenario}` (synthetic)")
    trace = Path(args.trace)
    if args.trace != "none" and trace.is_file():
        real = parse_scenario(
            {"name": "philly-trace", "cluster": experiment.scenario.cluster.name, "workload": {"trace": str(trace)}}
        )
        rows += _rows(prepare(real), policies, f"Philly trace `{trace.name}` ({trace.stat().st_size / 1e6:.1f} MB)")
    sc = experiment.scenario
    lines = [
        "# Simulator speed at Philly scale",
        "",
        f"Command: `.venv/bin/python benchmarks/simulator_speed.py --scenario {args.scenario} --policy {args.policy}`.",
        f"Machine: {describe_machine()}. Wall time of the whole script: {time.perf_counter() - started:.0f} s.",
        "",
        f"Scenario `{sc.name}`: {len(experiment.jobs):,} jobs on {sc.cluster.name} ({sc.cluster.num_gpus:,} GPUs). "
        "Build = trace generation, mapping to LLM jobs and the shared plan searches; replay = the "
        "discrete-event simulation with every scheduling decision. Goal: under 60 s.",
        "",
        "| workload | policy | jobs | build s | replay s | total s | decisions | mean decision ms | p99 decision ms "
        "| avg JCT h | utilization |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
    ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
