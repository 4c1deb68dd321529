"""Admission at production rates (issue 27): a separate ``frenzy serve`` process on 127.0.0.1, loaded by a
separate load-generator process (``benchmarks/loadgen.py``).

1. **Acknowledgement latency** at each ``--concurrency`` (a fresh server each, SQLite WAL file or ``--db``
   PostgreSQL, the simulated executor at ``--time-scale``): ``--jobs`` POST /v1/jobs answered once stored
   (no ``?wait``), four job specs in rotation (the plan cache warmed first, not counted), each with its own
   ``Idempotency-Key``; p50/p95/p99/max of the round trip, throughput, errors.
2. **Deep queue** on ``cluster-2048`` (one server, simulated executor in real time, so nothing started ends
   during the run): tenant ``batch`` submits one long job shape until ``--depths`` jobs wait; its quota of
   H100-SXM5-80GB leaves one 8-GPU node it may not use, so a small job of tenant ``probe`` fits at once
   whatever the depth. At each depth: a burst of ``--burst`` submissions at concurrency 32, timed until the
   scheduler has queued every one of them (its ``frenzy_queue_length`` equals the store's queued jobs):
   admissions per second, decisions per second and the mean decision time in that window (``/metrics``);
   then ``--probes`` probe jobs one at a time, each read back after it started: milliseconds from its
   acknowledgement (the load generator's clock) to its ``running`` event (the server's clock, the same
   machine); the server's resident memory (its process tree), whose growth per 10,000 queued jobs is the
   slope between the first and the last depth.

Every run reads every job back (GET /v1/jobs, all pages) and counts acknowledged ids not stored (lost) and
ids stored twice (duplicated). Targets (issue 27, this machine, load generator included): p99 < 50 ms at
concurrency 32 and < 200 ms at 128 with 0 errors; >= 200 admissions/s with 5,000 queued; a job that fits
starts within 100 ms of its acknowledgement at that depth; 0 lost, 0 duplicated.

Usage, from the repository root::

    .venv/bin/python benchmarks/service_load.py [--jobs 2000] [--concurrency 1,8,32,128] [--depths 1000,5000,20000]
        [--workers 1] [--db URL] [--out benchmarks/results/service_load.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from frenzy_opt.api.server import serve_process
from frenzy_opt.core.machine import describe_machine, load_average
from frenzy_opt.simulation.simulator import percentile

ROOT = Path(__file__).resolve().parents[1]
SPECS = [
    {"model": "gpt3-125m", "training": {"seq_len": 1024, "global_batch_size": 32, "train_steps": 200}},
    {"model": "gpt3-350m", "training": {"seq_len": 2048, "global_batch_size": 64, "train_steps": 500}},
    {"model": "gpt3-1.3b", "training": {"seq_len": 2048, "global_batch_size": 128, "train_steps": 1000}},
    {"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 256, "train_steps": 2000}},
]
BATCH = {"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 256, "train_steps": 200000}}
"""The deep queue's job: days of GPU time, so nothing started ends during the run."""
PROBE = {"model": "gpt3-125m", "training": {"seq_len": 1024, "global_batch_size": 32, "train_steps": 100}}
TOKENS = {
    "tokens": [
        {"token": "batch-token", "tenant": "batch"},
        {"token": "probe-token", "tenant": "probe"},
        {"token": "admin-token", "tenant": "ops", "admin": True},
    ],
    "quotas": {"batch": {"H100-SXM5-80GB": 504}},
}
"""cluster-2048 has 64 nodes of 8 H100s: the batch tenant may hold 504 of them, one node stays free."""


def generate(url: str, bodies: list[dict[str, Any]], jobs: int, concurrency: int, prefix: str, token: str | None,
             tmp: str) -> dict[str, Any]:  # fmt: skip
    """Run the load generator in its own process; its JSON result."""
    path = Path(tmp) / f"bodies-{prefix}.json"
    path.write_text(json.dumps(bodies), encoding="utf-8")
    command = [sys.executable, str(ROOT / "benchmarks" / "loadgen.py"), "--url", url, "--bodies", str(path)]
    command += ["--jobs", str(jobs), "--concurrency", str(concurrency), "--prefix", prefix]
    command += ["--token", token] if token else []
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=3600)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def read_back(client: httpx.Client) -> list[str]:
    """Every stored job id, in submission order (GET /v1/jobs, all pages)."""
    ids: list[str] = []
    offset: int | None = 0
    while offset is not None:
        page = client.get("/v1/jobs", params={"limit": 500, "offset": offset}).json()
        ids += [item["id"] for item in page["items"]]
        offset = page["next_offset"]
    return ids


def lost_and_duplicated(acknowledged: list[str], stored: list[str]) -> tuple[int, int]:
    return len(set(acknowledged) - set(stored)), len(stored) - len(set(stored))


def metric(client: httpx.Client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def server_args(db: str | None, tmp: str, workers: int, *extra: str) -> list[str]:
    url = db or f"sqlite:///{Path(tmp) / 'load.db'}"
    return ["--db", url, "--create", *(["--workers", str(workers)] if workers > 1 else []), *extra]


def ack_run(jobs: int, concurrency: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="frenzy-load-") as tmp:
        extra = ["--time-scale", str(args.time_scale), "--cluster", args.cluster]
        server = serve_process(server_args(args.db, tmp, args.workers, *extra), cwd=ROOT, timeout_s=300)
        with server as (url, _), httpx.Client(base_url=url, timeout=300) as client:
            for spec in SPECS:  # warm the plan cache; not counted
                client.post("/v1/jobs", json=spec, params={"wait": 60}).raise_for_status()
            result = generate(url, SPECS, jobs, concurrency, f"c{concurrency}", None, tmp)
            stored = read_back(client)
    lat = sorted(x * 1e3 for x in result["latencies_s"])
    lost, dup = lost_and_duplicated(result["ids"], stored)
    return {
        "concurrency": concurrency,
        "acknowledged": len(result["ids"]),
        "errors": len(result["errors"]),
        "wall_s": result["wall_s"],
        "per_s": len(lat) / result["wall_s"],
        "p50": percentile(lat, 50),
        "p95": percentile(lat, 95),
        "p99": percentile(lat, 99),
        "max": lat[-1],
        "stored": len(stored) - len(SPECS),
        "lost": lost,
        "dup": dup,
    }


def settle(client: httpx.Client, timeout_s: float = 600.0) -> float:
    """Wait until the scheduler has queued every stored job still queued; when (time.time())."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stored = client.get("/v1/jobs", params={"state": "queued", "limit": 1}).json()["total"]
        if metric(client, "frenzy_queue_length") == stored:
            return time.time()
        time.sleep(0.02)
    raise SystemExit(f"the scheduler did not take in the queue within {timeout_s:.0f} s")


def probe(client: httpx.Client, admin: dict[str, str]) -> float:
    """Milliseconds from a probe job's acknowledgement to its ``running`` event."""
    headers = {"Authorization": "Bearer probe-token"}
    answer = client.post("/v1/jobs", json=PROBE, headers=headers)
    acknowledged = time.time()
    answer.raise_for_status()
    job_id = answer.json()["id"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(0.25)
        job = client.get(f"/v1/jobs/{job_id}", headers=admin).json()
        running = [e["at"] for e in job["history"] if e["state"] == "running"]
        if running:
            client.post(f"/v1/jobs/{job_id}/cancel", headers=admin)  # its GPUs back for the next probe
            return (running[0] - acknowledged) * 1e3
    raise SystemExit(f"probe {job_id} did not start within 30 s: {job['reason']}")


def depth_runs(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    admin = {"Authorization": "Bearer admin-token"}
    with tempfile.TemporaryDirectory(prefix="frenzy-depth-") as tmp:
        tokens = Path(tmp) / "tokens.json"
        tokens.write_text(json.dumps(TOKENS), encoding="utf-8")
        extra = ["--time-scale", "1", "--cluster", "cluster-2048", "--tokens", str(tokens)]
        server = serve_process(server_args(args.db, tmp, args.workers, *extra), cwd=ROOT, timeout_s=300)
        with server as (url, proc), httpx.Client(base_url=url, timeout=300, headers=admin) as client:
            for spec, token in ((BATCH, "batch-token"), (PROBE, "probe-token")):  # warm the plan cache
                client.post("/v1/jobs", json=spec, params={"wait": 60}, headers={"Authorization": f"Bearer {token}"})
            acknowledged: list[str] = []
            for depth in args.depths:
                queued = client.get("/v1/jobs", params={"state": "queued", "limit": 1}).json()["total"]
                fill = max(depth - queued, 0)
                if fill:
                    done = generate(url, [BATCH], fill, 32, f"fill{depth}", "batch-token", tmp)
                    acknowledged += done["ids"]
                settle(client)
                decisions, seconds = (
                    metric(client, "frenzy_decisions_total"),
                    metric(client, "frenzy_decision_seconds_sum"),
                )
                started = time.time()
                burst = generate(url, [BATCH], args.burst, 32, f"burst{depth}", "batch-token", tmp)
                acknowledged += burst["ids"]
                taken_in = settle(client) - started
                made = metric(client, "frenzy_decisions_total") - decisions
                spent = metric(client, "frenzy_decision_seconds_sum") - seconds
                probes = sorted(probe(client, admin) for _ in range(args.probes))
                stored = read_back(client)
                lost, dup = lost_and_duplicated(acknowledged, stored)
                lat = sorted(x * 1e3 for x in burst["latencies_s"])
                rows.append({
                    "depth": client.get("/v1/jobs", params={"state": "queued", "limit": 1}).json()["total"],
                    "admitted_per_s": args.burst / taken_in,
                    "burst_p99": percentile(lat, 99),
                    "errors": len(burst["errors"]),
                    "decisions_per_s": made / taken_in,
                    "decision_ms": spent / made * 1e3 if made else float("nan"),
                    "probe_median": percentile(probes, 50),
                    "probe_max": probes[-1],
                    "rss": rss_bytes(proc.pid),
                    "lost": lost,
                    "dup": dup,
                })  # fmt: skip
                print(rows[-1], flush=True)
    return rows


def report(args: argparse.Namespace, acks: list[dict[str, Any]], depths: list[dict[str, Any]], loads: list[str]) -> str:
    by = {r["concurrency"]: r for r in acks}
    lines = [
        "# Admission at production rates (loopback)",
        "",
        f"Command: `{' '.join(['.venv/bin/python', 'benchmarks/service_load.py', *sys.argv[1:]])}`.",
        f"Machine: {describe_machine()}. Server, load generator (its own process) and this script share the CPUs.",
        f"Load average (1/5/15 min) at start, after part 1, at end: {'; '.join(loads)}.",
        f"Store: {'SQLite WAL file' if args.db is None else args.db.split('@')[0].split('+')[0]}; "
        f"`frenzy serve --workers {args.workers}`.",
        "",
        f"## 1. Acknowledgement latency ({args.jobs} submissions per row, a fresh server, cluster {args.cluster})",
        "",
        "| concurrency | acknowledged | errors | wall s | per s | p50 ms | p95 ms | p99 ms | max ms | stored | lost "
        "| duplicated |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *[
            f"| {r['concurrency']} | {r['acknowledged']} | {r['errors']} | {r['wall_s']:.1f} | {r['per_s']:.0f} "
            f"| {r['p50']:.1f} | {r['p95']:.1f} | {r['p99']:.1f} | {r['max']:.1f} | {r['stored']} | {r['lost']} "
            f"| {r['dup']} |"
            for r in acks
        ],
        "",
        f"## 2. Deep queue on cluster-2048 (bursts of {args.burst}, {args.probes} probes per depth)",
        "",
        "| queued | admitted per s | burst p99 ms | errors | decisions per s | mean decision ms | probe start after "
        "ack, median ms | max ms | server RSS MiB | lost | duplicated |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *[
            f"| {r['depth']} | {r['admitted_per_s']:.0f} | {r['burst_p99']:.1f} | {r['errors']} "
            f"| {r['decisions_per_s']:.1f} | {r['decision_ms']:.1f} | {r['probe_median']:.0f} | {r['probe_max']:.0f} "
            f"| {r['rss'] / 2**20:.0f} | {r['lost']} | {r['dup']} |"
            for r in depths
        ],
        "",
    ]
    if len(depths) >= 2:
        first, last = depths[0], depths[-1]
        per = (last["rss"] - first["rss"]) / max(last["depth"] - first["depth"], 1) * 10_000
        lines += [f"Server memory per 10,000 queued jobs: {per / 2**20:.0f} MiB (RSS slope, {first['depth']} to "
                  f"{last['depth']} queued).", ""]  # fmt: skip
    lines += ["## Targets", "", *targets(by, depths), ""]
    return "\n".join(lines)


def targets(by: dict[int, dict[str, Any]], depths: list[dict[str, Any]]) -> list[str]:
    def verdict(ok: bool) -> str:
        return "**met**" if ok else "**not met**"

    out = []
    for c, bound in ((32, 50.0), (128, 200.0)):
        if c in by:
            r = by[c]
            out.append(f"- p99 < {bound:g} ms at concurrency {c}, 0 errors: {r['p99']:.1f} ms, {r['errors']} errors: "
                       f"{verdict(r['p99'] < bound and r['errors'] == 0)}")  # fmt: skip
    at = next((r for r in depths if r["depth"] >= 5000), None)
    if at is not None:
        out.append(f"- >= 200 admissions/s with {at['depth']} queued: {at['admitted_per_s']:.0f}/s: "
                   f"{verdict(at['admitted_per_s'] >= 200)}")  # fmt: skip
        out.append(f"- a job that fits starts within 100 ms of its acknowledgement at that depth: max "
                   f"{at['probe_max']:.0f} ms: {verdict(at['probe_max'] < 100)}")  # fmt: skip
    bad = sum(r["lost"] + r["dup"] for r in [*by.values(), *depths])
    out.append(f"- 0 lost, 0 duplicated in every run: {bad} lost or duplicated: {verdict(bad == 0)}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--concurrency", default="1,8,32,128", help="comma-separated; one fresh server each")
    parser.add_argument("--cluster", default="cluster-2048", help="part 1's cluster")
    parser.add_argument("--time-scale", type=float, default=100000.0, help="part 1's simulated executor")
    parser.add_argument("--depths", default="1000,5000,20000", help="comma-separated queue depths; empty: skip")
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--probes", type=int, default=5)
    parser.add_argument("--workers", type=int, default=1, help="frenzy serve --workers")
    parser.add_argument("--db", help="a PostgreSQL URL (default: a SQLite file in a temporary folder)")
    parser.add_argument("--out", default="benchmarks/results/service_load.md")
    args = parser.parse_args()
    args.depths = [int(d) for d in args.depths.split(",") if d]
    loads = [load_average()]
    acks = [ack_run(args.jobs, int(c), args) for c in args.concurrency.split(",") if c]
    for r in acks:
        print(r, flush=True)
    loads.append(load_average())
    depths = depth_runs(args) if args.depths else []
    loads.append(load_average())
    text = report(args, acks, depths, loads)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text, encoding="utf-8")
    print(text)
    print(f"pid {os.getpid()} done", file=sys.stderr)


if __name__ == "__main__":
    main()
