"""Scenario files (contract 2) and the resolution of shipped data names to files.

A scenario names a cluster (inline mapping, a path, or a shipped cluster name) and explicit ``jobs``
(job specs with ``id``, ``arrival_s`` and optional ``weight``). Arguments that name files are resolved
first as paths, then as names of files shipped in :mod:`frenzy_opt.scenarios` (``.yaml`` optional).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from frenzy_opt.cluster import ClusterSpec, parse_cluster
from frenzy_opt.spec import JobSpec, load_mapping, parse_job

DEFAULT_SCENARIO = "default"


@dataclass(frozen=True, slots=True, kw_only=True)
class ScenarioJob:
    id: str
    arrival_s: float
    weight: float
    spec: JobSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    name: str
    cluster: ClusterSpec
    jobs: tuple[ScenarioJob, ...]


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


def parse_scenario(data: dict[str, Any]) -> Scenario:
    if "cluster" not in data:
        raise ValueError("scenario: cluster is required (an inline mapping, a path or a shipped cluster name)")
    cluster = load_cluster_ref(data["cluster"])
    jobs_raw = data.get("jobs")
    if not isinstance(jobs_raw, list) or not jobs_raw:
        raise ValueError("scenario: jobs must be a non-empty list of job specs with id and arrival_s")
    jobs = []
    for i, raw in enumerate(jobs_raw):
        try:
            spec = parse_job(raw)
        except ValueError as err:
            raise ValueError(f"jobs[{i}]: {err}") from None
        arrival = raw.get("arrival_s", 0.0)
        weight = raw.get("weight", 1.0)
        for field, value in (("arrival_s", arrival), ("weight", weight)):
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ValueError(f"jobs[{i}].{field} must be a non-negative number, got {value!r}")
        jobs.append(
            ScenarioJob(id=str(raw.get("id", f"job-{i}")), arrival_s=float(arrival), weight=float(weight), spec=spec)
        )
    return Scenario(name=str(data.get("name") or "scenario"), cluster=cluster, jobs=tuple(jobs))


def load_scenario(name_or_path: str | Path = DEFAULT_SCENARIO) -> Scenario:
    return parse_scenario(load_mapping(resolve(name_or_path)))
