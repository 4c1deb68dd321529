"""Calibration profiles: step-time parameters fitted to one user's (or one cluster's) measured runs.

``frenzy calibrate FILE.csv --name NAME`` fits the step-time model to measured runs (the calibration CSV
format, or the launcher's JSON reports) starting from the shipped parameters and stores the result here as
``NAME.json``; ``frenzy plan|solve|simulate|serve --calibration NAME`` plan with it, and a service started
with ``--calibration NAME`` writes what its closed loop learns from finished runs back into the same profile.

Profiles live in one directory: ``$FRENZY_CALIBRATIONS`` when set, else ``~/.frenzy/calibrations``. A profile
is written to a temporary file and renamed into place (``os.replace`` is atomic on POSIX), so a reader never
sees half a file and a failed write leaves the old profile as it was.

A profile also holds measured layer times (``frenzy profile``, :func:`add_profiles`;
:mod:`frenzy_opt.prediction.profiles`), which the step-time model prices matching jobs from.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from frenzy_opt.prediction.profiles import LayerProfile, merge
from frenzy_opt.prediction.steptime import StepTimeModel, shipped_model

ENV_DIR = "FRENZY_CALIBRATIONS"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
RESERVED = ("memory", "steptime", "shipped")
"""Names ``frenzy calibrate`` gives the shipped fits (MARP's, the step-time model's) and the shipped model."""


def default_dir() -> Path:
    env = os.environ.get(ENV_DIR)
    return Path(env) if env else Path.home() / ".frenzy" / "calibrations"


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ValueError(
            f"calibration name {name!r} must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    if name in RESERVED:
        raise ValueError(f"calibration name {name!r} is reserved ({', '.join(RESERVED)}); choose another")
    return name


class CalibrationStore:
    """The profile directory (module docstring)."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else default_dir()

    def path(self, name: str) -> Path:
        return self.root / f"{check_name(name)}.json"

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.stem for p in self.root.glob("*.json") if NAME_PATTERN.match(p.stem))

    def read(self, name: str) -> dict[str, Any]:
        """The stored profile document; ``ValueError`` naming the known profiles when there is none."""
        path = self.path(name)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            known = ", ".join(self.names()) or "none yet (create one with frenzy calibrate FILE --name NAME)"
            raise ValueError(f"--calibration: no profile {name!r} in {self.root}; known: {known}") from None
        try:
            data = json.loads(text)
            StepTimeModel.from_dict(data["parameters"])
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"--calibration: profile {path} is not a valid calibration profile: {err}") from None
        return dict(data)

    def load(self, name: str) -> StepTimeModel:
        return StepTimeModel.from_dict(self.read(name)["parameters"])

    def save(self, name: str, model: StepTimeModel, **meta: Any) -> Path:
        """Write ``model`` as profile ``name`` (atomically), with ``meta`` (rows, errors, source)."""
        path = self.path(name)
        self.root.mkdir(parents=True, exist_ok=True)
        doc = {"name": name, "updated_unix_s": round(time.time(), 3), **meta, "parameters": model.to_dict()}
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(doc, handle, indent=2, sort_keys=True)
                handle.write("\n")
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def learn(self, name: str, model: StepTimeModel, report: dict[str, dict[str, Any]]) -> Path:
        """The closed loop's write: the refitted ``model`` and the per-key report merged into the profile's
        ``closed_loop`` history (a profile that does not exist yet starts from the shipped model's)."""
        try:
            doc = self.read(name)
        except ValueError:
            doc = {"source": "closed loop"}
        history = dict(doc.get("closed_loop") or {})
        history.update(report)
        meta = {k: v for k, v in doc.items() if k not in ("name", "updated_unix_s", "parameters", "closed_loop")}
        return self.save(name, model, **meta, closed_loop=history)


def add_profiles(store: CalibrationStore, name: str, profiles: Sequence[LayerProfile], source: str) -> Path:
    """Add measured layer ``profiles`` to calibration profile ``name`` (created from the shipped parameters when
    it does not exist); a point measured again replaces the old one."""
    try:
        doc = store.read(name)
        model = StepTimeModel.from_dict(doc["parameters"])
    except ValueError:
        if store.path(name).exists():
            raise  # a damaged profile is reported, not overwritten
        doc, model = {"source": source}, shipped_model()
    merged = replace(model, layer_profiles=merge(model.layer_profiles, tuple(profiles)))
    meta = {k: v for k, v in doc.items() if k not in ("name", "updated_unix_s", "parameters")}
    sources = list(meta.get("profile_sources") or [])
    if source not in sources:
        sources.append(source)
    meta["profile_sources"] = sources
    return store.save(name, merged, **meta)


def resolve_model(name: str | None, store: CalibrationStore | None = None) -> StepTimeModel:
    """The step-time model for ``--calibration name`` (the shipped one without a name)."""
    if not name:
        return shipped_model()
    return (store or CalibrationStore()).load(name)
