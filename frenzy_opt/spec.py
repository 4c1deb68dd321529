"""Job specs (contract 1): the training config and the parallel config, parsed and validated.

``dp``, ``tp``, ``pp``, ``vpp``, ``cp`` and ``ep`` are the data, tensor, pipeline, virtual-pipeline,
context and expert parallel degrees, defined once here. Every parse error is a ``ValueError`` naming the
field and, for enumerations, the allowed values.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from frenzy_opt.models.arch import ModelArch
from frenzy_opt.models.catalog import parse_model

PRECISIONS = ("bf16", "fp16", "fp32", "fp8")
OPTIMIZERS = ("adamw", "adam", "sgd", "adafactor")
RUNTIMES = ("megatron", "fsdp2", "deepspeed", "hf")
RECOMPUTES = ("none", "selective", "full")
ATTENTIONS = ("flash", "eager")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingConfig:
    """What to train: sequence length and batch in tokens/sequences, steps, number formats, runtime."""

    seq_len: int = 2048
    micro_batch_size: int = 1
    global_batch_size: int = 512
    train_steps: int = 1000
    precision: str = "bf16"
    optimizer: str = "adamw"
    runtime: str = "megatron"

    def __post_init__(self) -> None:
        for name in ("seq_len", "micro_batch_size", "global_batch_size", "train_steps"):
            _check_positive_int(f"training.{name}", getattr(self, name))
        _check_choice("training.precision", self.precision, PRECISIONS)
        _check_choice("training.optimizer", self.optimizer, OPTIMIZERS)
        _check_choice("training.runtime", self.runtime, RUNTIMES)
        if self.global_batch_size % self.micro_batch_size:
            raise ValueError(
                f"training.global_batch_size ({self.global_batch_size}) must be a multiple of "
                f"training.micro_batch_size ({self.micro_batch_size})"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelConfig:
    """How one job is split over GPUs. ``num_gpus = dp * tp * pp * cp`` (experts reuse dp ranks for ep)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    sequence_parallel: bool = False
    cp: int = 1
    ep: int = 1
    zero_stage: int = 0
    recompute: str = "none"
    attention: str = "flash"

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "vpp", "cp", "ep"):
            _check_positive_int(f"parallel.{name}", getattr(self, name))
        if self.zero_stage not in (0, 1, 2, 3) or isinstance(self.zero_stage, bool):
            raise ValueError(f"parallel.zero_stage must be one of 0, 1, 2, 3, got {self.zero_stage!r}")
        if not isinstance(self.sequence_parallel, bool):
            raise ValueError(f"parallel.sequence_parallel must be true or false, got {self.sequence_parallel!r}")
        _check_choice("parallel.recompute", self.recompute, RECOMPUTES)
        _check_choice("parallel.attention", self.attention, ATTENTIONS)
        if self.vpp > 1 and self.pp == 1:
            raise ValueError("parallel.vpp > 1 needs parallel.pp > 1 (interleaving splits pipeline stages)")
        if self.dp % self.ep:
            raise ValueError(f"parallel.ep ({self.ep}) must divide parallel.dp ({self.dp})")

    @property
    def num_gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


PARALLEL_FIELDS = tuple(f.name for f in fields(ParallelConfig))


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """A training job as a user submits it: no hardware named. ``pinned`` lists the parallel fields the
    user fixed; the planner searches the others."""

    name: str
    model: ModelArch
    training: TrainingConfig
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    pinned: frozenset[str] = frozenset()

    def to_mapping(self) -> dict[str, Any]:
        """The contract-1 mapping of this spec (:func:`parse_job` reads it back to an equal spec)."""
        data: dict[str, Any] = {
            "name": self.name,
            "model": {k: v for k, v in self.model.to_dict().items() if v is not None},
            "training": asdict(self.training),
        }
        if self.pinned:
            data["parallel"] = {k: getattr(self.parallel, k) for k in sorted(self.pinned)}
        return data

    def with_parallel(self, parallel: ParallelConfig, micro_batch_size: int | None = None) -> JobSpec:
        training = self.training
        if micro_batch_size is not None:
            training = replace(training, micro_batch_size=micro_batch_size)
        return replace(self, parallel=parallel, training=training)


def default_zero_stage(runtime: str, dp: int) -> int:
    """The ZeRO stage a runtime uses unless told otherwise: FSDP2 fully shards (3); Megatron's
    distributed optimizer and DeepSpeed's stage 1 shard optimizer states when data parallel; HF DDP none."""
    if runtime == "fsdp2":
        return 3
    if runtime == "hf":
        return 0
    return 1 if dp > 1 else 0


def _check_positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")


def _section(data: dict[str, Any], key: str, cls: type) -> dict[str, Any]:
    section = data.get(key) or {}
    if not isinstance(section, dict):
        raise ValueError(f"{key} must be a mapping, got {section!r}")
    allowed = {f.name for f in fields(cls)}
    unknown = sorted(set(section) - allowed)
    if unknown:
        raise ValueError(f"{key}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    return {k: v.lower() if isinstance(v, str) else v for k, v in section.items()}


def parse_job(data: dict[str, Any]) -> JobSpec:
    """A :class:`JobSpec` from a contract-1 mapping (already loaded from YAML or JSON)."""
    if not isinstance(data, dict):
        raise ValueError("job spec must be a mapping with keys name, model, training, parallel")
    allowed_top = {"name", "model", "training", "parallel", "id", "arrival_s", "weight"}
    unknown = sorted(set(data) - allowed_top)
    if unknown:
        raise ValueError(f"job spec: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed_top))}")
    if "model" not in data:
        raise ValueError("model is required: a catalogue name or an inline architecture mapping")
    model = parse_model(data["model"])
    training = TrainingConfig(**_section(data, "training", TrainingConfig))
    parallel_raw = _section(data, "parallel", ParallelConfig)
    dp = parallel_raw.get("dp", 1)
    defaults = {"zero_stage": default_zero_stage(training.runtime, dp if isinstance(dp, int) else 1)}
    parallel = ParallelConfig(**{**defaults, **parallel_raw})
    name = str(data.get("name") or f"{model.name}-job")
    return JobSpec(name=name, model=model, training=training, parallel=parallel, pinned=frozenset(parallel_raw))


def load_mapping(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON file into a mapping, with a clear error for a missing or malformed file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a mapping at the top level")
    return data


def load_job(path: str | Path) -> JobSpec:
    return parse_job(load_mapping(path))
