"""The plan record: one typed :class:`Plan` from the planner to the training worker, and its one wire format.

A plan fixes the GPU type, the GPU count, the parallel layout and the micro-batch size of a job, with what the
planner predicted for it (memory per GPU, step time). The planner makes it
(:func:`frenzy_opt.planning.plans.enumerate_plans`), the scheduler's options carry it, the executors launch it,
the closed loop learns from it. It lives here, in ``core``, so that every layer that speaks of a plan — the
training worker and the step-time model's closed loop included — reads the same record without importing the
planner.

**Wire format.** :meth:`Plan.to_dict` is the one writer of a plan's mapping and :meth:`Plan.from_dict` the one
reader: ``frenzy plan --json``, ``POST /v1/plans`` (the dry run), a job's ``plan`` in ``GET /v1/jobs/{id}`` and
the store, the run folder's ``plan.json`` the worker reads and the placement files of ``frenzy export``.

**The micro-batch size lives in one place**: the record's ``micro_batch_size`` field. The mapping writes it
twice, at the top (``frenzy plan --json``'s contract field) and inside ``parallel`` (where the worker's
``--plan`` files and hand-written placement files have carried it beside the layout); both are kept because
clients read each. The reader takes either and refuses a mapping where they differ
(:func:`frenzy_opt.core.spec.plan_layout`, the layout half of :meth:`Plan.from_dict`, which the worker and the
placement-file check call alone: they need the layout, not the predictions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from frenzy_opt.core.spec import ParallelConfig, plan_layout


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """One memory-feasible way to run a job. Memory figures are per GPU, the maximum over stages."""

    gpu_type: str
    num_gpus: int
    parallel: ParallelConfig
    micro_batch_size: int
    precision: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    device_used_bytes: int
    capacity_bytes: int
    step_time_s: float | None = None
    est_runtime_s: float | None = None
    peak_allocated_upper_bytes: int = 0
    peak_reserved_upper_bytes: int = 0
    device_used_upper_bytes: int = 0
    required_upper_bytes: int = 0
    """The bound's required part (:attr:`frenzy_opt.prediction.marp.bound.MemoryBound.required`): what
    admission tests against the GPU's memory less the headroom."""
    required_headroom_bytes: int = 0
    """The headroom the plan was admitted with (``training.memory_headroom`` x capacity)."""
    step_time_p10_s: float | None = None
    """The step time's 10th percentile from the step-time model's cross-validated errors."""
    step_time_p90_s: float | None = None
    memory_risk: bool = False
    """Admitted on the user's word: the job pins its whole layout, its predicted tensors fit, but the
    required bound plus the headroom exceeds the GPU (the run may go out of memory)."""
    num_micro_batches: int | None = None
    """Micro-batches per step and data-parallel rank, ``global_batch / (micro_batch x dp)`` (set by
    :func:`enumerate_plans`; None for plans made elsewhere). Not serialised: it follows from the job."""

    @property
    def headroom_bytes(self) -> int:
        """Memory left on the GPU above the required bound (the point footprint where that is larger)."""
        return self.capacity_bytes - max(self.required_upper_bytes, self.device_used_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_type": self.gpu_type,
            "num_gpus": self.num_gpus,
            "parallel": {**self.parallel.to_dict(), "micro_batch_size": self.micro_batch_size},
            "micro_batch_size": self.micro_batch_size,
            "precision": self.precision,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "device_used_bytes": self.device_used_bytes,
            "capacity_bytes": self.capacity_bytes,
            "peak_allocated_upper_bytes": self.peak_allocated_upper_bytes,
            "peak_reserved_upper_bytes": self.peak_reserved_upper_bytes,
            "device_used_upper_bytes": self.device_used_upper_bytes,
            "required_upper_bytes": self.required_upper_bytes,
            "required_headroom_bytes": self.required_headroom_bytes,
            "headroom_bytes": self.headroom_bytes,
            "step_time_s": self.step_time_s,
            "step_time_p10_s": self.step_time_p10_s,
            "step_time_p90_s": self.step_time_p90_s,
            "est_runtime_s": self.est_runtime_s,
            "memory_risk": self.memory_risk,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """The plan :meth:`to_dict` wrote (``headroom_bytes`` is derived and not read back); ``ValueError``
        names a missing, unknown or ill-typed field."""
        if not isinstance(data, dict):
            raise ValueError(f"plan must be a mapping, got {data!r}")
        unknown = sorted(set(data) - _PLAN_KEYS)
        if unknown:
            raise ValueError(f"plan: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_PLAN_KEYS))}")
        parallel, micro_batch_size = plan_layout(data)
        values: dict[str, Any] = {}
        for name, kind in _PLAN_FIELDS.items():
            if name not in data:
                if name in _PLAN_REQUIRED:
                    raise ValueError(f"plan.{name} is required")
                continue
            value = data[name]
            if value is None and kind == _NUMBER:
                values[name] = None
            elif isinstance(value, bool) is not (kind is bool) or not isinstance(value, kind):
                raise ValueError(f"plan.{name} must be {_KIND_NAMES[kind]}, got {value!r}")
            else:
                values[name] = float(value) if kind == _NUMBER else value
        if values["num_gpus"] != parallel.num_gpus:
            raise ValueError(f"plan.num_gpus ({values['num_gpus']}) must equal dp x tp x pp x cp ({parallel.num_gpus})")
        return cls(parallel=parallel, micro_batch_size=micro_batch_size, **values)


_NUMBER = (int, float)
# What Plan.from_dict reads besides the layout: field -> accepted type (the step times may be null).
_PLAN_FIELDS: dict[str, Any] = {
    "gpu_type": str,
    "num_gpus": int,
    "precision": str,
    "peak_allocated_bytes": int,
    "peak_reserved_bytes": int,
    "device_used_bytes": int,
    "capacity_bytes": int,
    "peak_allocated_upper_bytes": int,
    "peak_reserved_upper_bytes": int,
    "device_used_upper_bytes": int,
    "required_upper_bytes": int,
    "required_headroom_bytes": int,
    "step_time_s": _NUMBER,
    "step_time_p10_s": _NUMBER,
    "step_time_p90_s": _NUMBER,
    "est_runtime_s": _NUMBER,
    "memory_risk": bool,
}
_PLAN_REQUIRED = frozenset(
    (
        "gpu_type",
        "num_gpus",
        "precision",
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "device_used_bytes",
        "capacity_bytes",
    )
)
_PLAN_KEYS = frozenset(_PLAN_FIELDS) | {"parallel", "micro_batch_size", "headroom_bytes"}
_KIND_NAMES: dict[Any, str] = {
    str: "a string",
    int: "an integer",
    _NUMBER: "a number or null",
    bool: "true or false",
}
