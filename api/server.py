"""Running the HTTP service: ``frenzy serve`` (uvicorn in the foreground), ``frenzy demo`` (the service in a
background thread, a workload submitted over HTTP, the scheduler's decisions printed as they happen) and
:func:`serve_process` (``frenzy serve`` as a separate process, for the load benchmarks)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from frenzy_opt.api.app import ServiceConfig, create_app
from frenzy_opt.api.auth import load_tenants
from frenzy_opt.api.httplimits import DEFAULT_LIMITS, HttpLimits, uvicorn_options
from frenzy_opt.api.workers import WorkerSettings, run_workers
from frenzy_opt.core.enums import TERMINAL_STATES, JobState
from frenzy_opt.core.machine import free_port
from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.launch.executors import make_executor
from frenzy_opt.planning.scenario import Scenario
from frenzy_opt.prediction.calibrations import CalibrationStore, check_name
from frenzy_opt.service.store import StoreRefused

DEFAULT_DB = "sqlite:///frenzy-opt.db"


def build_config(
    cluster: ClusterSpec,
    *,
    db_url: str = DEFAULT_DB,
    executor: str = "simulated",
    tokens: str | None = None,
    time_scale: float = 1.0,
    fail_rate: float = 0.0,
    decision_wait_s: float = 0.0,
    workdir: str = "frenzy-runs",
    calibration: str | None = None,
    create: bool = True,
) -> ServiceConfig:
    if not time_scale > 0:
        raise ValueError(f"--time-scale must be > 0, got {time_scale}")
    if not 0 <= decision_wait_s <= 60:
        raise ValueError(f"--decision-wait-s must be in [0, 60], got {decision_wait_s}")
    tenants = load_tenants(tokens, [g.name for g in cluster.gpu_types()])
    if calibration:
        check_name(calibration)  # a bad name fails before the service starts
        if calibration in CalibrationStore().names():
            CalibrationStore().read(calibration)  # so does a broken profile
    return ServiceConfig(
        cluster=cluster,
        db_url=db_url,
        executor=make_executor(executor, time_scale=time_scale, fail_rate=fail_rate, workdir=workdir),
        tenants=tenants,
        time_scale=time_scale,
        decision_wait_s=decision_wait_s,
        calibration=calibration,
        create_store=create,
    )


def banner(config: ServiceConfig, host: str, port: int, num_workers: int = 1) -> str:
    """What ``frenzy serve`` says as it starts: the cluster, executor, time scale, database, workers, tenants
    and the URLs of the API, its docs and the dashboard (a password in the database URL is masked)."""
    from sqlalchemy.engine import make_url

    cluster = config.cluster
    types = ", ".join(f"{cluster.num_gpus_of(g.name)} x {g.name}" for g in cluster.gpu_types())
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    scale = "1 (real time)" if config.time_scale == 1 else f"{config.time_scale:g}x (cluster time runs faster)"
    tenants = len(config.tenants.tokens) if config.tenants.tokens else 0
    return "\n".join(
        [
            f"frenzy serve: cluster {cluster.name} ({cluster.num_gpus} GPUs: {types})",
            f"  executor {config.executor.name}, time scale {scale}",
            f"  database {make_url(config.db_url).render_as_string(hide_password=True)}",
            f"  API workers {num_workers}; tenants: {tenants or 'none (local mode, no token needed)'}",
            f"  calibration {config.calibration or 'shipped step-time parameters'}",
            f"  API {url}/v1   docs {url}/docs   dashboard {url}/ui",
        ]
    )


def serve(
    config: ServiceConfig,
    host: str,
    port: int,
    limits: HttpLimits = DEFAULT_LIMITS,
    workers: WorkerSettings | None = None,
    num_workers: int = 1,
) -> None:
    """Run the service until interrupted, with the HTTP ``limits`` (``api/httplimits.py``). The store's
    integrity check and writer lock come first: a corrupt database or one another service writes ends here
    with the reason, before any row is touched. With ``num_workers`` > 1, this process is the scheduler and
    ``num_workers`` API worker processes serve the port (:mod:`frenzy_opt.api.workers`)."""
    config.intake = num_workers > 1
    try:
        app = create_app(config)
        app.state.service.store.acquire_writer()
    except StoreRefused as err:
        raise SystemExit(f"frenzy serve: {err}") from None
    # The scheduler's decisions and warnings go to stderr at INFO next to uvicorn's access log.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(banner(config, host, port, num_workers), file=sys.stderr, flush=True)
    if num_workers <= 1:
        uvicorn.run(app, host=host, port=port, log_level="info", **uvicorn_options(limits))
        return
    assert workers is not None
    private = free_port("127.0.0.1")
    scheduler = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=private, log_level="warning", **uvicorn_options(limits))
    )
    thread = threading.Thread(target=scheduler.run, name="frenzy-scheduler-http", daemon=True)
    thread.start()
    while not scheduler.started:
        if not thread.is_alive():
            raise SystemExit("frenzy serve: the scheduler process's own server did not start")
        time.sleep(0.02)
    settings = replace(workers, scheduler_url=f"http://127.0.0.1:{private}", parent_pid=os.getpid())
    try:
        run_workers(settings, num_workers, host, port, limits)
    finally:
        scheduler.should_exit = True
        thread.join(30)


@contextlib.contextmanager
def serve_process(
    args: Sequence[str], *, cwd: str | Path | None = None, timeout_s: float = 60.0
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``frenzy serve ARGS`` as a process of its own on a free loopback port (the benchmarks' server): yields
    its base URL and the process once ``/healthz`` answers 200, stops it with SIGTERM after. SystemExit if it
    does not come up within ``timeout_s``."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "frenzy_opt.cli", "serve", "--port", str(port), *args]
    server = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit(f"the server did not start: {' '.join(command)}")
            time.sleep(0.1)
        yield url, server
    finally:
        if server.poll() is None:
            os.kill(server.pid, signal.SIGTERM)
        server.wait(30)


@contextlib.contextmanager
def background_server(
    config: ServiceConfig, host: str = "127.0.0.1", port: int = 0, limits: HttpLimits = DEFAULT_LIMITS
) -> Iterator[str]:
    """A uvicorn server of the service in a thread, with the HTTP ``limits``; yields its base URL, shuts it
    down cleanly after."""
    port = port or free_port(host)
    server = uvicorn.Server(
        uvicorn.Config(create_app(config), host=host, port=port, log_level="warning", **uvicorn_options(limits))
    )
    thread = threading.Thread(target=server.run, name="frenzy-uvicorn", daemon=True)
    thread.start()
    url = f"http://{host}:{port}"
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the service did not start on {url}")
        time.sleep(0.02)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(30)


def _spec_json(job: Any) -> dict[str, Any]:
    """The submission body of a scenario job: its contract-1 mapping (catalogue models by name), id, weight."""
    body: dict[str, Any] = {**job.spec.to_mapping(), "name": job.id, "weight": job.weight}
    if job.spec.model.name != "inline":
        body["model"] = job.spec.model.name
    return body


def _describe(item: dict[str, Any], name: str, now: float, age_s: float) -> str | None:
    """One line for a job's new state."""
    clock = f"[{now / 3600:6.2f} h]"
    if item["state"] == JobState.RUNNING and item["plan"]:
        plan, nodes = item["plan"], ", ".join(item["placement"]["nodes"])
        par = plan["parallel"]
        shape = f"dp{par['dp']} tp{par['tp']} pp{par['pp']}"
        shape += "".join(f" {k}{par[k]}" for k in ("vpp", "cp", "ep") if (par.get(k) or 1) != 1)
        shape += f" zero{par['zero_stage']}"
        hours = plan["est_runtime_s"] / 3600
        return f"{clock} start   {name:<22} {plan['num_gpus']} x {plan['gpu_type']} {shape} on {nodes}; {hours:.2f} h"
    if item["state"] == JobState.QUEUED:
        return f"{clock} wait    {name:<22} {item['reason']}"
    if item["state"] in TERMINAL_STATES:
        return f"{clock} {item['state']:<7} {name:<22} JCT {age_s / 3600:.2f} h"
    return None


def demo(
    scenario: Scenario, *, time_scale: float, say: Callable[[str], None], timeout_s: float = 120.0
) -> dict[str, Any]:
    """Start the service on the scenario's cluster with the simulated executor, submit the scenario's jobs
    over HTTP at their (scaled) arrival times, print every state change, and stop when all jobs ended."""
    with tempfile.TemporaryDirectory(prefix="frenzy-demo-") as tmp:
        config = build_config(
            scenario.cluster, db_url=f"sqlite:///{Path(tmp) / 'demo.db'}", executor="simulated", time_scale=time_scale
        )
        with background_server(config) as url, httpx.Client(base_url=url, timeout=30) as client:
            say(f"service up at {url} — cluster {scenario.cluster.name} ({scenario.cluster.num_gpus} GPUs), "
                f"simulated executor, {time_scale:g} cluster seconds per second")  # fmt: skip
            for job in scenario.jobs:  # MARP + plan search per job (also readies the scheduler's options)
                plans = client.post("/v1/plans", json=_spec_json(job), params={"top": 1}).json()
                best = plans["plans"][0]
                fewest = ", ".join(f"{n} {t}" for t, n in plans["min_gpus_per_type"].items())
                say(f"plan    {job.id:<22} {plans['num_plans']:>5} memory-feasible plans; fastest "
                    f"{best['num_gpus']} x {best['gpu_type']}, {best['step_time_s']:.2f} s/step, "
                    f"{best['peak_allocated_bytes'] / 2**30:.1f} GiB/GPU; fewest GPUs: {fewest}")  # fmt: skip
            started = time.monotonic()
            pending = sorted(scenario.jobs, key=lambda j: j.arrival_s)
            ids: dict[str, str] = {}
            seen: dict[str, str] = {}
            submitted_at: dict[str, float] = {}
            ended_at: dict[str, float] = {}
            attempt: dict[str, int] = {}
            queued_s: dict[str, float] = {}  # time each job spent queued (polled every 0.1 s of wall time)
            last_poll = 0.0
            while True:
                now = (time.monotonic() - started) * time_scale
                while pending and pending[0].arrival_s <= now:
                    job = pending.pop(0)
                    answer = client.post("/v1/jobs", json=_spec_json(job))
                    answer.raise_for_status()
                    body = answer.json()
                    ids[body["id"]] = job.id
                    submitted_at[body["id"]] = now
                    say(f"[{now / 3600:6.2f} h] submit  {job.id:<22} -> {body['id']} ({body['state']})")
                for item in client.get("/v1/jobs", params={"limit": 500}).json()["items"]:
                    if item["id"] in ids and seen.get(item["id"], "queued") == "queued":
                        queued_s[item["id"]] = (
                            queued_s.get(item["id"], 0.0) + now - max(last_poll, submitted_at[item["id"]])
                        )
                    state, moved = item["state"], attempt.get(item["id"]) != item["attempts"]
                    if item["id"] not in ids or (
                        seen.get(item["id"]) == state and (state != JobState.RUNNING or not moved)
                    ):
                        continue  # nothing new (a job moved to other GPUs is a new attempt)
                    if state == JobState.RUNNING and seen.get(item["id"]) == "running":
                        say(f"[{now / 3600:6.2f} h] moved   {ids[item['id']]:<22} stopped by the HAS and resumed")
                    seen[item["id"]] = item["state"]
                    attempt[item["id"]] = item["attempts"]
                    name = ids[item["id"]]
                    if item["state"] in TERMINAL_STATES:
                        ended_at[item["id"]] = now
                    line = _describe(item, name, now, now - submitted_at[item["id"]])
                    if line:
                        say(line)
                last_poll = now
                if not pending and len(ended_at) == len(ids):
                    break
                if time.monotonic() - started > timeout_s:
                    raise RuntimeError(f"demo: jobs still running after {timeout_s:.0f} s of wall time")
                time.sleep(0.1)
            cluster = client.get("/v1/cluster").json()
            states = {name: seen[job_id] for job_id, name in ids.items()}
            say(f"all {len(ids)} jobs ended; GPUs in use now: {sum(t['used'] for t in cluster['gpu_types'].values())}")
        jct = {i: ended_at[i] - submitted_at[i] for i in ids}
        waits = {ids[i]: {"jct_s": jct[i], "queued_s": min(queued_s.get(i, 0.0), jct[i])} for i in ids}
        longer = sorted(n for n, w in waits.items() if w["queued_s"] > w["jct_s"] - w["queued_s"])
        say(f"average JCT {sum(jct.values()) / len(jct) / 3600:.2f} h; jobs that waited longer than they ran: "
            f"{', '.join(longer) or 'none'}")  # fmt: skip
        return {
            "jobs": states,
            "avg_jct_s": sum(jct.values()) / len(jct),
            "waits": waits,
            "waited_longer_than_ran": longer,
            "wall_s": time.monotonic() - started,
        }
