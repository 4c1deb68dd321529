"""Workloads: the ``workload:`` section of a scenario, a seeded synthetic trace generator and a reader for
Philly/Helios-style trace files.

A *trace job* is what cluster traces record: a submit time, the GPUs the user asked for and how long the job
ran. :mod:`frenzy_opt.simulation.tracemap` turns trace jobs into LLM training jobs of matching size.

Synthetic traces follow the "Philly distribution" Gavel uses in its evaluation (Narayanan et al., OSDI 2020,
§7.1; ``../shared/BASELINES.md``): GPUs per job 1/2/4/8 with probabilities 0.70/0.10/0.15/0.05; duration
60·10^U(1.5, 3) s with probability 0.8, else 60·10^U(3, 4) s; Poisson arrivals. Bursts multiply the arrival
rate over a window (Sia's "newTrace" has 5–100 jobs/h bursts, Jayaram Subramanya et al., SOSP 2023, §6).

Trace files are CSV with a header. Recognised columns (first match wins):

* submit time: ``timestamp`` (``YYYY-MM-DD HH:MM:SS``, Philly as published by Pollux), ``time``,
  ``submit_time`` or ``submit_s`` (seconds);
* GPUs: ``num_gpus``, ``num_replicas`` (Pollux/Sia workloads), ``gpu_num`` (Helios);
* run time: ``duration`` (seconds). Pollux/Sia workload files have no run time but an ``application``
  whose class Sia assigned by GPU-time (S < 1, M 1–10, L 10–100, XL > 100 GPU-hours); for those a run time
  is drawn log-uniformly within the class (:data:`APPLICATION_CLASS`).
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

HOUR = 3600.0

# Sia's job-size classes by GPU-time (GPU-hours), SOSP 2023 §6 (BASELINES.md): S < 1, M 1-10, L 10-100, XL > 100.
SIZE_CLASSES: tuple[tuple[str, float, float], ...] = (
    ("S", 0.0, 1.0),
    ("M", 1.0, 10.0),
    ("L", 10.0, 100.0),
    ("XL", 100.0, 1000.0),
)
# Pollux/Sia workload applications -> the size class their GPU-time falls in (Pollux, Qiao et al. OSDI 2021,
# Table 1: cifar10/ncf minutes, deepspeech2/bert/yolov3 hours, imagenet tens of GPU-hours and more).
APPLICATION_CLASS = {"cifar10": "S", "ncf": "S", "bert": "M", "deepspeech2": "M", "yolov3": "L", "imagenet": "XL"}
# Gavel's Philly distribution (OSDI 2020 §7.1).
PHILLY_GPUS: dict[int, float] = {1: 0.70, 2: 0.10, 4: 0.15, 8: 0.05}


def size_class(gpu_seconds: float) -> str:
    """Sia's class of a job from its GPU-time."""
    hours = gpu_seconds / HOUR
    for name, _, upper in SIZE_CLASSES[:-1]:
        if hours < upper:
            return name
    return SIZE_CLASSES[-1][0]


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceJob:
    id: str
    submit_s: float
    num_gpus: int
    duration_s: float

    @property
    def gpu_seconds(self) -> float:
        return self.num_gpus * self.duration_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Burst:
    """Arrivals ``factor`` times faster during [start_h, start_h + duration_h)."""

    start_h: float
    duration_h: float
    factor: float


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSpec:
    """The ``workload:`` section of a scenario (contract 2). Either a synthetic generator (``num_jobs``,
    ``jobs_per_hour``, ``bursts``, ``gpus``) or a ``trace`` file (``limit``, ``skip``); in both cases
    ``duration_scale`` multiplies run times, ``model_mix`` overrides the class -> model mapping and ``seed``
    makes everything reproducible."""

    seed: int = 0
    num_jobs: int = 100
    jobs_per_hour: float = 20.0
    bursts: tuple[Burst, ...] = ()
    gpus: tuple[tuple[int, float], ...] = tuple(PHILLY_GPUS.items())
    duration_scale: float = 1.0
    trace: str | None = None
    limit: int | None = None
    skip: int = 0
    model_mix: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()
    """Per size class (or ``*`` for all) the catalogue models and their weights."""


def _number(field: str, value: object, *, low: float, high: float, integer: bool = False) -> float:
    kinds = (int,) if integer else (int, float)
    if not isinstance(value, kinds) or isinstance(value, bool) or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise ValueError(f"workload.{field} must be {kind} in [{low:g}, {high:g}], got {value!r}")
    return float(value)


MAX_JOBS = 1_000_000


def parse_workload(data: object) -> WorkloadSpec:
    """A :class:`WorkloadSpec` from a mapping; errors name the field and the allowed values."""
    if not isinstance(data, dict):
        raise ValueError("workload must be a mapping (seed, num_jobs, jobs_per_hour, bursts, gpus, trace, ...)")
    allowed = {f for f in WorkloadSpec.__dataclass_fields__}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ValueError(f"workload: unknown field(s) {unknown}; allowed: {', '.join(sorted(allowed))}")
    kwargs: dict[str, Any] = {}
    if "seed" in data:
        kwargs["seed"] = int(_number("seed", data["seed"], low=0, high=2**63 - 1, integer=True))
    if "num_jobs" in data:
        kwargs["num_jobs"] = int(_number("num_jobs", data["num_jobs"], low=1, high=MAX_JOBS, integer=True))
    if "jobs_per_hour" in data:
        kwargs["jobs_per_hour"] = _number("jobs_per_hour", data["jobs_per_hour"], low=1e-3, high=1e6)
    if "duration_scale" in data:
        kwargs["duration_scale"] = _number("duration_scale", data["duration_scale"], low=1e-6, high=1e6)
    if "limit" in data:
        kwargs["limit"] = int(_number("limit", data["limit"], low=1, high=MAX_JOBS, integer=True))
    if "skip" in data:
        kwargs["skip"] = int(_number("skip", data["skip"], low=0, high=10 * MAX_JOBS, integer=True))
    if "trace" in data:
        if not isinstance(data["trace"], str):
            raise ValueError(f"workload.trace must be a path to a CSV trace, got {data['trace']!r}")
        kwargs["trace"] = data["trace"]
    if "bursts" in data:
        raw = data["bursts"]
        if not isinstance(raw, list):
            raise ValueError("workload.bursts must be a list of {start_h, duration_h, factor}")
        bursts = []
        for i, b in enumerate(raw):
            if not isinstance(b, dict) or set(b) != {"start_h", "duration_h", "factor"}:
                raise ValueError(f"workload.bursts[{i}] must have exactly start_h, duration_h, factor")
            bursts.append(
                Burst(
                    start_h=_number(f"bursts[{i}].start_h", b["start_h"], low=0, high=1e6),
                    duration_h=_number(f"bursts[{i}].duration_h", b["duration_h"], low=1e-6, high=1e6),
                    factor=_number(f"bursts[{i}].factor", b["factor"], low=1e-3, high=1e4),
                )
            )
        kwargs["bursts"] = tuple(bursts)
    if "gpus" in data:
        raw = data["gpus"]
        if not isinstance(raw, dict) or not raw:
            raise ValueError(
                "workload.gpus must map GPU counts to probabilities, e.g. {1: 0.7, 2: 0.1, 4: 0.15, 8: 0.05}"
            )
        pairs = []
        for count, p in raw.items():
            n = int(_number("gpus key", int(count) if str(count).isdigit() else count, low=1, high=4096, integer=True))
            pairs.append((n, _number(f"gpus[{count}]", p, low=0, high=1)))
        if not math.isclose(sum(p for _, p in pairs), 1.0, abs_tol=1e-6):
            raise ValueError(f"workload.gpus probabilities must sum to 1, got {sum(p for _, p in pairs):g}")
        kwargs["gpus"] = tuple(sorted(pairs))
    if "model_mix" in data:
        kwargs["model_mix"] = _parse_mix(data["model_mix"])
    return WorkloadSpec(**kwargs)


def _parse_mix(raw: object) -> tuple[tuple[str, tuple[tuple[str, float], ...]], ...]:
    classes = [name for name, _, _ in SIZE_CLASSES] + ["*"]
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"workload.model_mix must map size classes ({', '.join(classes)}) to {{model: weight}}")
    out = []
    for cls, models in raw.items():
        if cls not in classes:
            raise ValueError(f"workload.model_mix: unknown size class {cls!r}; allowed: {', '.join(classes)}")
        if isinstance(models, list):
            models = {m: 1.0 for m in models}
        if not isinstance(models, dict) or not models:
            raise ValueError(f"workload.model_mix.{cls} must be a list of models or a {{model: weight}} mapping")
        weights = tuple((str(m), _number(f"model_mix.{cls}.{m}", w, low=0, high=1e9)) for m, w in models.items())
        out.append((str(cls), weights))
    return tuple(out)


# --- synthetic traces ----------------------------------------------------------------------------------


def _rate_factor(t_s: float, bursts: tuple[Burst, ...]) -> float:
    factor = 1.0
    for b in bursts:
        if b.start_h * HOUR <= t_s < (b.start_h + b.duration_h) * HOUR:
            factor *= b.factor
    return factor


def synthetic_trace(spec: WorkloadSpec) -> list[TraceJob]:
    """``spec.num_jobs`` trace jobs drawn from the Philly distribution (module docstring), seeded."""
    rng = random.Random(spec.seed)
    counts = [n for n, _ in spec.gpus]
    weights = [p for _, p in spec.gpus]
    base_rate = spec.jobs_per_hour / HOUR
    peak = base_rate * max([1.0] + [b.factor for b in spec.bursts])
    jobs: list[TraceJob] = []
    t = 0.0
    while len(jobs) < spec.num_jobs:
        # Non-homogeneous Poisson arrivals by thinning (Lewis & Shedler 1979): candidates at the peak rate,
        # each kept with probability rate(t) / peak.
        t += rng.expovariate(peak)
        if rng.random() * peak > base_rate * _rate_factor(t, spec.bursts):
            continue
        num_gpus = rng.choices(counts, weights)[0]
        exponent = rng.uniform(1.5, 3.0) if rng.random() < 0.8 else rng.uniform(3.0, 4.0)
        jobs.append(
            TraceJob(
                id=f"job-{len(jobs):06d}",
                submit_s=round(t, 3),
                num_gpus=num_gpus,
                duration_s=60.0 * 10**exponent * spec.duration_scale,
            )
        )
    return jobs


# --- trace files ---------------------------------------------------------------------------------------

_SUBMIT = ("timestamp", "time", "submit_time", "submit_s")
_GPUS = ("num_gpus", "num_replicas", "gpu_num")


def _column(header: list[str], names: tuple[str, ...], path: Path) -> str:
    for name in names:
        if name in header:
            return name
    raise ValueError(f"{path}: no column among {', '.join(names)} (header: {', '.join(header)})")


def _seconds(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return datetime.strptime(value, "%Y-%m-%d %H:%M:%S").timestamp()


def read_trace(path: str | Path, *, limit: int | None = None, skip: int = 0, seed: int = 0) -> list[TraceJob]:
    """Trace jobs of a CSV trace (module docstring), sorted by submit time and shifted to start at 0; rows
    ``skip`` … ``skip + limit`` of that order. Rows with no GPUs or no run time are dropped."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"workload.trace: no such file {path}")
    rng = random.Random(seed)
    classes = {name: (low, high) for name, low, high in SIZE_CLASSES}
    rows: list[tuple[float, int, float, str]] = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = list(reader.fieldnames or [])
        submit_col = _column(header, _SUBMIT, path)
        gpus_col = _column(header, _GPUS, path)
        has_duration = "duration" in header
        if not has_duration and "application" not in header:
            raise ValueError(f"{path}: needs a duration column or an application column")
        for i, row in enumerate(reader):
            try:
                submit = _seconds(row[submit_col])
                gpus = int(float(row[gpus_col]))
                if has_duration:
                    duration = float(row["duration"])
                else:
                    app = row["application"]
                    if app not in APPLICATION_CLASS:
                        raise ValueError(f"unknown application {app!r}; known: {', '.join(APPLICATION_CLASS)}")
                    low, high = classes[APPLICATION_CLASS[app]]
                    gpu_hours = 10 ** rng.uniform(math.log10(max(low, 0.1)), math.log10(high))
                    duration = gpu_hours * HOUR / max(gpus, 1)
            except (KeyError, ValueError) as err:
                raise ValueError(f"{path}: row {i + 2}: {err}") from None
            if gpus >= 1 and duration > 0:
                rows.append((submit, gpus, duration, row.get("name") or f"job-{i:06d}"))
    rows.sort(key=lambda r: r[0])
    rows = rows[skip : None if limit is None else skip + limit]
    if not rows:
        raise ValueError(f"{path}: no jobs left after skip={skip}, limit={limit}")
    origin = rows[0][0]
    return [TraceJob(id=name, submit_s=submit - origin, num_gpus=g, duration_s=d) for submit, g, d, name in rows]


def trace_of(spec: WorkloadSpec, base_dir: Path | None = None) -> list[TraceJob]:
    """The trace jobs a workload spec describes: read from its ``trace`` file (relative to ``base_dir``)
    with ``duration_scale`` applied, or generated."""
    if spec.trace is None:
        return synthetic_trace(spec)
    path = Path(spec.trace)
    if not path.is_absolute() and base_dir is not None and not path.exists():
        path = base_dir / path
    jobs = read_trace(path, limit=spec.limit, skip=spec.skip, seed=spec.seed)
    if spec.duration_scale != 1.0:
        jobs = [
            TraceJob(id=j.id, submit_s=j.submit_s, num_gpus=j.num_gpus, duration_s=j.duration_s * spec.duration_scale)
            for j in jobs
        ]
    return jobs
