"""What the simulator takes as real: the seconds a training step really takes, which the policies do not
know (``frenzy simulate --truth model|noisy|profiled``).

* ``model`` (:class:`~frenzy_opt.simulation.simulator.ModelTruth`): the step-time model's prediction, as before
  truths existed; no policy pays for prediction error.
* ``noisy`` (:class:`NoisyTruth`): the prediction times exp(r), r drawn from the step-time model's
  cross-validated log residuals log(measured / predicted) (leave one source out,
  :func:`frenzy_opt.prediction.steptime.cv_log_residuals`), by resampling them (the empirical distribution, bias
  included). One draw per (seed, job, GPU type): a job restarted on the same type runs at the same speed,
  and every GPU count of a type shares the job's error there.
* ``profiled`` (:class:`ProfiledTruth`): measured speeds of a real application from Sia's or Gavel's tables
  (:mod:`frenzy_opt.simulation.throughputs`). An LLM job is matched to one profiled application (default: Sia's
  ``bert``, the only transformer Sia profiled on every GPU type it has; Gavel's ``Transformer``) and *anchored* on one
  configuration, its user's request when profiled, else its profiled configuration with the fewest GPUs:
  there it runs at the predicted step time (the trace's GPU-time, :mod:`frenzy_opt.simulation.tracemap`), elsewhere at
  that times the application's measured time ratio between the two configurations (one batch each, of the
  largest batch the table measured for the application: 384 samples for Sia's bert, the regime of
  large-batch training with gradient accumulation; Gavel's time is linear in the batch, its size cancels).
  So the speeds across GPU types and counts are measured, not modelled. A configuration without a
  measurement (a GPU type the tables lack, a placement never profiled, out of memory), or a job with no
  profiled configuration at all, falls back to the model's prediction: counted per policy
  (``truth_fallback_runs``, ``truth_fallback_gpu_share``), never silent.

Issue 12 replays Sia's own workloads, whose jobs *are* profiled applications: the same table answers them
through :meth:`~frenzy_opt.simulation.throughputs.ProfileTable.batch_s` with the job's own application and batch size.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from frenzy_opt.hardware.placement import gpus_per_node
from frenzy_opt.planning.problem import Option
from frenzy_opt.simulation.simulator import ModelTruth, SimJob, Truth
from frenzy_opt.simulation.throughputs import ProfileTable, read_gavel_throughputs, read_sia_profiles

TRACES_ROOT = Path("../shared/traces")
"""Where the public tables live when present (relative to the working directory, the repository root)."""
SIA_TABLES = TRACES_ROOT / "sia-heterogeneous" / "traces"
GAVEL_TABLE = TRACES_ROOT / "gavel-throughputs" / "simulation_throughputs.json"
# Profiled application per table format for LLM jobs (module docstring).
DEFAULT_APPLICATION = {"sia": "bert", "gavel": "Transformer"}


class TruthKind(StrEnum):
    MODEL = "model"
    NOISY = "noisy"
    PROFILED = "profiled"


def _stable_hash(text: str) -> int:
    """A hash that is the same in every process (Python's ``hash`` of a str is salted per process)."""
    return zlib.crc32(text.encode("utf-8"))


def default_residuals() -> tuple[float, ...]:
    """The step-time model's cross-validated log residuals, from :mod:`frenzy_opt.prediction.steptime`."""
    from frenzy_opt.prediction import steptime

    # Looked up by name: the function is another module's (issue 11), which may not have landed yet.
    function = getattr(steptime, "cv_log_residuals", None)
    if function is None:
        raise ValueError(
            "--truth noisy: frenzy_opt.prediction.steptime.cv_log_residuals() does not exist in this checkout yet; "
            "the noisy truth resamples its residuals (use --truth model or profiled)"
        )
    residuals = tuple(float(r) for r in function())
    if not residuals or not all(math.isfinite(r) for r in residuals):
        raise ValueError("--truth noisy: cv_log_residuals() returned no finite residuals")
    return residuals


class NoisyTruth:
    """Predicted step time x exp(r), r resampled per (seed, job, GPU type) from ``residuals`` (module
    docstring); ``residuals`` None reads the step-time model's (:func:`default_residuals`) on first use."""

    name = "noisy"

    def __init__(self, seed: int = 0, residuals: Sequence[float] | None = None) -> None:
        self.seed = seed
        self._residuals = None if residuals is None else tuple(float(r) for r in residuals)
        if self._residuals is not None and not self._residuals:
            raise ValueError("noisy truth: residuals must not be empty")
        self._factors: dict[tuple[str, str], float] = {}

    @property
    def residuals(self) -> tuple[float, ...]:
        if self._residuals is None:
            self._residuals = default_residuals()
        return self._residuals

    def factor(self, job_id: str, gpu_type: str) -> float:
        """exp(r) of one job on one GPU type; the same for every call with the same seed."""
        key = (job_id, gpu_type)
        found = self._factors.get(key)
        if found is None:
            rng = np.random.default_rng([self.seed, _stable_hash(job_id), _stable_hash(gpu_type)])
            residuals = self.residuals
            found = self._factors[key] = math.exp(residuals[int(rng.integers(len(residuals)))])
        return found

    def step_s(self, job: SimJob, option: Option) -> float:
        return job.step_s(option) * self.factor(job.id, option.gpu_type)

    def falls_back(self, job: SimJob, option: Option) -> bool:
        return False


class ProfiledTruth:
    """Measured speed ratios of ``application`` from ``table``, anchored per job (module docstring). One
    instance per job set: anchors are kept by job id."""

    name = "profiled"

    def __init__(self, table: ProfileTable, application: str, batch_size: float | None = None) -> None:
        if application not in table.applications():
            raise ValueError(
                f"--profile-app: {application!r} is not in {table.source}; allowed: {', '.join(table.applications())}"
            )
        self.table, self.application = table, application
        self.batch_size = batch_size if batch_size is not None else table.largest_batch[application]
        self._anchors: dict[str, tuple[Option, float] | None] = {}

    def measured_s(self, option: Option) -> float | None:
        """The application's measured seconds per batch on the option's placement, or None."""
        return self.table.batch_s(self.application, option.gpu_type, gpus_per_node(option), self.batch_size)

    def anchor(self, job: SimJob) -> tuple[Option, float] | None:
        """The job's anchor option and its measured time: the request if profiled, else the profiled option
        with the fewest GPUs (then by GPU type name); None if no option of the job is profiled."""
        if job.id in self._anchors:
            return self._anchors[job.id]
        request = job.per_count.get((job.request.gpu_type, job.request.num_gpus))
        found = None
        candidates = ([request] if request is not None else []) + sorted(
            job.per_count.values(), key=lambda o: (o.num_gpus, o.gpu_type)
        )
        for option in candidates:
            measured = self.measured_s(option)
            if measured is not None and measured > 0:
                found = (option, measured)
                break
        self._anchors[job.id] = found
        return found

    def step_s(self, job: SimJob, option: Option) -> float:
        anchor = self.anchor(job)
        measured = self.measured_s(option)
        if anchor is None or measured is None:
            return job.step_s(option)
        anchor_option, anchor_s = anchor
        return job.step_s(anchor_option) * measured / anchor_s

    def falls_back(self, job: SimJob, option: Option) -> bool:
        return self.anchor(job) is None or self.measured_s(option) is None


def load_profiles(source: str) -> tuple[ProfileTable, str]:
    """``sia`` or ``gavel`` (the tables under ``../shared/traces``), a folder in Sia's format or a JSON
    file in Gavel's; returns the table and which format it is."""
    if source == "sia":
        return read_sia_profiles(SIA_TABLES), "sia"
    if source == "gavel":
        return read_gavel_throughputs(GAVEL_TABLE), "gavel"
    path = Path(source)
    if path.is_dir():
        return read_sia_profiles(path), "sia"
    if path.suffix == ".json":
        return read_gavel_throughputs(path), "gavel"
    raise ValueError(f"--profiles: {source!r} is neither sia, gavel, a folder of Sia tables nor a Gavel .json file")


def default_application(table: ProfileTable, profile_format: str) -> str:
    """The format's default application (:data:`DEFAULT_APPLICATION`) if the table has it, else the table's
    only application; ``ValueError`` lists them when neither applies."""
    apps = table.applications()
    wanted = DEFAULT_APPLICATION[profile_format]
    if wanted in apps or len(apps) != 1:
        return wanted  # ProfiledTruth names the choices if it is missing
    return apps[0]


def make_truth(
    kind: str,
    *,
    seed: int = 0,
    residuals: Sequence[float] | None = None,
    profiles: ProfileTable | None = None,
    profile_format: str = "sia",
    application: str | None = None,
) -> Truth:
    """A truth by name (:class:`TruthKind`); ``ValueError`` lists the names. ``profiles`` is required for
    ``profiled`` (:func:`load_profiles`)."""
    if kind == TruthKind.MODEL:
        return ModelTruth()
    if kind == TruthKind.NOISY:
        return NoisyTruth(seed=seed, residuals=residuals)
    if kind == TruthKind.PROFILED:
        if profiles is None:
            raise ValueError("--truth profiled needs profile tables (--profiles sia|gavel|PATH)")
        return ProfiledTruth(profiles, application or default_application(profiles, profile_format))
    raise ValueError(f"--truth: unknown {kind!r}; allowed: {', '.join(k.value for k in TruthKind)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class TruthSpec:
    """A truth to build once per seed (``frenzy simulate --truth … --seeds N``)."""

    kind: TruthKind = TruthKind.MODEL
    residuals: tuple[float, ...] | None = None
    """For ``noisy``: the log residuals to resample; None = the step-time model's."""
    profiles: ProfileTable | None = None
    profile_format: str = "sia"
    application: str | None = None

    def make(self, seed: int) -> Truth:
        return make_truth(
            self.kind,
            seed=seed,
            residuals=self.residuals,
            profiles=self.profiles,
            profile_format=self.profile_format,
            application=self.application,
        )

    def describe(self) -> dict[str, Any]:
        """The truth as the JSON output names it."""
        out: dict[str, Any] = {"kind": self.kind.value}
        if self.kind == TruthKind.NOISY:
            residuals = self.residuals if self.residuals is not None else default_residuals()
            out["num_residuals"] = len(residuals)
            out["residuals_source"] = (
                "given" if self.residuals is not None else "frenzy_opt.prediction.steptime.cv_log_residuals"
            )
        if self.kind == TruthKind.PROFILED and self.profiles is not None:
            truth = self.make(0)
            assert isinstance(truth, ProfiledTruth)
            out.update(profiles=self.profiles.source, application=truth.application, batch_size=truth.batch_size)
        return out


def truth_spec(
    kind: str, *, profiles: str = "sia", application: str | None = None, residuals: Sequence[float] | None = None
) -> TruthSpec:
    """The :class:`TruthSpec` of ``--truth KIND [--profiles SOURCE] [--profile-app APP]``, checked now (an
    unknown kind or application, missing tables or residuals raise ``ValueError`` before any simulation)."""
    try:
        chosen = TruthKind(kind)
    except ValueError:
        raise ValueError(f"--truth: unknown {kind!r}; allowed: {', '.join(k.value for k in TruthKind)}") from None
    table, fmt = load_profiles(profiles) if chosen == TruthKind.PROFILED else (None, "sia")
    spec = TruthSpec(
        kind=chosen,
        residuals=None if residuals is None else tuple(float(r) for r in residuals),
        profiles=table,
        profile_format=fmt,
        application=application,
    )
    spec.describe()  # builds the truth once: fails here, not after hours of simulation
    return spec
