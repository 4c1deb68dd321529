"""What the verbs share: JSON or tables (``_emit``), number formats, the progress bar."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:  # the report pulls in matplotlib: imported when compare runs
    pass

GIB = 2**30
DEFAULT_REPORT = "benchmarks/results/compare.md"


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:,.2f}"


def _sig(value: float | None) -> str:
    """Three significant figures, or "-"."""
    return "-" if value is None else f"{value:.3g}"


def _seconds_text(value: float | None) -> str:
    """A duration in s, ms or µs (whichever puts it at or above 1), three significant figures; "-" if None."""
    if value is None:
        return "-"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-6:.3g} µs"


def _bytes_text(value: float | None) -> str:
    """Bytes in GiB, or MiB below 1 GiB, three significant figures; "-" if None."""
    if value is None:
        return "-"
    return f"{value / GIB:.3g} GiB" if value >= GIB else f"{value / 2**20:.3g} MiB"


def _emit(args: argparse.Namespace, payload: dict[str, Any], render: Callable[[Console], None]) -> None:
    if args.json:
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
    else:
        render(Console(width=160))
