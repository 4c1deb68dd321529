"""The client of a running service (``frenzy serve``): ``submit``, ``jobs``, ``status``, ``cancel``, ``logs``
and ``usage``, the everyday commands of Slurm (``sbatch``, ``squeue``, ``scontrol show job``, ``scancel``,
``tail -f`` of a job's output file, ``sacct``) over the HTTP API.

The server and token come from ``--server``/``--token``, else ``FRENZY_SERVER``/``FRENZY_TOKEN``, else the
config file (``$FRENZY_CONFIG``, default ``~/.frenzy/client.yaml``: ``{server: URL, token: TOKEN}``), else
``http://127.0.0.1:8000`` without a token (a service in local mode). Tables by default, ``--json`` for
scripts. An unreachable server or a refused token is a one-line error naming what to fix (exit status 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from frenzy_opt.core.enums import ACTIVE_STATES, JobState
from frenzy_opt.core.readable import gib, parallel_text
from frenzy_opt.core.spec import load_job, load_mapping
from frenzy_opt.models.catalog import catalog_names
from frenzy_opt.planning.scenario import resolve as resolve_file
from frenzy_opt.yamlload import load_yaml

DEFAULT_SERVER = "http://127.0.0.1:8000"
CONFIG_ENV = "FRENZY_CONFIG"
DEFAULT_CONFIG = Path("~/.frenzy/client.yaml")
SUBMIT_WAIT_S = 0.25
"""How long ``frenzy submit`` waits for the first decision by default: the service's own wait before issue 27
made it answer once the job is stored, so the command still prints where the job runs."""
PAGE = 200
LOG_PAGE = 4 << 20
"""Bytes per logs request (the service's most)."""
TIMEOUT_S = 30.0


class ClientError(Exception):
    """What went wrong talking to the service, in words a user can act on."""


@dataclass(frozen=True, slots=True)
class Target:
    server: str
    token: str | None


def config_path() -> Path:
    return Path(os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG).expanduser()


def resolve(server: str | None, token: str | None) -> Target:
    """Flags first, then the environment, then the config file, then the local default."""
    config: dict[str, Any] = {}
    path = config_path()
    if path.is_file():
        loaded = load_yaml(path.read_text(encoding="utf-8")) or {}
        if not isinstance(loaded, dict) or set(loaded) - {"server", "token"}:
            raise ClientError(f"{path}: expected a mapping with the keys server and token")
        config = loaded
    chosen = server or os.environ.get("FRENZY_SERVER") or config.get("server") or DEFAULT_SERVER
    return Target(
        server=str(chosen).rstrip("/"),
        token=token or os.environ.get("FRENZY_TOKEN") or config.get("token"),
    )


def connect(target: Target) -> httpx.Client:
    return httpx.Client(base_url=target.server, timeout=TIMEOUT_S)


class Client:
    """The service's ``/v1`` API. ``http`` replaces the connection (tests pass an ASGI test client)."""

    def __init__(self, target: Target, http: httpx.Client | None = None) -> None:
        self.target = target
        self.headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}
        self.http = http or connect(target)

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, headers=self.headers, **kwargs)
        except httpx.TransportError as err:
            raise ClientError(
                f"cannot reach the frenzy service at {self.target.server} ({err.__class__.__name__}: {err}); "
                "start one with `frenzy serve` or point --server / FRENZY_SERVER at it"
            ) from None
        if response.status_code >= 400:
            raise ClientError(_refusal(response, self.target))
        return response

    def submit(self, spec: dict[str, Any], wait_s: float = 0.0) -> dict[str, Any]:
        """Submit a job; with ``wait_s`` > 0 the answer waits up to that long for the first decision (the
        service answers once the job is stored otherwise: issue 27)."""
        params = {"wait": wait_s} if wait_s > 0 else None
        result: dict[str, Any] = self._request("POST", "/v1/jobs", json=spec, params=params).json()
        return result

    def jobs(self, state: str | None = None) -> list[dict[str, Any]]:
        """Every visible job (of one state), paging through the list."""
        items: list[dict[str, Any]] = []
        offset: int | None = 0
        while offset is not None:
            params: dict[str, Any] = {"limit": PAGE, "offset": offset}
            if state:
                params["state"] = state
            page = self._request("GET", "/v1/jobs", params=params).json()
            items += page["items"]
            offset = page.get("next_offset")
        return items

    def job(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request("GET", f"/v1/jobs/{job_id}").json()
        return result

    def cancel(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request("POST", f"/v1/jobs/{job_id}/cancel").json()
        return result

    def logs(self, job_id: str, attempt: int | None = None) -> tuple[int, bytes]:
        """The attempt's whole output so far (the latest attempt by default) and its number."""
        path, chunks, offset = f"/v1/jobs/{job_id}/logs", [], 0
        while True:
            params: dict[str, Any] = {"offset": offset, "limit": LOG_PAGE}
            if attempt is not None:
                params["attempt"] = attempt
            response = self._request("GET", path, params=params)
            chunks.append(response.content)
            offset = int(response.headers.get("x-log-offset", offset))
            if not response.content or offset >= int(response.headers.get("x-log-size", 0)):
                return int(response.headers.get("x-log-attempt", attempt or 0)), b"".join(chunks)

    def follow(self, job_id: str, attempt: int | None = None) -> Iterator[bytes]:
        """The attempt's output as it is written, until the attempt ends (a queued job's first attempt is
        waited for)."""
        params: dict[str, Any] = {"follow": 1} if attempt is None else {"follow": 1, "attempt": attempt}
        try:
            with self.http.stream(
                "GET",
                f"/v1/jobs/{job_id}/logs",
                params=params,
                headers=self.headers,
                timeout=httpx.Timeout(TIMEOUT_S, read=None),  # a quiet run sends nothing for a while
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise ClientError(_refusal(response, self.target))
                yield from response.iter_bytes()
        except httpx.TransportError as err:
            raise ClientError(
                f"lost the frenzy service at {self.target.server} ({err.__class__.__name__}: {err})"
            ) from None

    def usage(self, since_s: float | None = None) -> dict[str, Any]:
        params = {"since": since_s} if since_s is not None else {}
        result: dict[str, Any] = self._request("GET", "/v1/usage", params=params).json()
        return result


def _refusal(response: httpx.Response, target: Target) -> str:
    try:
        detail = response.json().get("detail", response.text)
    except ValueError:
        detail = response.text
    if isinstance(detail, list):  # pydantic's list of field errors
        detail = "; ".join(f"{'.'.join(str(p) for p in d.get('loc', ()))}: {d.get('msg')}" for d in detail)
    code = response.status_code
    if code == 401:
        hint = "no token given" if target.token is None else "the token is not known to the service"
        return f"the service at {target.server} refused the request (401: {hint}); set --token or FRENZY_TOKEN"
    return f"{response.request.method} {response.request.url.path}: {code} {detail}"


# -- rendering --------------------------------------------------------------------------------------------


def _gpus(job: dict[str, Any]) -> str:
    placement = job.get("placement") or {}
    plan = job.get("plan") or {}
    gpu_type = placement.get("gpu_type") or plan.get("gpu_type")
    count = placement.get("num_gpus") or plan.get("num_gpus")
    return f"{count} x {gpu_type}" if gpu_type and count else "-"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(seconds, 0.0)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _cluster_time(seconds: float | None, scale: float) -> str:
    """A duration of the service's clock (cluster time), with its wall time when the scale is not 1."""
    if seconds is None:
        return "unknown"
    if scale == 1.0:
        return _duration(seconds)
    return f"{_duration(seconds)} cluster time (~{_duration(seconds / scale)} wall at {scale:g}x)"


def _where(job: dict[str, Any]) -> str:
    """A queued job's position and expected start, a running job's progress, else the reason."""
    if job["state"] == JobState.QUEUED and job.get("queue_position") is not None:
        eta = _cluster_time(job.get("estimated_start_in_s"), float(job.get("time_scale") or 1.0))
        return f"#{job['queue_position']}, starts in {eta}"
    progress = job.get("progress") or {}
    if job["state"] == JobState.RUNNING and progress.get("step") is not None:
        total = progress.get("steps") or progress.get("train_steps")
        done = f"step {progress['step']}" + (f"/{total}" if total else "")
        return done + (f", {progress['step_time_s']:.2f} s/step" if progress.get("step_time_s") else "")
    return str(job.get("reason") or "")


def table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]
    ]
    return "\n".join(lines)


def _state(job: dict[str, Any]) -> str:
    """The state, flagged when the job's deadline is at risk or was missed."""
    if job.get("deadline_missed_by_s") is not None:
        return f"{job['state']} (deadline missed)"
    if job.get("deadline_risk"):
        return f"{job['state']} (deadline at risk)"
    return str(job["state"])


def jobs_table(jobs: list[dict[str, Any]]) -> str:
    rows = [(j["id"], j["name"], j["tenant"], _state(j), _gpus(j), _where(j)) for j in jobs]
    return table(rows, ("ID", "NAME", "TENANT", "STATE", "GPUS", "WHERE"))


def counters_text(job: dict[str, Any]) -> str:
    """Attempts, failures against the retry limit, and moves (a server before them: attempts only)."""
    failures, moves = job.get("failures", 0), job.get("moves", 0)
    return f"attempts: {job['attempts']} (failures {failures}/{job['max_retries']} retries, moves {moves})"


def _plan_line(job: dict[str, Any]) -> str | None:
    """The plan as ``frenzy plan`` prints it: GPUs, layout, micro-batch, precision."""
    plan = job.get("plan") or {}
    if not plan.get("parallel"):
        return None
    text = f"{plan.get('num_gpus')} x {plan.get('gpu_type')}, {parallel_text(plan['parallel'])}"
    if plan.get("micro_batch_size") is not None:
        text += f", micro-batch {plan['micro_batch_size']}"
    if plan.get("precision"):
        text += f", {plan['precision']}"
    return text


def _bytes_text(value: Any) -> str:
    """Bytes in GiB; a per-rank list as one value when every rank has it, else its range."""
    if isinstance(value, list) and value:
        low, high = min(value), max(value)
        each = gib(high) + " on each rank" if low == high else f"{gib(low)} to {gib(high)} over the ranks"
        return f"{each} ({len(value)} ranks)"
    return gib(value) if isinstance(value, int | float) else str(value)


def _predicted_line(predicted: dict[str, Any], scale: float) -> str:
    parts = []
    if predicted.get("peak_allocated_bytes") is not None:
        parts.append(f"peak {gib(predicted['peak_allocated_bytes'])} allocated")
    if predicted.get("peak_reserved_bytes") is not None:
        parts.append(f"{gib(predicted['peak_reserved_bytes'])} reserved")
    if predicted.get("device_used_bytes") is not None:
        parts.append(f"{gib(predicted['device_used_bytes'])} used on the device")
    if predicted.get("step_time_s") is not None:
        parts.append(f"{predicted['step_time_s']:.3g} s/step")
    if predicted.get("runtime_s") is not None:
        parts.append(f"{_cluster_time(predicted['runtime_s'], scale)} in all")
    return ", ".join(parts)


def _measured_line(measured: dict[str, Any], predicted: dict[str, Any]) -> str:
    parts = []
    step, expected = measured.get("step_time_s"), predicted.get("step_time_s")
    if step is not None:
        versus = f" ({step / expected - 1:+.0%} vs predicted)" if expected else ""
        parts.append(f"{step:.3g} s/step{versus}")
    if measured.get("peak_memory_bytes") is not None:
        parts.append("peak " + _bytes_text(measured["peak_memory_bytes"]))
    if measured.get("loss_first") is not None and measured.get("loss_last") is not None:
        parts.append(f"loss {measured['loss_first']:.3g} -> {measured['loss_last']:.3g}")
    if measured.get("source"):
        parts.append(f"source: {measured['source']}")
    return ", ".join(parts)


def _deadline_line(job: dict[str, Any], scale: float) -> str | None:
    """The deadline and where the job stands against it (at risk, met, missed)."""
    predicted, measured = job.get("predicted") or {}, job.get("measured") or {}
    deadline = measured.get("deadline_s", predicted.get("deadline_s"))
    if deadline is None:
        return "deadline: at risk" if job.get("deadline_risk") else None
    text = f"deadline: {_cluster_time(deadline, scale)} after submission"
    if job.get("deadline_missed_by_s") is not None:
        return text + f"; MISSED, ended {_cluster_time(job['deadline_missed_by_s'], scale)} after it"
    if "end_after_submit_s" in measured:
        return text + "; met"
    if job.get("deadline_risk"):
        ends = predicted.get("end_after_submit_s")
        when = f" (predicted end {_cluster_time(ends, scale)} after submission)" if ends is not None else ""
        return text + f"; AT RISK{when}"
    return text + "; on track"


def status_text(job: dict[str, Any]) -> str:
    """``frenzy status``: the job, where it stands, why (waiting or moved), its plan and predictions in GiB
    and hours, its deadline, and its history of states and moves."""
    scale = float(job.get("time_scale") or 1.0)
    lines = [
        f"{job['id']}  {job['name']}  ({job['tenant']})",
        f"state: {job['state']}  {counters_text(job)}  gpus: {_gpus(job)}",
    ]
    if _where(job):
        lines.append(f"now: {_where(job)}")
    if job["state"] == JobState.QUEUED and job.get("reason") and job.get("queue_position") is not None:
        lines.append(f"why: {job['reason']}")
    plan = _plan_line(job)
    if plan:
        lines.append(f"plan: {plan}")
    predicted, measured = job.get("predicted") or {}, job.get("measured") or {}
    if _predicted_line(predicted, scale):
        lines.append(f"predicted: {_predicted_line(predicted, scale)}")
    if _measured_line(measured, predicted):
        lines.append(f"measured: {_measured_line(measured, predicted)}")
    deadline = _deadline_line(job, scale)
    if deadline:
        lines.append(deadline)
    if scale != 1.0:
        lines.append(f"times are cluster time; the service runs {scale:g}x wall time")
    history = job.get("history") or []
    moves = [e for e in history if str(e.get("detail", "")).startswith("moved")]
    if moves:
        lines.append(f"moves ({len(moves)}):")
        lines += [f"  {_when(e['at'])}  {e['detail']}" for e in moves]
    if history:
        lines.append("history:")
        lines += [f"  {_when(e['at'])}  {e['state']:<10} {e['detail']}" for e in history]
    return "\n".join(lines)


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def usage_table(usage: dict[str, Any]) -> str:
    rows = [
        (r["tenant"], r["gpu_type"], f"{r['gpu_hours']:.2f}", str(r.get("jobs", ""))) for r in usage.get("rows", [])
    ]
    scale = float(usage.get("time_scale") or 1.0)
    text = table(rows, ("TENANT", "GPU TYPE", "GPU-HOURS", "JOBS"))
    if scale != 1.0:
        text += f"\nGPU-hours of cluster time (the service runs {scale:g}x wall time)"
    return text


# -- commands ---------------------------------------------------------------------------------------------


def _client(args: argparse.Namespace) -> Client:
    return Client(resolve(args.server, args.token))


def _print(args: argparse.Namespace, payload: Any, text: Callable[[Any], str]) -> None:
    print(json.dumps(payload, indent=2) if args.json else text(payload))


def cmd_submit(args: argparse.Namespace) -> int:
    path = resolve_file(args.job)
    spec = load_mapping(path)
    if isinstance(spec.get("model"), str) and spec["model"].lower() not in catalog_names():
        # A Hugging Face config.json path: read here, its architecture sent (the service reads no files).
        spec["model"] = {k: v for k, v in load_job(path).model.to_dict().items() if v is not None}
    if not 0 <= args.wait <= 60:
        raise ValueError(f"--wait must be in [0, 60] seconds, got {args.wait}")
    job = _client(args).submit(spec, args.wait)
    _print(args, job, lambda j: f"submitted {j['id']} ({j['name']}): {j['state']} {_where(j)}".rstrip())
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    jobs = _client(args).jobs(args.state)
    if not args.all and not args.state:
        jobs = [j for j in jobs if j["state"] in ACTIVE_STATES]
    # ``items`` and ``total`` as GET /v1/jobs answers (contract 3); ``jobs``, the same list, as the first
    # version of this command printed it.
    _print(args, {"items": jobs, "total": len(jobs), "jobs": jobs}, lambda p: jobs_table(p["items"]))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    _print(args, _client(args).job(args.id), status_text)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    _print(args, _client(args).cancel(args.id), lambda j: f"{j['id']}: {j['state']}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.follow:
        if args.json:
            raise ClientError("--json and --follow do not go together: --follow streams the output as it comes")
        out = sys.stdout.buffer
        for chunk in client.follow(args.id, args.attempt):
            out.write(chunk)
            out.flush()
        return 0
    attempt, data = client.logs(args.id, args.attempt)
    if args.json:
        print(json.dumps({"id": args.id, "attempt": attempt, "log": data.decode(errors="replace")}, indent=2))
    elif not attempt:
        print(f"{args.id}: no attempt has started yet", file=sys.stderr)
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    return 0


def cmd_usage(args: argparse.Namespace) -> int:
    since = None if args.since is None else time.time() - parse_duration(args.since)
    _print(args, _client(args).usage(since), usage_table)
    return 0


def parse_duration(text: str) -> float:
    """``90s``, ``30m``, ``12h``, ``7d`` (or plain seconds) as seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    raw = text.strip().lower()
    scale = units.get(raw[-1:])
    number = raw[:-1] if scale else raw
    try:
        value = float(number) * (scale or 1)
    except ValueError:
        raise ValueError(f"--since: {text!r} is not a duration; allowed: a number with s, m, h or d") from None
    if value < 0:
        raise ValueError(f"--since: {text!r} is negative")
    return value


def add_commands(sub: Any) -> None:
    """The client commands, each with ``--server``, ``--token`` and ``--json``."""

    def parser(name: str, help_text: str, func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_text)
        p.add_argument("--server", help=f"service URL (else FRENZY_SERVER, the config file, {DEFAULT_SERVER})")
        p.add_argument("--token", help="bearer token (else FRENZY_TOKEN or the config file)")
        p.add_argument("--json", action="store_true", help="print JSON")
        p.set_defaults(func=_guarded(func))
        return p

    p = parser("submit", "submit a job spec to a running service", cmd_submit)
    p.add_argument("job", help="a job spec file (YAML or JSON) or a shipped name (job-tiny)")
    p.add_argument(
        "--wait",
        type=float,
        default=SUBMIT_WAIT_S,
        help=f"seconds to wait for the first decision, 0-60; 0: answer once stored (default {SUBMIT_WAIT_S:g})",
    )
    p = parser("jobs", "the queue (position, ETA) and running jobs (progress)", cmd_jobs)
    p.add_argument("--state", choices=[state.value for state in JobState])
    p.add_argument("--all", action="store_true", help="finished jobs too")
    parser("status", "one job: state, plan, predicted vs measured, history", cmd_status).add_argument("id")
    parser("cancel", "cancel a queued or running job", cmd_cancel).add_argument("id")
    p = parser("logs", "a job's output: every rank's stdout and stderr (simulated: its progress)", cmd_logs)
    p.add_argument("id")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing as it is written, until it ends")
    p.add_argument("--attempt", type=int, help="which attempt (default: the latest)")
    p = parser("usage", "GPU-hours per tenant and GPU type", cmd_usage)
    p.add_argument("--since", help="only this recent history: 90s, 30m, 12h, 7d")


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except ClientError as err:
            print(f"frenzy {args.command}: {err}", file=sys.stderr)
            return 1

    return run
