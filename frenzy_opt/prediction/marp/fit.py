"""The fitted memory parameters MARP ships with (``frenzy_opt/data/memory-fit.json``).

``frenzy calibrate ../shared/calibration/memory-measured.csv --name memory`` refits them
(:func:`frenzy_opt.validation.memory_fit.fit`) from the calibration file's published measured runs and
writes the file; :func:`load_fit` reads it. Without a shipped file the public defaults of
:class:`frenzy_opt.prediction.marp.cuda.CudaTerms` apply and the bound's margins are 0.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

METRICS = ("max_allocated", "max_reserved", "device_used")
FIT_PATH = Path(__file__).resolve().parents[2] / "data" / "memory-fit.json"
PUBLIC_FRAGMENTATION = 0.05
"""GMLake (Guo et al., ASPLOS 2024, Fig. 2) measures 5-30 % fragmentation in LLM training: the low end."""
PUBLIC_CONTEXT_BYTES = 500 * 2**20
"""CUDA context and kernel images (NVIDIA CUDA C++ Programming Guide, "Initialization"; typically 300-600
MiB with the PyTorch kernels loaded)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryFit:
    """Fitted parameters: the allocator's reserve over allocated (``fragmentation``), nvidia-smi's memory
    beyond the allocator (``context_bytes`` per GPU architecture family, else ``default_context_bytes``),
    the upper-bound ratio per metric (upper = prediction x ratio), and the extra headroom (fraction of GPU
    memory) the planner keeps by default: the largest shortfall of a held-out row under its bound in the
    leave-one-source-out cross-validation."""

    fragmentation: float = PUBLIC_FRAGMENTATION
    context_bytes: dict[str, int] = field(default_factory=dict)
    default_context_bytes: int = PUBLIC_CONTEXT_BYTES
    activation_margin: dict[str, float] = field(default_factory=dict)
    default_activation_margin: float = 0.0
    fixed_margin_bytes: dict[str, int] = field(default_factory=dict)
    """The fixed part of each runtime's margin: what a prediction misses whatever the model's size (small
    persistent buffers, library state), which dominates below a few GiB."""
    default_fixed_margin_bytes: int = 0
    cached_fraction: float = 0.0
    headroom_fraction: float = 0.0
    rows: int = 0
    source: str = "public defaults (no fit shipped)"

    def context_of(self, family: str | None) -> int:
        return self.context_bytes.get(family or "", self.default_context_bytes)

    def margin_of(self, runtime: str) -> float:
        return self.activation_margin.get(runtime, self.default_activation_margin)

    def fixed_margin_of(self, runtime: str) -> int:
        return self.fixed_margin_bytes.get(runtime, self.default_fixed_margin_bytes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryFit:
        return cls(
            fragmentation=float(data["fragmentation"]),
            context_bytes={k: int(v) for k, v in data.get("context_bytes", {}).items()},
            default_context_bytes=int(data["default_context_bytes"]),
            activation_margin={k: float(v) for k, v in data.get("activation_margin", {}).items()},
            default_activation_margin=float(data.get("default_activation_margin", 0.0)),
            fixed_margin_bytes={k: int(v) for k, v in data.get("fixed_margin_bytes", {}).items()},
            default_fixed_margin_bytes=int(data.get("default_fixed_margin_bytes", 0)),
            cached_fraction=float(data.get("cached_fraction", 0.0)),
            headroom_fraction=float(data.get("headroom_fraction", 0.0)),
            rows=int(data.get("rows", 0)),
            source=str(data.get("source", "")),
        )


def load_fit(path: Path = FIT_PATH) -> MemoryFit:
    """The shipped fit, or the public defaults when no file is shipped."""
    if not path.exists():
        return MemoryFit()
    try:
        return MemoryFit.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (KeyError, ValueError, TypeError) as err:
        raise ValueError(f"{path}: not a memory fit ({err}); refit it with frenzy calibrate") from None


SHIPPED_FIT = load_fit()
