"""The local executor: a placement becomes torchrun processes on this machine running the training worker
(:mod:`frenzy_opt.launch.worker.train`).

One process per GPU of the placement (per CPU slot for the catalogue's CPU slot type; a GPU type runs on
CUDA devices only, never silently on the CPU: :func:`device_problem`). A placement inside one node
is one ``torchrun --standalone``; a placement over several nodes is one torchrun per node joined by c10d
rendezvous (``--nnodes k --node-rank i``) — on one machine the "nodes" are groups of slots, which is how
the multi-node path is exercised here. ``CUDA_VISIBLE_DEVICES`` lists the devices the executor handed to
the job on each node (it keeps its own per-node device ledger; CPU slots get none).

Each attempt runs in ``WORKDIR/<job>/``: ``job.json`` and ``plan.json`` for the worker, ``report.jsonl``
(its per-step reports, tailed and streamed to ``on_report``), ``attempt-N.log`` (stdout and stderr),
``pids`` and ``checkpoints/`` (kept across attempts: a retry resumes from the newest complete checkpoint).
When every process has ended the attempt ends: success if all exited 0, else failure with the first
failing rank's exit code and the last lines of its log. A cancel stops the process groups (SIGTERM, then
SIGKILL after ``grace_s``). The executor also survives an orchestrator restart: ``pids`` records the
attempt, its process groups and the devices it holds; :meth:`running` lists the jobs whose groups are alive
and those whose report ends with the worker's ``end`` record (finished while the service was down), and
:meth:`adopt` registers such a run as if this executor had started it — its devices taken in the ledger, its
groups stopped by :meth:`cancel` and :meth:`shutdown` — and reports its end from the report (at once for a
run that already finished).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frenzy_opt.core.machine import free_port
from frenzy_opt.hardware.gpus import lookup_gpu
from frenzy_opt.launch.executors import ExitInfo, Launch, LogChunk, OnExit, OnReport, attempt_log, read_chunk
from frenzy_opt.launch.executors.common import job_plan_supported, plan_supported, prepare_run, summarize
from frenzy_opt.models.arch import ModelArch
from frenzy_opt.planning.plans import Plan
from frenzy_opt.planning.problem import PlanFilter


def device_problem(gpu_type: str, gpus_per_node: int, cpu: bool | None = None) -> str | None:
    """Why this machine cannot run ``gpus_per_node`` ranks of ``gpu_type`` per node, or None if it can.

    A CPU slot type (catalogue ``architecture: cpu``) runs as processes anywhere. A GPU type needs that many
    CUDA devices: it is never run on the CPU instead, since the run's measurements would be reported as that
    GPU's (``cpu=True``: this executor uses no CUDA device at all)."""
    gpu = lookup_gpu(gpu_type)
    if gpu.architecture == "cpu":
        return None
    count = 0 if cpu else _cuda_count()
    if count == 0:
        why = "the executor was told to use the CPU" if cpu else "this machine has no CUDA GPU"
        return (
            f"the plan runs on {gpu_type}, and {why}: launch on a CPU cluster such as local-4slot "
            "(--cluster local-4slot), or on a machine with that GPU"
        )
    if count < gpus_per_node:
        return f"the plan needs {gpus_per_node} x {gpu_type} per node, and this machine has {count} CUDA GPU(s)"
    return None


@dataclass(slots=True)
class _Attempt:
    job_id: str
    attempt: int
    on_exit: OnExit
    on_report: OnReport | None
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    pgids: list[int] = field(default_factory=list)
    devices: dict[str, list[int]] = field(default_factory=dict)
    cancelled: bool = False


class LocalExecutor:
    name = "local"
    preemptible = False
    """A cancel stops the processes; the orchestrator retries such a job as a new attempt."""

    def __init__(
        self,
        workdir: str | Path,
        *,
        max_steps: int | None = None,
        checkpoint_every: int = 5,
        cpu: bool | None = None,
        grace_s: float = 10.0,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.workdir = Path(workdir).resolve()  # the worker runs in the job's folder: paths must be absolute
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.max_steps = max_steps
        self.checkpoint_every = checkpoint_every
        self.cpu = cpu
        self.grace_s = grace_s
        self.extra_args = extra_args
        self._attempts: dict[str, _Attempt] = {}
        self._devices_used: dict[str, set[int]] = {}
        self._lock = threading.Lock()

    # --- the protocol -----------------------------------------------------------------------------------

    def supports(self, plan: Plan, arch: ModelArch) -> bool:
        return plan_supported(plan, arch)

    def plan_filter(self) -> PlanFilter:
        return job_plan_supported

    def placement_problem(self, gpu_type: str, gpus_per_node: int) -> str | None:
        """Why this machine cannot run ``gpus_per_node`` ranks of ``gpu_type`` (:func:`device_problem`)."""
        return device_problem(gpu_type, gpus_per_node, self.cpu)

    def read_log(self, job_id: str, attempt: int, offset: int | None, limit: int) -> LogChunk | None:
        """The attempt's ``attempt-N.log``: every rank's stdout and stderr, as torchrun writes them."""
        return read_chunk(attempt_log(self.workdir, job_id, attempt), offset, limit)

    def launch(self, launch: Launch, on_exit: OnExit, on_report: OnReport | None = None) -> None:
        """Start the attempt's torchrun processes (module docstring); a placement this machine cannot run
        (:func:`device_problem`) fails at once through ``on_exit`` with the reason."""
        problem = device_problem(launch.option.gpu_type, launch.gpus_per_node, self.cpu)
        if problem is not None:
            info = ExitInfo(ok=False, cause=f"local executor: {problem}")
            threading.Thread(target=on_exit, args=(launch.job_id, launch.attempt, info), daemon=True).start()
            return
        job_dir, steps = prepare_run(self.workdir, launch, self.max_steps)
        report = job_dir / "report.jsonl"
        attempt = _Attempt(job_id=launch.job_id, attempt=launch.attempt, on_exit=on_exit, on_report=on_report)
        cuda = lookup_gpu(launch.option.gpu_type).architecture != "cpu"  # device_problem: the devices exist
        nnodes = len(launch.nodes)
        port = free_port()
        log = open(attempt_log(self.workdir, launch.job_id, launch.attempt), "wb")  # noqa: SIM115 - the watcher closes it
        with self._lock:
            for node_rank, node in enumerate(launch.nodes):
                env = {**os.environ, "OMP_NUM_THREADS": "1"}
                if cuda:
                    devices = self._take_devices(node, launch.gpus_per_node)
                    attempt.devices[node] = devices
                    env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
                command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={launch.gpus_per_node}"]
                if nnodes == 1:
                    command.append("--standalone")
                else:
                    command += [f"--nnodes={nnodes}", f"--node-rank={node_rank}", "--rdzv-backend=c10d"]
                    command += [f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={launch.job_id}-{launch.attempt}"]
                command += ["-m", "frenzy_opt.launch.worker.train", "--job", "job.json", "--plan", "plan.json"]
                command += ["--steps", str(steps), "--report", str(report)]
                command += ["--checkpoint-dir", "checkpoints", "--checkpoint-every", str(self.checkpoint_every)]
                if not cuda:
                    command.append("--cpu")
                command += list(self.extra_args)
                proc = subprocess.Popen(
                    command, cwd=job_dir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
                attempt.procs.append(proc)
                attempt.pgids.append(proc.pid)
            self._attempts[launch.job_id] = attempt
        pids = {"attempt": launch.attempt, "pgids": attempt.pgids, "devices": attempt.devices}
        (job_dir / "pids").write_text(json.dumps(pids), encoding="utf-8")
        threading.Thread(target=self._watch, args=(attempt, report, log), daemon=True).start()

    def cancel(self, job_id: str, why: str | None = None) -> None:
        with self._lock:
            attempt = self._attempts.get(job_id)
            if attempt is not None:
                attempt.cancelled = True
        if attempt is not None:
            self._stop(attempt.pgids)
            if why:  # the attempt's log says what stopped it (the ranks' output ends with the signal)
                path = attempt_log(self.workdir, job_id, attempt.attempt)
                with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as out:
                    out.write(f"frenzy: attempt stopped: {why}\n")

    def running(self) -> set[str]:
        """Jobs to adopt after a restart: those whose pid files (this process's or an earlier one's) name a
        live process group, and those whose groups are gone but whose report ends with the worker's ``end``
        record (they finished while the service was down; :meth:`adopt` reports their end at once). A run
        that died without an ``end`` record is not listed: the orchestrator retries it."""
        found = set()
        for pid_file in self.workdir.glob("*/pids"):
            record = _pid_record(pid_file)
            if record is None:
                continue
            if any(_alive(p) for p in record["pgids"]) or _ended(_read(pid_file.parent / "report.jsonl")):
                found.add(pid_file.parent.name)
        return found

    def adopt(self, job_id: str, attempt: int, on_exit: OnExit) -> None:
        """Take over attempt ``attempt`` of a job started before a restart (listed by :meth:`running`).

        The run is registered like one this executor launched: its devices are marked used, and
        :meth:`cancel` and :meth:`shutdown` stop its process groups. Its end comes through ``on_exit`` from
        a watcher thread — at once when its groups are already gone — and is read from its report: ok with
        the measured summary when the report ends with the worker's ``end`` record, else a failure naming
        the cause. A run folder holding another attempt than ``attempt`` ends as a failure at once."""
        job_dir = self.workdir / job_id
        record = _pid_record(job_dir / "pids")
        adopted = _Attempt(job_id=job_id, attempt=attempt, on_exit=on_exit, on_report=None)
        if record is None or record["attempt"] != attempt:
            found = "no readable pid file" if record is None else f"attempt {record['attempt']}"
            cause = f"adopt: the run folder {job_dir} holds {found}, not attempt {attempt}"
            threading.Thread(
                target=on_exit, args=(job_id, attempt, ExitInfo(ok=False, cause=cause)), daemon=True
            ).start()
            return
        adopted.pgids = list(record["pgids"])
        with self._lock:
            for node, devices in record["devices"].items():
                self._devices_used.setdefault(node, set()).update(devices)
                adopted.devices[node] = list(devices)
            self._attempts[job_id] = adopted
        threading.Thread(target=self._watch_adopted, args=(adopted, job_dir / "report.jsonl"), daemon=True).start()

    def devices_in_use(self) -> dict[str, set[int]]:
        """CUDA device indices held per node, by runs this executor launched or adopted."""
        with self._lock:
            return {node: set(used) for node, used in self._devices_used.items() if used}

    def shutdown(self) -> None:
        with self._lock:
            attempts = list(self._attempts.values())
        for attempt in attempts:
            attempt.cancelled = True
            self._stop(attempt.pgids)

    # --- internals --------------------------------------------------------------------------------------

    def _take_devices(self, node: str, count: int) -> list[int]:
        used = self._devices_used.setdefault(node, set())
        free = [i for i in range(_cuda_count()) if i not in used][:count]
        used.update(free)
        return free

    def _release_attempt(self, attempt: _Attempt) -> None:
        with self._lock:
            if self._attempts.get(attempt.job_id) is attempt:
                del self._attempts[attempt.job_id]
            for node, devices in attempt.devices.items():
                self._devices_used[node].difference_update(devices)

    def _watch_adopted(self, attempt: _Attempt, report: Path) -> None:
        """An adopted run's groups are not our children: liveness from signal 0, the outcome from the
        report's ``end`` record (exit codes are lost with the process that started them)."""
        while any(_alive(p) for p in attempt.pgids):
            time.sleep(0.2)
        self._release_attempt(attempt)
        if attempt.cancelled:
            return
        records = _read(report)
        ended = _ended(records)
        cause = "" if ended else "adopted after a restart: its processes ended without the worker's end record"
        attempt.on_exit(attempt.job_id, attempt.attempt, ExitInfo(ok=ended, cause=cause, measured=summarize(records)))

    def _watch(self, attempt: _Attempt, report: Path, log: Any) -> None:
        seen = 0
        records: list[dict[str, Any]] = []
        while True:
            done = all(p.poll() is not None for p in attempt.procs)
            fresh = _read(report)[seen:]
            seen += len(fresh)
            records += fresh
            if attempt.on_report is not None:
                for record in fresh:
                    attempt.on_report(attempt.job_id, attempt.attempt, record)
            if done:
                break
            if any(p.returncode not in (None, 0) for p in attempt.procs):
                self._stop(attempt.pgids)  # one node failed: stop the others, which would wait forever
            time.sleep(0.2)
        log.close()
        self._release_attempt(attempt)
        if attempt.cancelled:
            return
        codes = [p.returncode for p in attempt.procs]
        measured = summarize(records)
        if all(code == 0 for code in codes):
            attempt.on_exit(attempt.job_id, attempt.attempt, ExitInfo(ok=True, measured=measured))
            return
        tail = _tail(attempt_log(self.workdir, attempt.job_id, attempt.attempt))
        failing = next(i for i, code in enumerate(codes) if code != 0)
        cause = f"node {failing} (torchrun) exited with code {codes[failing]}: {tail}"
        attempt.on_exit(attempt.job_id, attempt.attempt, ExitInfo(ok=False, cause=cause, measured=measured))

    def _stop(self, pgids: list[int]) -> None:
        """SIGTERM each torchrun agent (it stops its ranks), then SIGKILL agents and ranks left after the
        grace period (torchrun starts every rank in a session of its own, so the agent's group is not
        enough)."""
        ranks = [pid for pgid in pgids for pid in _children(pgid)]
        for pgid in pgids:
            _signal(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while any(_alive(p) for p in pgids + ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in pgids + ranks:
            _signal(pid, signal.SIGKILL)


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            break  # a line being written
    return out


def _ended(records: list[dict[str, Any]]) -> bool:
    """Whether a report ends with the worker's ``end`` record (written after the last step by
    :mod:`frenzy_opt.launch.worker.train`)."""
    return bool(records) and records[-1].get("event") == "end"


def _pid_record(path: Path) -> dict[str, Any] | None:
    """A run folder's ``pids`` file: ``attempt``, ``pgids`` and ``devices`` (node -> CUDA indices; empty in
    files written before devices were recorded), or None when missing or unreadable."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        devices = {str(n): [int(d) for d in ds] for n, ds in (record.get("devices") or {}).items()}
        return {"attempt": int(record["attempt"]), "pgids": [int(p) for p in record["pgids"]], "devices": devices}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    # The ranks' own errors ("[rank0]: ValueError: …") name the cause; torchrun's summary only the codes.
    ranks = [line for line in text if re.match(r"\[rank\d+\]: \w+(Error|Exception)", line.strip())]
    wanted = ranks[:1] + ranks[-1:] if ranks else [line for line in text if "exitcode" in line] or text
    return " | ".join(dict.fromkeys(line.strip() for line in wanted[-lines:]))[:500]


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux /proc; empty elsewhere)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _signal(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _cuda_count() -> int:
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:  # torch without CUDA support
        return 0
