"""The measurement record: what one attempt of a job measured, typed from the executor to the closed loop.

The executors make it (the local and Ray executors from the training worker's report lines,
:func:`frenzy_opt.launch.executors.common.summarize`; the simulated executor from the plan's prediction, marked
``source="simulated"``), the orchestrator adds the deadline figures and stores it, the closed loop
(:func:`frenzy_opt.prediction.closedloop.sample_of`) learns from it, and the API answers it as a job's
``measured``. :meth:`Measurement.to_dict` is the one writer of its mapping (only the fields known, so a run that
measured nothing is ``{}``), :meth:`Measurement.from_dict` the one reader.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """One attempt's measurement; every field is None when not known. Field order is the mapping's key order."""

    source: str | None = None
    """``"simulated"`` when nothing ran (the simulated executor reports the prediction); None for a real run."""
    steps_run: int | None = None
    """Training steps the worker completed (its ``step`` report lines)."""
    loss_first: float | None = None
    loss_last: float | None = None
    step_time_s: float | None = None
    """Median step time in seconds, the first (warm-up) step excluded when there are others."""
    tokens_per_s: float | None = None
    """Median tokens per second over the steps after the first."""
    peak_memory_bytes: tuple[int, ...] | None = None
    """Peak memory per rank, in rank order (bytes; what ``memory_source`` measures)."""
    memory_source: str | None = None
    """What measured the peak: ``torch.cuda.max_memory_allocated`` on GPU, ``MemTracker`` on CPU, or a
    process's resident set size (:data:`frenzy_opt.prediction.closedloop.COMPARABLE_MEMORY`)."""
    deadline_s: float | None = None
    """The job's ``scheduling.deadline_s`` (cluster seconds after submission), set by the orchestrator."""
    end_after_submit_s: float | None = None
    """Cluster seconds from submission to the end of the run, with a deadline."""
    deadline_missed_by_s: float | None = None
    """Cluster seconds the run ended past its deadline (None: met, or no deadline)."""

    @property
    def simulated(self) -> bool:
        """Whether nothing really ran (the closed loop learns nothing from it)."""
        return self.source == "simulated"

    def to_dict(self) -> dict[str, Any]:
        """The mapping of the fields known (JSON types: ``peak_memory_bytes`` a list)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Measurement:
        """The measurement :meth:`to_dict` wrote (None or ``{}``: nothing measured); ``ValueError`` names an
        unknown field."""
        if not data:
            return cls()
        unknown = sorted(set(data) - _FIELDS)
        if unknown:
            raise ValueError(f"measured: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_FIELDS))}")
        values = dict(data)
        peaks = values.get("peak_memory_bytes")
        if peaks is not None:
            values["peak_memory_bytes"] = tuple(int(b) for b in peaks)
        return cls(**values)


_FIELDS = frozenset(f.name for f in fields(Measurement))
