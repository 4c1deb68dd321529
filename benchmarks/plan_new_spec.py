"""Benchmark: planning a job spec the process has not seen, on a 2,048-GPU cluster of three GPU types.

Target (issue 26 item 2, "plans for a new spec in milliseconds"): a new spec planned in < 100 ms on a
2,048-GPU, 3-type cluster. ``frenzy solve``, the simulator and the service plan each distinct job spec once
(:class:`frenzy_opt.planning.problem.OptionCache`) through :func:`frenzy_opt.planning.problem.search_options`,
which asks :func:`frenzy_opt.planning.fastest.fastest_plans` for the fastest plan per (GPU type, GPU count):
that is the "scheduler's search" timed here. ``enumerate_plans`` (every feasible plan, ranked: what
``frenzy plan`` and the API's dry run list) is timed too. The first search of a spec is what a new spec costs;
its repeats are listed too (the process-wide memos of stage models, reserve ratios and step terms then hold
its candidates).

The cluster: three of ``scenarios/cluster-2048.yaml``'s GPU types in 256 8-GPU nodes, 64 H100-SXM5-80GB,
96 A100-SXM4-80GB and 96 V100-SXM2-32GB (the shipped file has four types; the L40S nodes are V100s here, a
design choice to get three types at 2,048 GPUs). Specs: catalogue models at common training settings
(bf16, Megatron, micro-batch searched, nothing pinned).

Each (spec, search) runs in a fresh subprocess which first plans a small other job (gpt3-125m) the same
way, so that the data files and per-GPU tables are loaded as in a running service; then the spec's first
search ("new spec") and ``--repeats`` further searches ("repeat", median). Imports and parsing are outside
every timing.

The scenario-loading rows time ``load_mapping`` on a generated 512-job scenario file (every job a mapping of
the shape the shipped scenarios use) with libyaml's C loader and with PyYAML's pure-Python loader.

Usage::

    python benchmarks/plan_new_spec.py --out benchmarks/results/plan_new_spec.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from frenzy_opt.core.machine import cpu_model, package_version

TARGET_MS = 100.0
CLUSTER: dict[str, Any] = {
    "name": "bench-2048-3type",
    "node_groups": [
        {"gpu": "H100-SXM5-80GB", "num_nodes": 64, "gpus_per_node": 8, "intra_node": "nvlink"},
        {"gpu": "A100-SXM4-80GB", "num_nodes": 96, "gpus_per_node": 8, "intra_node": "nvlink"},
        {"gpu": "V100-SXM2-32GB", "num_nodes": 96, "gpus_per_node": 8, "intra_node": "nvlink"},
    ],
    "network": {"inter_node_gbps": 400},
}
# (model, seq_len, global batch): catalogue models at the settings of their published training runs' scale.
SPECS = (
    ("llama2-7b", 4096, 256),
    ("llama3-8b", 8192, 512),
    ("llama2-13b", 4096, 512),
    ("llama3-70b", 8192, 1024),
)
NUM_SCENARIO_JOBS = 512


def job_mapping(model: str, seq: int, global_batch: int) -> dict[str, Any]:
    return {
        "name": f"bench-{model}",
        "model": model,
        "training": {"seq_len": seq, "global_batch_size": global_batch, "micro_batch_size": 1,
                     "precision": "bf16", "runtime": "megatron"},
    }  # fmt: skip


def measure_one(model: str, seq: int, global_batch: int, repeats: int, mode: str) -> dict[str, Any]:
    """The spec's first search and ``repeats`` more, in this (fresh) process after a small other job;
    ``mode`` "scheduler" (search_options) or "full" (enumerate_plans)."""
    from frenzy_opt.core.spec import JobSpec, parse_job
    from frenzy_opt.hardware.cluster import parse_cluster
    from frenzy_opt.hardware.topology import Topology
    from frenzy_opt.planning.plans import enumerate_plans
    from frenzy_opt.planning.problem import search_options

    cluster = parse_cluster(CLUSTER)
    topology = Topology(cluster)

    def search(job: JobSpec) -> int:
        if mode == "full":
            return len(enumerate_plans(job, cluster).plans)
        return len(search_options(job, cluster, topology=topology).per_count)

    search(parse_job(job_mapping("gpt3-125m", 2048, 64)))
    job = parse_job(job_mapping(model, seq, global_batch))
    t0 = time.perf_counter()
    found = search(job)
    first_ms = (time.perf_counter() - t0) * 1e3
    again = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        search(job)
        again.append((time.perf_counter() - t0) * 1e3)
    return {"model": model, "seq": seq, "global_batch": global_batch, "mode": mode, "found": found,
            "first_ms": first_ms, "repeat_ms": again}  # fmt: skip


def scenario_load_ms(rounds: int = 3) -> dict[str, float]:
    """Least time over ``rounds`` to read a generated 512-job scenario file, per YAML loader."""
    import yaml

    from frenzy_opt import yamlload
    from frenzy_opt.core.spec import load_mapping

    specs = [job_mapping(*SPECS[i % len(SPECS)]) for i in range(NUM_SCENARIO_JOBS)]
    jobs = [{"id": f"job-{i}", "arrival_s": 30.0 * i, **spec} for i, spec in enumerate(specs)]
    text = yaml.safe_dump({"name": "bench-512", "cluster": CLUSTER, "jobs": jobs}, sort_keys=False)
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "scenario.yaml"
        path.write_text(text, encoding="utf-8")
        for name, loader in (("C (CSafeLoader)", yamlload.FAST_LOADER), ("pure Python (SafeLoader)", yaml.SafeLoader)):
            saved = yamlload.FAST_LOADER
            yamlload.FAST_LOADER = loader
            try:
                times = []
                for _ in range(rounds):
                    t0 = time.perf_counter()
                    load_mapping(path)
                    times.append((time.perf_counter() - t0) * 1e3)
            finally:
                yamlload.FAST_LOADER = saved
            out[name] = min(times)
    out["file_kib"] = len(text.encode()) / 1024
    return out


def run_in_subprocess(model: str, seq: int, global_batch: int, repeats: int, mode: str) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", model, str(seq), str(global_batch),
           "--mode", mode, "--repeats", str(repeats)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def render(
    rows: list[tuple[dict[str, Any], dict[str, Any]]], loads: dict[str, float], repeats: int, command: str, load: str
) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    groups = ", ".join(f"{g['num_nodes'] * g['gpus_per_node']} {g['gpu']}" for g in CLUSTER["node_groups"])
    lines = [
        "# Planning a new spec",
        "",
        f"Planning a spec the process has not planned yet, on {groups} (2,048 GPUs, 3 types); "
        "bf16, Megatron, micro-batch searched, no pinned parallel fields.",
        "",
        f"- Command: `{command}`",
        f"- Machine: {platform.platform()}; nproc {len(os.sched_getaffinity(0))}; CPU {cpu_model()}",
        f"- Python {platform.python_version()} ({platform.python_implementation()}); "
        f"frenzy-opt {package_version('frenzy-opt')}",
        f"- Date: {now}; 1/5/15-min load average at start / end: {load}",
        f"- Target: a new spec planned in < {TARGET_MS:.0f} ms",
        "",
        "New spec = the spec's first search in a process that has planned one small other job (gpt3-125m) the "
        f"same way. Repeat = the median of {repeats} further searches of the same spec. Scheduler's search = "
        "`search_options` (the fastest plan per admissible GPU type and count: what solve, simulate and the "
        "service plan with); full list = `enumerate_plans` (every feasible plan).",
        "",
        "| spec | (type, count) pairs | scheduler's search: new spec ms | repeat ms | feasible plans | full list: "
        "new spec ms | repeat ms | target met (scheduler's search, new spec) |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for fast, full in rows:
        first = fast["first_ms"]
        met = "yes" if first < TARGET_MS else f"**no** ({first / TARGET_MS:.1f}x the target)"
        lines.append(
            f"| {fast['model']} seq {fast['seq']} batch {fast['global_batch']} | {fast['found']:,} | {first:.0f} | "
            f"{statistics.median(fast['repeat_ms']):.0f} | {full['found']:,} | {full['first_ms']:.0f} | "
            f"{statistics.median(full['repeat_ms']):.0f} | {met} |"
        )
    lines += [
        "",
        f"Reading a generated {NUM_SCENARIO_JOBS}-job scenario file ({loads['file_kib']:.0f} KiB) with "
        "`frenzy_opt.core.spec.load_mapping`, least of 3:",
        "",
        "| YAML loader | ms |",
        "|---|---:|",
    ]
    lines += [f"| {name} | {ms:.1f} |" for name, ms in loads.items() if name != "file_kib"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the Markdown table here (default: stdout only)")
    parser.add_argument("--repeats", type=int, default=3, help="further searches per spec (default 3)")
    parser.add_argument("--one", nargs=3, metavar=("MODEL", "SEQ", "BATCH"), help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("scheduler", "full"), default="scheduler", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.one:
        model, seq, batch = args.one[0], int(args.one[1]), int(args.one[2])
        print(json.dumps(measure_one(model, seq, batch, args.repeats, args.mode)))
        return 0
    load_start = "/".join(f"{x:.2f}" for x in os.getloadavg())
    rows = []
    for model, seq, batch in SPECS:
        fast, full = (run_in_subprocess(model, seq, batch, args.repeats, mode) for mode in ("scheduler", "full"))
        print(f"{model}: scheduler's search {fast['first_ms']:.0f} ms, full {full['first_ms']:.0f} ms", file=sys.stderr)
        rows.append((fast, full))
    loads = scenario_load_ms()
    load = f"{load_start} / " + "/".join(f"{x:.2f}" for x in os.getloadavg())
    command = shlex.join([sys.executable, *sys.argv])
    text = render(rows, loads, args.repeats, command, load)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
