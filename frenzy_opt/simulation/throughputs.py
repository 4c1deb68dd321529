"""Measured throughput tables of real training jobs: Sia's and Gavel's public profiles, read into one shape.

A :class:`ProfileTable` answers "how many seconds does one batch of application A take on this placement of
GPU type T", from measurements only (no model). The simulator's profiled truth (:mod:`frenzy_opt.simulation.truth`)
replays jobs at these speeds. The tables are read from ``../shared/traces`` where present; the project ships
none of them (Sia's artefact has no licence file). Tests use invented numbers in the same formats.

**Sia** (Jayaram Subramanya et al., SOSP 2023; artefact ``sia-simulator/traces/<application>/``):
``placements-<suffix>.csv`` (``placement``: one digit per node = GPUs on it; ``local_bsz``; ``step_time`` and
``sync_time`` in seconds; a missing ``local_bsz`` = out of memory) and ``scalability-<suffix>.csv``
(``num_nodes``, ``num_replicas`` instead of a placement). Suffix → GPU type (the artefact's README):
``aws`` T4, ``rtx`` RTX-2080Ti, ``dgx-ext`` A100-SXM4-40GB, ``azure`` V100-SXM2-32GB. ``quad`` (Quadro RTX
6000) is not in the GPU catalogue and ``dgx`` is the same A100 with fewer batch sizes than ``dgx-ext``:
both are not read. ``gpt_pmp`` (pipeline model parallel, another time formula in Sia) is not read either.
The time of one batch of ``B`` samples follows Sia's simulator (``applications.py``,
``get_throughput_with_accum``): ``local = ceil(B / replicas)``, ``accum = ceil(local / max_local) - 1``
gradient-accumulation steps, atomic batch ``ceil(local / (accum + 1))``, and
time = step_time + accum · (step_time − sync_time), with step and sync time interpolated linearly in
``local_bsz`` among the rows of the placement (Sia's ``interp1d``), or among the scalability rows of the same
(nodes, replicas) when the placement file lacks it. Beyond that Sia interpolates in three dimensions; we do
not: such a placement has no profile.

**Gavel** (Narayanan et al., OSDI 2020; ``simulation_throughputs.json``):
``{worker: {"('<family> (batch size <b>)', <gpus>)": {"null": <steps/s alone>}}}``, worker ``k80``,
``p100``, ``v100`` within one server and ``<worker>_unconsolidated`` across servers (used for a placement
over two or more whole servers with the same GPU count). Only ``v100`` has a
catalogue type; the table does not name its memory size, and we map it to V100-SXM2-16GB and
V100-SXM2-32GB (the same SXM2 chip and clocks; memory does not change the speed of a job that fits — an
assumption). Its ``steps/s`` for g GPUs are iterations of a ``b``-sample batch of the whole job (1 → 8 GPUs
scales 5-7x, so the batch is not per GPU); the time of a batch of ``B`` samples is B / (b · steps/s), taking
the family's best ``b``.
"""

from __future__ import annotations

import ast
import csv
import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# Sia artefact GPU suffix -> catalogue GPU type (sia-heterogeneous/README.md, from simulator_config.py).
SIA_GPU_TYPES: dict[str, str] = {
    "aws": "T4",
    "rtx": "RTX-2080Ti",
    "dgx-ext": "A100-SXM4-40GB",
    "azure": "V100-SXM2-32GB",
}
# Gavel worker type -> catalogue GPU types (module docstring: the memory size is our assumption).
GAVEL_GPU_TYPES: dict[str, tuple[str, ...]] = {"v100": ("V100-SXM2-16GB", "V100-SXM2-32GB")}

Placement = tuple[int, ...]
"""GPUs per node, in Sia's canonical order (the lexicographically smallest rotation)."""


def canonical(placement: Placement) -> Placement:
    """Sia's normal form of a placement: empty nodes dropped, the lexicographically smallest rotation."""
    kept = tuple(n for n in placement if n > 0)
    return min((kept[i:] + kept[:i] for i in range(len(kept))), default=())


@dataclass(frozen=True, slots=True, kw_only=True)
class SiaRow:
    local_bsz: float
    step_time_s: float
    sync_time_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Curve:
    """One measured placement: its rows by local batch size (Sia), or a best per-sample time (Gavel)."""

    rows: tuple[SiaRow, ...] = ()
    seconds_per_sample: float | None = None

    def batch_s(self, batch_size: float, replicas: int) -> float | None:
        """Seconds for one batch of ``batch_size`` samples (module docstring); None if out of the rows."""
        if self.seconds_per_sample is not None:
            return batch_size * self.seconds_per_sample
        max_local = max(r.local_bsz for r in self.rows)
        local = math.ceil(batch_size / replicas - 1e-8)
        accum = math.ceil(local / max_local - 1e-8) - 1
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        point = _interpolate(self.rows, atomic)
        if point is None:
            return None
        step, sync = point
        return step + accum * (step - sync)


def _interpolate(rows: tuple[SiaRow, ...], local_bsz: float) -> tuple[float, float] | None:
    """Step and sync time at ``local_bsz``, linear between the two nearest measured batch sizes."""
    ordered = sorted(rows, key=lambda r: r.local_bsz)
    for low, high in itertools.pairwise(ordered):
        if low.local_bsz <= local_bsz <= high.local_bsz:
            w = (local_bsz - low.local_bsz) / (high.local_bsz - low.local_bsz)
            return (
                low.step_time_s + w * (high.step_time_s - low.step_time_s),
                low.sync_time_s + w * (high.sync_time_s - low.sync_time_s),
            )
    exact = [r for r in ordered if r.local_bsz == local_bsz]
    return (exact[0].step_time_s, exact[0].sync_time_s) if exact else None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileTable:
    """Measured curves per (application, catalogue GPU type, placement); ``source`` names the files."""

    source: str
    curves: Mapping[tuple[str, str, Placement], Curve]
    by_size: Mapping[tuple[str, str, int, int], Curve]
    """Measurements per (application, GPU type, nodes, replicas) where no placement is given: Sia's
    scalability rows, and Gavel's multi-server ones with nodes 0 (any number of servers above one)."""
    largest_batch: Mapping[str, float]
    """Per application the largest batch (samples) measured: Sia's largest ``validation-<b>.csv``,
    Gavel's largest ``batch size`` of the family."""

    def applications(self) -> list[str]:
        return sorted({a for a, _, _ in self.curves} | {a for a, _, _, _ in self.by_size})

    def batch_s(self, application: str, gpu_type: str, placement: Placement, batch_size: float) -> float | None:
        """Seconds for one batch of ``batch_size`` samples of ``application`` on ``placement`` of
        ``gpu_type``, or None where nothing was measured."""
        placement = canonical(placement)
        curve = self.curves.get((application, gpu_type, placement))
        if curve is None:
            curve = self.by_size.get((application, gpu_type, len(placement), sum(placement)))
        if curve is None and len(placement) > 1:
            curve = self.by_size.get((application, gpu_type, 0, sum(placement)))
        return None if curve is None else curve.batch_s(batch_size, sum(placement))


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def _sia_rows(path: Path, key_of: str) -> dict[tuple[int, ...], list[SiaRow]]:
    """Rows of one Sia CSV grouped by placement (``key_of`` "placement") or (nodes, replicas)."""
    grouped: dict[tuple[int, ...], list[SiaRow]] = {}
    with path.open(newline="", encoding="utf-8") as handle:
        for i, row in enumerate(csv.DictReader(handle)):
            bsz, step, sync = (_float(row.get(c)) for c in ("local_bsz", "step_time", "sync_time"))
            if bsz is None or step is None or sync is None:
                continue  # out of memory (no local_bsz) or an incomplete measurement
            try:
                if key_of == "placement":
                    key: tuple[int, ...] = canonical(tuple(int(d) for d in row["placement"].strip()))
                else:
                    key = (int(row["num_nodes"]), int(row["num_replicas"]))
            except (KeyError, ValueError):
                raise ValueError(f"{path}: row {i + 2}: needs {key_of} columns as integers") from None
            grouped.setdefault(key, []).append(SiaRow(local_bsz=bsz, step_time_s=step, sync_time_s=sync))
    return grouped


def read_sia_profiles(root: str | Path) -> ProfileTable:
    """Sia's ``traces/`` folder (``<root>/<application>/placements-<suffix>.csv``, module docstring)."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"profiles: no such folder {root} (Sia's traces/<application>/ tables)")
    curves: dict[tuple[str, str, Placement], Curve] = {}
    by_size: dict[tuple[str, str, int, int], Curve] = {}
    largest: dict[str, float] = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name != "gpt_pmp"):
        validated = [_float(v.stem.removeprefix("validation-")) for v in folder.glob("validation-*.csv")]
        sizes = [b for b in validated if b is not None]
        if sizes:
            largest[folder.name] = max(sizes)
        for suffix, gpu_type in SIA_GPU_TYPES.items():
            placements = folder / f"placements-{suffix}.csv"
            if placements.is_file():
                for key, rows in _sia_rows(placements, "placement").items():
                    curves[(folder.name, gpu_type, key)] = Curve(rows=tuple(rows))
            scalability = folder / f"scalability-{suffix}.csv"
            if scalability.is_file():
                for (nodes, replicas), rows in _sia_rows(scalability, "size").items():
                    by_size[(folder.name, gpu_type, nodes, replicas)] = Curve(rows=tuple(rows))
    if not curves and not by_size:
        raise ValueError(f"profiles: {root} has no placements-<suffix>.csv of {', '.join(SIA_GPU_TYPES)}")
    apps = {a for a, _, _ in curves} | {a for a, _, _, _ in by_size}
    missing = sorted(apps - set(largest))
    if missing:
        raise ValueError(f"profiles: {root}: no validation-<batch size>.csv for {', '.join(missing)}")
    return ProfileTable(source=str(root), curves=curves, by_size=by_size, largest_batch=largest)


def _gavel_key(text: str, path: Path) -> tuple[str, int, int]:
    """``"('Transformer (batch size 64)', 4)"`` -> ("Transformer", 64, 4)."""
    try:
        name, gpus = ast.literal_eval(text)
        family, _, rest = str(name).partition(" (batch size ")
        return family, int(rest.rstrip(")")) if rest else 1, int(gpus)
    except (ValueError, SyntaxError, TypeError):
        raise ValueError(f"{path}: job type key {text!r} is not \"('<family> (batch size <b>)', <gpus>)\"") from None


def read_gavel_throughputs(path: str | Path) -> ProfileTable:
    """Gavel's throughput JSON (module docstring): per family, GPU type and placement the best seconds
    per sample over the family's batch sizes."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"profiles: no such file {path} (Gavel's simulation_throughputs.json)")
    data = json.loads(path.read_text(encoding="utf-8"))
    best: dict[tuple[str, str, Placement], float] = {}
    spread_best: dict[tuple[str, str, int, int], float] = {}
    largest: dict[str, float] = {}
    for worker, jobs in data.items():
        base, _, spread = str(worker).partition("_")
        for gpu_type in GAVEL_GPU_TYPES.get(base, ()):
            for key, entry in jobs.items():
                family, batch, gpus = _gavel_key(key, path)
                steps_per_s = entry.get("null") if isinstance(entry, dict) else None
                if not isinstance(steps_per_s, int | float) or steps_per_s <= 0:
                    continue
                per_sample = 1.0 / (batch * steps_per_s)
                largest[family] = max(largest.get(family, 0.0), float(batch))
                if spread == "unconsolidated":  # over several servers, how many the table does not say
                    if gpus > 1:
                        size_key = (family, gpu_type, 0, gpus)
                        spread_best[size_key] = min(spread_best.get(size_key, math.inf), per_sample)
                    continue
                k = (family, gpu_type, (gpus,))
                best[k] = min(best.get(k, math.inf), per_sample)
    if not best:
        raise ValueError(f"profiles: {path} has no throughput of {', '.join(GAVEL_GPU_TYPES)}")
    return ProfileTable(
        source=str(path),
        curves={k: Curve(seconds_per_sample=v) for k, v in best.items()},
        by_size={k: Curve(seconds_per_sample=v) for k, v in spread_best.items()},
        largest_batch=largest,
    )
