"""Submissions while another client floods the dry-run endpoint (issue 13, item 2).

Starts ``frenzy serve`` on ``--cluster`` (default cluster-2048, where one plan search takes seconds and its
plans about 16 MB) and measures ``POST /v1/jobs`` latency one at a time twice: alone, then while a second
client posts ``--plans`` distinct ``/v1/plans`` requests (each a different step count, and one in ten a new
sequence length: a new search) with ``--flood-concurrency`` in flight. Reports the submission latencies,
the dry runs' answers by status (200, or 429 from the per-tenant limits), and the server's resident memory
before and after the flood (``VmRSS`` of the server process and its plan-search worker, from /proc).

Usage, from the repository root::

    .venv/bin/python benchmarks/plans_flood.py [--plans 100] [--out benchmarks/results/plans_flood.md]
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
JOB = {"model": "gpt3-125m", "training": {"seq_len": 1024, "global_batch_size": 32, "train_steps": 200}}
PLAN = {"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 512, "train_steps": 1000}}
SEQ_LENS = (1024, 2048, 4096, 8192, 16384, 512, 3072, 6144, 12288, 1536)


def _rss_mib(pid: int) -> float:
    """Resident memory of a process and its children, MiB (/proc/PID/status VmRSS)."""
    total = 0.0
    pids = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(c) for c in children]
    except OSError:
        pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            continue
    return total


async def _submissions(client: httpx.AsyncClient, stop: asyncio.Event, count: int) -> list[float]:
    latencies: list[float] = []
    i = 0
    while not stop.is_set() or len(latencies) < count:
        start = time.perf_counter()
        answer = await client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": f"sub-{time.time_ns()}-{i}"})
        latencies.append(time.perf_counter() - start)
        assert answer.status_code == 202, answer.text
        i += 1
        if stop.is_set() and len(latencies) >= count:
            break
    return latencies


async def _flood(client: httpx.AsyncClient, plans: int, concurrency: int) -> dict[int, int]:
    statuses: dict[int, int] = {}
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(plans):
        queue.put_nowait(i)

    async def worker() -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            seq_len = SEQ_LENS[(i // 10) % len(SEQ_LENS)]
            body = {**PLAN, "training": {**PLAN["training"], "train_steps": 1000 + i, "seq_len": seq_len}}
            answer = await client.post("/v1/plans", json=body)
            statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return statuses


async def _run(url: str, plans: int, concurrency: int, pid: int) -> dict[str, object]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        stop = asyncio.Event()
        stop.set()
        alone = await _submissions(client, stop, 200)
        warm = {**PLAN, "training": {**PLAN["training"], "seq_len": 768}}
        assert (await client.post("/v1/plans", json=warm)).status_code == 200  # the search worker started
        rss_before = _rss_mib(pid)
        stop.clear()
        flooding = asyncio.ensure_future(_flood(client, plans, concurrency))
        during_task = asyncio.ensure_future(_submissions(client, stop, 200))
        started = time.perf_counter()
        statuses = await flooding
        flood_s = time.perf_counter() - started
        stop.set()
        during = await during_task
        return {
            "alone": alone,
            "during": during,
            "statuses": statuses,
            "flood_s": flood_s,
            "rss_before": rss_before,
            "rss_after": _rss_mib(pid),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cluster", default="cluster-2048")
    parser.add_argument("--plans", type=int, default=100)
    parser.add_argument("--flood-concurrency", type=int, default=4)
    parser.add_argument("--out", default="benchmarks/results/plans_flood.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="frenzy-flood-") as tmp:
        serve = ["--db", str(Path(tmp) / "flood.db"), "--create", "--cluster", args.cluster, "--time-scale", "100000"]
        with serve_process(serve, cwd=ROOT, timeout_s=120) as (url, server):
            httpx.post(f"{url}/v1/jobs", json=JOB, timeout=300)  # the submission's plan search, not counted
            result = asyncio.run(_run(url, args.plans, args.flood_concurrency, server.pid))

    def row(name: str, values: object) -> str:
        assert isinstance(values, list)
        lat = sorted(v * 1e3 for v in values)
        return f"| {name} | {len(lat)} | {percentile(lat, 50):.1f} | {percentile(lat, 99):.1f} | {lat[-1]:.1f} |"

    statuses = result["statuses"]
    assert isinstance(statuses, dict)
    lines = [
        "# Submissions while the dry-run endpoint is flooded",
        "",
        f"Command: `.venv/bin/python benchmarks/plans_flood.py --cluster {args.cluster} --plans {args.plans} "
        f"--flood-concurrency {args.flood_concurrency}`.",
        f"Machine: {describe_machine()}. Server, worker and both clients share the machine's CPUs.",
        "",
        f"One `frenzy serve` on {args.cluster}. Submissions one at a time, alone and then while a second client "
        f"posts {args.plans} distinct `POST /v1/plans` ({args.flood_concurrency} in flight; every request a "
        f"different step count, {len(SEQ_LENS)} sequence lengths in turn, one new one per ten requests).",
        "",
        "| submissions | n | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|",
        row("alone", result["alone"]),
        row("during the flood", result["during"]),
        "",
        f"Dry runs answered: {', '.join(f'{n} x {code}' for code, n in sorted(statuses.items()))} in "
        f"{result['flood_s']:.1f} s.",
        f"Server resident memory (with its plan-search worker, started before): {result['rss_before']:.0f} MiB "
        "before the flood, "
        f"{result['rss_after']:.0f} MiB after.",
        "",
    ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
