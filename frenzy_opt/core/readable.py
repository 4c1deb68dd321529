"""How durations and sizes read in the answers people see (CLI, service reasons, dashboard)."""

from __future__ import annotations

from typing import Any

GIB = 2**30


def human_duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3.4 h``, ``2.1 d``."""
    seconds = max(seconds, 0.0)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def gib(num_bytes: float) -> str:
    """Bytes as GiB with one decimal (``35.2 GiB``)."""
    return f"{num_bytes / GIB:.1f} GiB"


def parallel_text(parallel: dict[str, Any]) -> str:
    """A plan's layout as ``frenzy plan`` prints it (``dp4 tp2 pp2 zero1 sp recompute=selective``)."""
    parts = [f"dp{parallel['dp']} tp{parallel['tp']} pp{parallel['pp']}"]
    for key in ("vpp", "cp", "ep"):
        if parallel.get(key, 1) > 1:
            parts.append(f"{key}{parallel[key]}")
    parts.append(f"zero{parallel['zero_stage']}")
    if parallel.get("sequence_parallel"):
        parts.append("sp")
    if parallel.get("recompute", "none") != "none":
        parts.append(f"recompute={parallel['recompute']}")
    return " ".join(parts)
