"""Loopback load test of the HTTP service: N job submissions at a fixed concurrency.

Starts ``frenzy serve`` as its own process on 127.0.0.1 (SQLite file in a temporary folder, the simulated
executor at ``--time-scale``), submits ``--jobs`` jobs with ``--concurrency`` requests in flight (an asyncio
httpx client), each with an ``Idempotency-Key``, then reads every job back and checks that none was lost or
duplicated. Reports throughput, p50/p95/p99/max submission latency (the whole POST round trip: validation,
plan lookup, the database write, and the wait for the scheduler's first decision on the job), and the
states the jobs reached. Goal (issue 13): p99 < 50 ms per submission at concurrency 32, none lost.

Usage, from the repository root::

    .venv/bin/python benchmarks/service_load.py [--jobs 2000] [--concurrency 1,4,16,32] [--time-scale 100000]
        [--out benchmarks/results/service_load.md]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import httpx

from frenzy_opt.api.server import serve_process
from frenzy_opt.core.machine import describe_machine
from frenzy_opt.simulation.simulator import percentile

ROOT = Path(__file__).resolve().parents[1]
SPECS = [
    {"model": "gpt3-125m", "training": {"seq_len": 1024, "global_batch_size": 32, "train_steps": 200}},
    {"model": "gpt3-350m", "training": {"seq_len": 2048, "global_batch_size": 64, "train_steps": 500}},
    {"model": "gpt3-1.3b", "training": {"seq_len": 2048, "global_batch_size": 128, "train_steps": 1000}},
    {"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 256, "train_steps": 2000}},
]


async def _submit_all(url: str, jobs: int, concurrency: int) -> tuple[list[float], list[str], list[int]]:
    latencies: list[float] = []
    ids: list[str] = []
    errors: list[int] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(jobs):
        queue.put_nowait(i)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def worker() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                start = time.perf_counter()
                answer = await client.post(
                    "/v1/jobs", json=SPECS[i % len(SPECS)], headers={"Idempotency-Key": f"load-{i}"}
                )
                latencies.append(time.perf_counter() - start)
                if answer.status_code == 202:
                    ids.append(answer.json()["id"])
                else:
                    errors.append(answer.status_code)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, ids, errors


def run_once(jobs: int, concurrency: int, time_scale: float, decision_wait_s: float) -> tuple[str, str, float]:
    """One fresh server, ``jobs`` submissions at ``concurrency``; the table row, the states seen, the p99."""
    with tempfile.TemporaryDirectory(prefix="frenzy-load-") as tmp:
        db = f"sqlite:///{Path(tmp) / 'load.db'}"
        args = ["--db", db, "--create", "--time-scale", str(time_scale), "--decision-wait-s", str(decision_wait_s)]
        with serve_process(args, cwd=ROOT) as (url, _):
            with httpx.Client(base_url=url, timeout=60) as client:
                for spec in SPECS:  # warm the plan cache (a first search takes ~0.3 s); not counted
                    client.post("/v1/jobs", json=spec)
            started = time.perf_counter()
            latencies, ids, errors = asyncio.run(_submit_all(url, jobs, concurrency))
            wall = time.perf_counter() - started
            stored: list[str] = []
            states: dict[str, int] = {}
            with httpx.Client(base_url=url, timeout=60) as client:
                offset: int | None = 0
                while offset is not None:
                    page = client.get("/v1/jobs", params={"limit": 500, "offset": offset}).json()
                    for item in page["items"]:
                        stored.append(item["id"])
                        states[item["state"]] = states.get(item["state"], 0) + 1
                    offset = page["next_offset"]
    lat = sorted(x * 1e3 for x in latencies)
    lost = len(set(ids) - set(stored))
    duplicated = len(stored) - len(set(stored))
    p99 = percentile(lat, 99)
    row = (
        f"| {jobs} | {concurrency} | {len(ids)} | {len(errors)} | {wall:.1f} | {len(latencies) / wall:.0f} "
        f"| {percentile(lat, 50):.1f} | {percentile(lat, 95):.1f} | {p99:.1f} | {lat[-1]:.1f} "
        f"| {len(stored) - len(SPECS)} | {lost} | {duplicated} |"
    )
    print(row, flush=True)
    return row, ", ".join(f"{k} {v}" for k, v in sorted(states.items())), p99


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--concurrency", default="1,4,16,32", help="comma-separated; one fresh server each")
    parser.add_argument("--time-scale", type=float, default=100000.0)
    parser.add_argument("--decision-wait-s", type=float, default=0.25)
    parser.add_argument("--out", default="benchmarks/results/service_load.md")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    results = [run_once(args.jobs, c, args.time_scale, args.decision_wait_s) for c in levels]
    lines = [
        "# Service load test (loopback)",
        "",
        f"Command: `.venv/bin/python benchmarks/service_load.py --jobs {args.jobs} --concurrency {args.concurrency} "
        f"--time-scale {args.time_scale:g} --decision-wait-s {args.decision_wait_s:g}`.",
        f"Machine: {describe_machine()}. Server and load generator share the machine's CPUs.",
        "",
        f"Per row a fresh `frenzy serve` process (SQLite WAL file, simulated executor at {args.time_scale:g} cluster "
        "seconds per second, cluster paper-3type), then the submissions: four job specs in rotation (plan cache "
        "warmed by one submission each, not counted), each POST with its own Idempotency-Key. Latency = the whole "
        "round trip of POST /v1/jobs, including the wait for the scheduler's first decision on the job (at most "
        f"{args.decision_wait_s:g} s). `stored` = the submissions read back with GET /v1/jobs afterwards; `lost` = "
        "accepted ids not read back; `duplicated` = ids read back twice.",
        "",
        "| submissions | concurrency | accepted | errors | wall s | throughput /s | p50 ms | p95 ms | p99 ms | max ms "
        "| stored | lost | duplicated |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *[row for row, _, _ in results],
        "",
        *[f"States read back at concurrency {c}: {states}." for c, (_, states, _) in zip(levels, results, strict=True)],
        "",
        "Goal p99 < 50 ms: "
        + "; ".join(
            f"concurrency {c}: **{'met' if p99 < 50 else 'not met'}**"
            for c, (_, _, p99) in zip(levels, results, strict=True)
        )
        + ".",
        "",
    ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
