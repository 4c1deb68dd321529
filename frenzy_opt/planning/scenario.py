"""Scenario files (contract 2) and the resolution of shipped data names to files.

A scenario names a cluster (inline mapping, a path, or a shipped cluster name) and explicit ``jobs``
(job specs with ``id``, ``arrival_s``, optional ``weight`` and optional ``request`` — the GPU type and count a
user would ask for by hand on a plain cluster, used by the ``fifo`` and ``gavel`` baselines) or a
``workload`` generator (:mod:`frenzy_opt.planning.workload`; expanded into jobs by
:mod:`frenzy_opt.simulation.tracemap`),
and optional ``policies`` settings for the simulator. Arguments that name files are resolved
first as paths, then as names of files shipped in :mod:`frenzy_opt.scenarios` (``.yaml`` optional).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from frenzy_opt.core.spec import JobSpec, load_mapping, parse_job
from frenzy_opt.hardware.cluster import ClusterSpec, parse_cluster
from frenzy_opt.hardware.gpus import resolve_gpu
from frenzy_opt.planning.workload import WorkloadSpec, parse_workload

DEFAULT_SCENARIO = "default"


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """What a user names on a plain cluster: a GPU type and a GPU count."""

    gpu_type: str
    num_gpus: int
    source: str = "scenario"
    """Where it came from: ``scenario`` (the job's ``request:``), ``trace`` (the trace job's GPU count,
    :mod:`frenzy_opt.simulation.tracemap` and :mod:`frenzy_opt.simulation.siareplay`) or ``default`` (none
    given: the fewest GPUs of the job's fastest type, :func:`frenzy_opt.simulation.tracemap.fastest_request`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScenarioJob:
    """A job of a scenario's ``jobs`` list: a job spec with the keys below beside its own."""

    id: str
    """The job's identifier in the scenario (default: ``job-<index>``)."""
    arrival_s: float = 0.0
    """When the job is submitted, seconds from the scenario's start."""
    weight: float = 1.0
    """The job's weight in the objective (the sum of weight x completion time)."""
    spec: JobSpec
    request: Request | None = None
    """What a user would ask for by hand on a plain cluster (``{gpu_type, num_gpus}``), for the ``fifo`` and
    ``gavel`` baselines (derived when absent)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    name: str
    cluster: ClusterSpec
    jobs: tuple[ScenarioJob, ...]
    workload: WorkloadSpec | None = None
    """Set when the jobs are to be generated (``jobs`` is then empty until expanded)."""
    base_dir: Path | None = None
    """The scenario file's folder: relative trace paths resolve against it."""
    settings: tuple[tuple[str, Any], ...] = ()
    """Optional ``policies`` section: per-policy keyword settings, as (name, mapping) pairs."""


def shipped_names() -> list[str]:
    root = resources.files("frenzy_opt.scenarios")
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


def resolve(name_or_path: str | Path) -> Path:
    """A path that exists, or the shipped file of that name; ``ValueError`` lists the shipped names."""
    path = Path(name_or_path)
    if path.exists():
        return path
    shipped = resources.files("frenzy_opt.scenarios").joinpath(f"{str(name_or_path).removesuffix('.yaml')}.yaml")
    if shipped.is_file():
        return Path(str(shipped))
    raise ValueError(f"{name_or_path}: no such file, nor a shipped name; shipped: {', '.join(shipped_names())}")


def load_cluster_ref(ref: str | Path | dict[str, Any]) -> ClusterSpec:
    """A cluster from an inline mapping, a path or a shipped name."""
    if isinstance(ref, dict):
        return parse_cluster(ref)
    return parse_cluster(load_mapping(resolve(ref)))


def _request(i: int, raw: object, cluster: ClusterSpec) -> Request:
    if not isinstance(raw, dict) or set(raw) != {"gpu_type", "num_gpus"}:
        raise ValueError(f"jobs[{i}].request must be a mapping with exactly gpu_type and num_gpus")
    types = [g.name for g in cluster.gpu_types()]
    gpu = resolve_gpu(str(raw["gpu_type"]), f"jobs[{i}].request.gpu_type").name
    if gpu not in types:
        raise ValueError(
            f"jobs[{i}].request.gpu_type: {raw['gpu_type']!r} is not in the cluster; allowed: {', '.join(types)}"
        )
    count = raw["num_gpus"]
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= cluster.num_gpus_of(gpu):
        raise ValueError(
            f"jobs[{i}].request.num_gpus must be an integer in [1, {cluster.num_gpus_of(gpu)}], got {count!r}"
        )
    return Request(gpu_type=gpu, num_gpus=count)


def parse_scenario(data: dict[str, Any], base_dir: Path | None = None) -> Scenario:
    if "cluster" not in data:
        raise ValueError("scenario: cluster is required (an inline mapping, a path or a shipped cluster name)")
    cluster = load_cluster_ref(data["cluster"])
    settings = data.get("policies") or {}
    if not isinstance(settings, dict) or not all(isinstance(v, dict) for v in settings.values()):
        raise ValueError("scenario: policies must map policy names to mappings of settings")
    name = str(data.get("name") or "scenario")
    if "workload" in data:
        if "jobs" in data:
            raise ValueError("scenario: give either jobs or workload, not both")
        return Scenario(
            name=name,
            cluster=cluster,
            jobs=(),
            workload=parse_workload(data["workload"]),
            base_dir=base_dir,
            settings=tuple(settings.items()),
        )
    jobs_raw = data.get("jobs")
    if not isinstance(jobs_raw, list) or not jobs_raw:
        raise ValueError(
            "scenario: jobs must be a non-empty list of job specs with id and arrival_s (or give a workload)"
        )
    jobs = []
    for i, raw in enumerate(jobs_raw):
        if not isinstance(raw, dict):
            raise ValueError(f"jobs[{i}] must be a mapping (a job spec with id and arrival_s)")
        request = _request(i, raw["request"], cluster) if "request" in raw else None
        try:
            spec = parse_job({k: v for k, v in raw.items() if k != "request"})
        except ValueError as err:
            raise ValueError(f"jobs[{i}]: {err}") from None
        arrival = raw.get("arrival_s", 0.0)
        weight = raw.get("weight", 1.0)
        for field, value in (("arrival_s", arrival), ("weight", weight)):
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ValueError(f"jobs[{i}].{field} must be a non-negative number, got {value!r}")
        jobs.append(
            ScenarioJob(
                id=str(raw.get("id", f"job-{i}")),
                arrival_s=float(arrival),
                weight=float(weight),
                spec=spec,
                request=request,
            )
        )
    return Scenario(name=name, cluster=cluster, jobs=tuple(jobs), base_dir=base_dir, settings=tuple(settings.items()))


def load_scenario(name_or_path: str | Path = DEFAULT_SCENARIO) -> Scenario:
    path = resolve(name_or_path)
    return parse_scenario(load_mapping(path), base_dir=path.parent)
