"""Replaying Sia's own benchmark: its workload files as simulator jobs, its profile tables as the truth
(``frenzy simulate sia-64 --workload-file F --workload-format sia --truth profiled``).

Everything below follows Sia's public artefact (``siasosp23/artifacts``, ``sia-simulator/``); the code is
ours. A workload row is ``name, time, application, num_replicas, batch_size`` (``workloads/*/workload-*.csv``).

**Work and completion** (``applications.py`` ``Application``, ``job.py`` ``Job.step``): a job's progress is
counted in the application's ``validation-<b>.csv`` ``progress`` column (iterations at the smallest
validated batch, ``init_batch_size``). An iteration of batch B advances it by the statistical-efficiency gain
(var + sqr) / (var / s + sqr), s = B / init_batch_size, with ``grad_sqr`` and ``grad_var`` of the current
epoch interpolated linearly in B between the validated batch sizes (``get_grad_stats``). The job is done
when it completes epoch ``max_epochs`` (``get_completion_epoch`` without a target metric returns
``max_epochs - 1``), i.e. when its progress reaches ``get_progress(max_epochs)`` = the minimum over the
validation tables of ``progress[max_epochs - 1]``. ``max_epochs`` is per application (:data:`MAX_EPOCHS`).
With the batch size fixed (``--disable_bsz_tuning``) the gain depends only on the epoch, so the work is a
fixed number of iterations, :func:`iterations_to_complete`: Σ_e Δprogress_e / gain(B, e).

**Speed** (``Job.step``): one iteration of batch B on a placement takes the table's time
(:meth:`~frenzy_opt.simulation.throughputs.ProfileTable.batch_s`, Sia's ``get_throughput`` with gradient accumulation)
times the application's calibration slowdown (``simulator_config.py`` ``SLOWDOWNS``: goodput × 1/slowdown).

**Restarts** (``Job.reallocate``): every change of placement, the first start included, stalls the job for
the application's ``rescale_time`` (:data:`RESCALE_S`); ``SimJob.startup_s`` carries the first one.

**Deviations, stated:** the effective batch is B (the artefact's ``num_replicas · ceil(B / num_replicas)``
differs by rounding for counts that do not divide B); placements are only those with a profile
(no 3-D interpolation, :mod:`frenzy_opt.simulation.throughputs`); ncf's batch is the workload's (the artefact
overrides it to 32,768 for Sia's policy); ``gpt_pmp`` is not read.

**What policies know** before a job has run: a one-GPU profile per GPU type scaled linearly with the GPU
count (:func:`predicted_s`) — Sia's paper bootstraps each job with a one-GPU profile of every type; the
measured scaling is learnt once a job runs (``Simulator.observed_step_s``). ``frenzy`` plans with the same
predictions; the ``-oracle`` variants know the table.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from frenzy_opt.core.spec import ParallelConfig
from frenzy_opt.hardware.placement import gpus_per_node
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.planning.plans import Plan
from frenzy_opt.planning.problem import Option
from frenzy_opt.planning.scenario import Request
from frenzy_opt.simulation.simulator import SimJob
from frenzy_opt.simulation.throughputs import ProfileTable

# Epochs to completion per application: sia-simulator/applications.py, APPLICATIONS (max_epochs=...).
MAX_EPOCHS: dict[str, int] = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
# Checkpoint-restore stall per placement change, seconds: applications.py, Application.rescale_time.
RESCALE_S: dict[str, float] = {
    "cifar10": 50.0,
    "deepspeech2": 25.0,
    "bert": 120.0,
    "yolov3": 80.0,
    "imagenet": 250.0,
    "ncf": 15.0,
}
# Real runs were this much slower than the simulator: simulator_config.py, SLOWDOWNS.
SLOWDOWN: dict[str, float] = {
    "cifar10": 1.8,
    "imagenet": 1.2,
    "yolov3": 1.2,
    "bert": 1.2,
    "deepspeech2": 1.2,
    "ncf": 1.5,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Epoch:
    """One row of a validation table: progress at the epoch's end and the gradient statistics."""

    progress: float
    grad_sqr: float
    grad_var: float


Validation = dict[int, tuple[Epoch, ...]]
"""Per validated batch size, the epochs in order."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SiaRow:
    """One job of a Sia workload file."""

    name: str
    time_s: float
    application: str
    num_replicas: int
    batch_size: int


def read_validation(folder: str | Path) -> Validation:
    """``<folder>/validation-<b>.csv`` (``progress, iteration, metric, grad_sqr, grad_var``)."""
    out: Validation = {}
    for path in sorted(Path(folder).glob("validation-*.csv")):
        with path.open(newline="", encoding="utf-8") as handle:
            rows = [
                Epoch(progress=float(r["progress"]), grad_sqr=float(r["grad_sqr"]), grad_var=float(r["grad_var"]))
                for r in csv.DictReader(handle)
            ]
        out[int(path.stem.removeprefix("validation-"))] = tuple(rows)
    if not out:
        raise ValueError(f"sia replay: no validation-<batch>.csv in {folder}")
    return out


def _grad_stats(validation: Validation, batch_size: float, epoch: int) -> tuple[float, float]:
    """grad_sqr, grad_var at ``batch_size`` in ``epoch``, linear between validated sizes (get_grad_stats)."""
    sizes = sorted(validation)
    if not sizes[0] <= batch_size <= sizes[-1]:
        raise ValueError(f"sia replay: batch size {batch_size:g} outside the validated {sizes[0]}..{sizes[-1]}")
    low = max(b for b in sizes if b <= batch_size)
    high = min(b for b in sizes if b >= batch_size)
    lo, hi = validation[low][epoch], validation[high][epoch]
    if low == high:
        return lo.grad_sqr, lo.grad_var
    w = (batch_size - low) / (high - low)
    return lo.grad_sqr + w * (hi.grad_sqr - lo.grad_sqr), lo.grad_var + w * (hi.grad_var - lo.grad_var)


def iterations_to_complete(validation: Validation, batch_size: float, max_epochs: int) -> float:
    """Iterations of ``batch_size`` until progress reaches the end of epoch ``max_epochs`` (module docstring)."""
    if max_epochs > min(len(v) for v in validation.values()):
        raise ValueError(f"sia replay: {max_epochs} epochs, the validation tables have fewer")
    init = min(validation)
    scale = batch_size / init
    total = 0.0
    previous = 0.0
    for epoch in range(max_epochs):
        # get_progress(e + 1): the minimum over the tables of progress[e].
        reached = min(v[epoch].progress for v in validation.values())
        sqr, var = _grad_stats(validation, batch_size, epoch)
        gain = (var + sqr) / (var / scale + sqr)
        total += (reached - previous) / gain
        previous = reached
    return total


def read_sia_workload(path: str | Path) -> list[SiaRow]:
    """The rows of a Sia workload CSV (module docstring); errors name the row and the column."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--workload-file: no such file {path}")
    rows = []
    with path.open(newline="", encoding="utf-8") as handle:
        for i, r in enumerate(csv.DictReader(handle)):
            try:
                rows.append(
                    SiaRow(
                        name=r["name"],
                        time_s=float(r["time"]),
                        application=r["application"],
                        num_replicas=int(r["num_replicas"]),
                        batch_size=int(float(r["batch_size"])),
                    )
                )
            except (KeyError, ValueError, TypeError):
                raise ValueError(
                    f"{path}: row {i + 2}: needs name, time, application, num_replicas, batch_size"
                ) from None
    if not rows:
        raise ValueError(f"{path}: no jobs")
    return rows


def sia_shapes(topology: Topology, gpu_type: str) -> list[tuple[int, int]]:
    """(GPU count, whole nodes) of Sia's configurations on a type: powers of two inside a node (whole
    nodes 0), then 1, 2, … whole nodes (BASELINES.md, Sia §3.2)."""
    nodes = topology.nodes_of(gpu_type)
    size = max(topology.nodes[n].num_gpus for n in nodes)
    shapes = []
    k = 1
    while k < size:
        shapes.append((k, 0))
        k *= 2
    shapes.append((size, 0))
    shapes += [(size * m, m) for m in range(2, len(nodes) + 1)]
    return shapes


def predicted_s(table: ProfileTable, row: SiaRow, gpu_type: str, num_gpus: int) -> float | None:
    """What a policy knows before a run: the one-GPU profile on the type, scaled linearly (docstring)."""
    one = table.batch_s(row.application, gpu_type, (1,), row.batch_size)
    return None if one is None else one * SLOWDOWN[row.application] / num_gpus


class SiaReplayTruth:
    """The profile table's seconds per iteration of each job's own application and batch, times Sia's
    calibration slowdown (module docstring). Every option of a replayed job has a profile."""

    name = "profiled"

    def __init__(self, table: ProfileTable, rows: dict[str, SiaRow]) -> None:
        self.table, self.rows = table, rows
        self._memo: dict[tuple[str, str, int], float] = {}

    def step_s(self, job: SimJob, option: Option) -> float:
        key = (job.id, option.gpu_type, option.num_gpus)
        found = self._memo.get(key)
        if found is None:
            row = self.rows[job.id]
            measured = self.table.batch_s(row.application, option.gpu_type, gpus_per_node(option), row.batch_size)
            assert measured is not None, f"{job.id}: option without a profile"
            found = self._memo[key] = measured * SLOWDOWN[row.application]
        return found

    def falls_back(self, job: SimJob, option: Option) -> bool:
        return False


def _option(gpu_type: str, num_gpus: int, whole_nodes: int, predicted: float) -> Option:
    plan = Plan(
        gpu_type=gpu_type,
        num_gpus=num_gpus,
        parallel=ParallelConfig(dp=num_gpus),
        micro_batch_size=1,
        precision="fp32",
        peak_allocated_bytes=0,
        peak_reserved_bytes=0,
        device_used_bytes=0,
        capacity_bytes=0,
        step_time_s=predicted,
    )
    return Option(gpu_type=gpu_type, num_gpus=num_gpus, whole_nodes=whole_nodes, duration_s=predicted, plan=plan)


def _request(row: SiaRow, per_count: dict[tuple[str, int], Option], topology: Topology) -> Request:
    """The user's ask on a plain cluster: ``num_replicas`` (raised to the next profiled count) on the type
    with the most GPUs that has it (ties by name)."""
    types = sorted(topology.gpu_types, key=lambda t: (-topology.num_gpus_of(t), t))
    for gpu_type in types:
        counts = sorted(n for t, n in per_count if t == gpu_type and n >= row.num_replicas)
        if counts:
            return Request(gpu_type=gpu_type, num_gpus=counts[0], source="trace")
    fewest = min(per_count, key=lambda k: (k[1], types.index(k[0])))
    return Request(gpu_type=fewest[0], num_gpus=fewest[1], source="trace")


def sia_jobs(
    rows: list[SiaRow], table: ProfileTable, validations: dict[str, Validation], topology: Topology
) -> list[SimJob]:
    """Simulator jobs of a Sia workload: work from the validation tables, options = Sia's configurations
    with a profile for the job's application and batch (module docstring)."""
    origin = min(r.time_s for r in rows)
    jobs = []
    for row in sorted(rows, key=lambda r: (r.time_s, r.name)):
        if row.application not in MAX_EPOCHS or row.application not in validations:
            raise ValueError(f"{row.name}: application {row.application!r}; allowed: {', '.join(sorted(MAX_EPOCHS))}")
        per_count: dict[tuple[str, int], Option] = {}
        for gpu_type in topology.gpu_types:
            for count, whole in sia_shapes(topology, gpu_type):
                placement = (count,) if whole == 0 else (count // whole,) * whole
                if table.batch_s(row.application, gpu_type, placement, row.batch_size) is None:
                    continue
                predicted = predicted_s(table, row, gpu_type, count)
                if predicted is not None:
                    per_count[(gpu_type, count)] = _option(gpu_type, count, whole, predicted)
        if not per_count:
            raise ValueError(f"{row.name}: {row.application} at batch {row.batch_size} has no profiled configuration")
        steps = iterations_to_complete(validations[row.application], row.batch_size, MAX_EPOCHS[row.application])
        jobs.append(
            SimJob(
                id=row.name,
                arrival_s=float(math.ceil(row.time_s - origin)),
                weight=1.0,
                model=row.application,
                steps=max(1, round(steps)),
                options=tuple(per_count.values()),
                per_count=per_count,
                request=_request(row, per_count, topology),
                restart_s=RESCALE_S[row.application],
                startup_s=RESCALE_S[row.application],
            )
        )
    if len({j.id for j in jobs}) != len(jobs):
        raise ValueError("sia workload: job names must be unique")
    return jobs


def load_sia_replay(
    workload: str | Path, table: ProfileTable, traces_root: str | Path, topology: Topology
) -> tuple[list[SimJob], SiaReplayTruth]:
    """Jobs and truth of a Sia workload file, with ``traces_root/<application>/validation-*.csv``."""
    rows = read_sia_workload(workload)
    validations = {app: read_validation(Path(traces_root) / app) for app in sorted({r.application for r in rows})}
    jobs = sia_jobs(rows, table, validations, topology)
    return jobs, SiaReplayTruth(table, {r.name: r for r in rows})
