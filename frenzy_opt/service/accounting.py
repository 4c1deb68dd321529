"""GPU accounting from the job history: which GPUs each job held and when (the dashboard's occupancy chart and
Gantt), and GPU-hours per tenant and GPU type (``GET /v1/usage``, ``frenzy usage``; Slurm's ``sacct``).

A job holds its GPUs from each ``running`` event to the next event of another state (queued again after a
preemption, or an end). The GPUs are those of the ``scheduled`` event just before, whose detail the
orchestrator writes with :func:`placement_detail` and this module reads with :func:`placement_of`: the
history is the only record of an earlier attempt's placement (the job row keeps the latest).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from frenzy_opt.core.enums import JobState
from frenzy_opt.service.records import EventRecord, JobRecord

_PLACED = re.compile(r"^(?P<n>\d+) x (?P<gpu>\S+) on ")


def placement_detail(num_gpus: int, gpu_type: str, nodes: Sequence[str]) -> str:
    """The ``scheduled`` event's detail: ``8 x A100-SXM4-80GB on node-0, node-1``."""
    return f"{num_gpus} x {gpu_type} on {', '.join(nodes)}"


def placement_of(detail: str) -> tuple[int, str] | None:
    """GPU count and type of a :func:`placement_detail`; None for any other text."""
    match = _PLACED.match(detail)
    return None if match is None else (int(match["n"]), match["gpu"])


@dataclass(frozen=True, slots=True)
class Held:
    """One stretch of a job on its GPUs; ``end`` None while it still runs."""

    job: str
    name: str
    tenant: str
    gpu_type: str
    num_gpus: int
    start: float
    end: float | None

    def seconds(self, since: float, until: float) -> float:
        """Seconds of the stretch inside ``[since, until]``."""
        end = until if self.end is None else min(self.end, until)
        return max(end - max(self.start, since), 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "name": self.name,
            "tenant": self.tenant,
            "gpu_type": self.gpu_type,
            "num_gpus": self.num_gpus,
            "start": self.start,
            "end": self.end,
        }


def held(record: JobRecord, events: Iterable[EventRecord]) -> list[Held]:
    """The stretches of one job from its events in order."""
    stretches: list[Held] = []
    placed: tuple[int, str] | None = None
    start: float | None = None
    for event in events:
        if start is not None and event.state != JobState.RUNNING:
            stretches.append(_held(record, placed, start, event.at))
            start = None
        if event.state == JobState.SCHEDULED:
            placed = placement_of(event.detail)
        elif event.state == JobState.RUNNING and start is None and placed is not None:
            start = event.at
    if start is not None:
        stretches.append(_held(record, placed, start, None))
    return stretches


def _held(record: JobRecord, placed: tuple[int, str] | None, start: float, end: float | None) -> Held:
    assert placed is not None
    num_gpus, gpu_type = placed
    return Held(record.id, record.name, record.tenant, gpu_type, num_gpus, start, end)


def usage(stretches: Iterable[Held], since: float, until: float, *, time_scale: float = 1.0) -> list[dict[str, Any]]:
    """GPU-hours per (tenant, GPU type) inside the wall-clock window ``[since, until]``, in cluster time
    (wall seconds x ``time_scale``), and how many jobs used them."""
    hours: dict[tuple[str, str], float] = {}
    jobs: dict[tuple[str, str], set[str]] = {}
    for h in stretches:
        seconds = h.seconds(since, until)
        if seconds <= 0:
            continue
        key = (h.tenant, h.gpu_type)
        hours[key] = hours.get(key, 0.0) + seconds * time_scale * h.num_gpus / 3600
        jobs.setdefault(key, set()).add(h.job)
    return [
        {
            "tenant": tenant,
            "gpu_type": gpu_type,
            "gpu_hours": hours[(tenant, gpu_type)],
            "jobs": len(jobs[(tenant, gpu_type)]),
        }
        for tenant, gpu_type in sorted(hours)
    ]
