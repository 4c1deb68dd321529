"""Job specs (contract 1): the training config and the parallel config, parsed and validated.

``dp``, ``tp``, ``pp``, ``vpp``, ``cp`` and ``ep`` are the data, tensor, pipeline, virtual-pipeline,
context and expert parallel degrees, defined once here. Every parse error is a ``ValueError`` naming the
field and, for enumerations, the allowed values.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from frenzy_opt.core.enums import Precision, Recompute, Runtime
from frenzy_opt.core.runtime_profile import profile
from frenzy_opt.core.runtimes import default_sequence_parallel, runtime_refusal
from frenzy_opt.models.arch import ModelArch
from frenzy_opt.models.catalog import parse_model
from frenzy_opt.models.keys import unknown_keys_message
from frenzy_opt.yamlload import load_yaml

PRECISIONS = tuple(member.value for member in Precision)
OPTIMIZERS = ("adamw", "adam", "sgd", "adafactor")
RUNTIMES = tuple(member.value for member in Runtime)
RECOMPUTES = tuple(member.value for member in Recompute)
ZERO_STAGES_BY_RUNTIME = {runtime.value: runtime.zero_stages for runtime in Runtime}
"""ZeRO stages each runtime implements (:attr:`frenzy_opt.core.enums.Runtime.zero_stages`)."""
ATTENTIONS = ("flash", "eager")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingConfig:
    """What to train: sequence length and batch in tokens/sequences, steps, number formats, runtime."""

    seq_len: int = 2048
    """Tokens per sequence."""
    micro_batch_size: int = 1
    """Sequences per forward and backward pass on each data-parallel rank; the global batch must be a
    multiple of it. Unless ``pin_micro_batch`` is true the planner also tries the other sizes of
    :data:`frenzy_opt.planning.candidates.MICRO_BATCH_CHOICES` that divide the global batch, and each plan states
    the one it uses."""
    pin_micro_batch: bool = False
    """Keep ``micro_batch_size`` in every plan (a data loader or a convergence recipe fixes it); false: the
    planner searches it. ``frenzy plan`` says which."""
    global_batch_size: int = 512
    """Sequences per optimizer step, over all data-parallel ranks and micro-batches."""
    train_steps: int = 1000
    """Optimizer steps the job trains for: a plan's estimated runtime is its step time times this."""
    precision: Precision = Precision.BF16
    """Number format of the weights' compute and activations (mixed precision with fp32 master weights,
    except fp32). A GPU without tensor cores for it runs the next format it has (bf16 -> fp16, fp8 -> bf16
    -> fp16), and the plan says which."""
    optimizer: str = "adamw"
    """Optimizer, which sets the optimizer states MARP counts per parameter."""
    runtime: Runtime = Runtime.MEGATRON
    """Training framework the job runs on (Megatron-LM, PyTorch FSDP2, DeepSpeed, Hugging Face Trainer):
    it sets the memory layout MARP predicts, the ZeRO stages available and the step-time overlaps."""
    memory_headroom: float | None = None
    """Fraction of each GPU's memory the planner keeps free beyond MARP's upper bound (None: the shipped
    fit's default from cross-validation, :mod:`frenzy_opt.prediction.marp.fit`)."""
    tp_comm_overlap: bool = False
    """The runtime overlaps tensor-parallel collectives with the GEMMs they feed (Megatron's
    ``--tp-comm-overlap`` with Transformer Engine userbuffers, torchtitan's async TP)."""
    fp8_param_gather: bool | None = None
    """fp8 training gathers its parameters in fp8: on Megatron-core it keeps them in fp8 (``--fp8-param-
    gather``, NeMo's ``fp8_param_gather``: "reducing the all-gather overhead by half", NeMo docs,
    "Communication Overlap"; needs the distributed optimizer or Megatron FSDP, zero_stage >= 1); on fsdp2 it
    is torchao's float8 all-gather (torchtitan's ``float8.enable_fsdp_float8_all_gather``). None lets the
    planner choose: on wherever it applies, since it only saves memory and traffic."""
    loss_chunks: int | None = None
    """Chunks of the sequence the loss is computed in: torchtitan (fsdp2) wraps its loss in
    ``ChunkedLossWrapper`` (``torchtitan/components/loss.py``, ``num_chunks``, default 8), which runs the
    output layer and cross entropy one chunk at a time, so the full logits never exist. 1 = the loss on
    the full logits; null = the runtime's default (8 on fsdp2, 1 elsewhere). Only fsdp2 chunks its loss."""

    def __post_init__(self) -> None:
        for name in ("seq_len", "micro_batch_size", "global_batch_size", "train_steps"):
            _check_positive_int(f"training.{name}", getattr(self, name))
        _check_choice("training.precision", self.precision, PRECISIONS)
        _check_choice("training.optimizer", self.optimizer, OPTIMIZERS)
        _check_choice("training.runtime", self.runtime, RUNTIMES)
        object.__setattr__(self, "precision", Precision(self.precision))  # a plain string given: its member
        object.__setattr__(self, "runtime", Runtime(self.runtime))
        if self.loss_chunks is not None:
            _check_positive_int("training.loss_chunks", self.loss_chunks)
            if self.loss_chunks > 1 and not profile(self.runtime).chunked_loss:
                raise ValueError(
                    f"training.loss_chunks > 1 is torchtitan's chunked loss (runtime fsdp2); training.runtime "
                    f"is {self.runtime}, which computes the loss on the full logits (use 1 or null)"
                )
        check_headroom("training.memory_headroom", self.memory_headroom)
        if not isinstance(self.pin_micro_batch, bool):
            raise ValueError(f"training.pin_micro_batch must be true or false, got {self.pin_micro_batch!r}")
        if not isinstance(self.tp_comm_overlap, bool):
            raise ValueError(f"training.tp_comm_overlap must be true or false, got {self.tp_comm_overlap!r}")
        if self.fp8_param_gather is not None and not isinstance(self.fp8_param_gather, bool):
            raise ValueError(f"training.fp8_param_gather must be true, false or null, got {self.fp8_param_gather!r}")
        if self.global_batch_size % self.micro_batch_size:
            raise ValueError(
                f"training.global_batch_size ({self.global_batch_size}) must be a multiple of "
                f"training.micro_batch_size ({self.micro_batch_size})"
            )

    def num_micro_batches(self, dp: int, micro_batch_size: int | None = None) -> int:
        """Micro-batches per step on each data-parallel rank (gradient-accumulation steps),
        ``global_batch / (micro_batch x dp)`` and at least one; ``micro_batch_size`` defaults to the job's."""
        return max(self.global_batch_size // ((micro_batch_size or self.micro_batch_size) * dp), 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelConfig:
    """How one job is split over GPUs. ``num_gpus = dp * tp * pp * cp`` (experts reuse dp ranks for ep)."""

    dp: int = 1
    """Data-parallel degree: replicas of the model, each on its share of the global batch."""
    tp: int = 1
    """Tensor-parallel degree: each layer's matrices split over this many GPUs of one node."""
    pp: int = 1
    """Pipeline-parallel degree: the layers split into this many stages."""
    vpp: int = 1
    """Virtual pipeline stages per pipeline rank (interleaved 1F1B; needs pp > 1)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: norms and dropout split along the sequence over the tp ranks. The
    planner turns it on whenever tp > 1 unless the field is given."""
    cp: int = 1
    """Context-parallel degree: each sequence split over this many GPUs (ring attention)."""
    ep: int = 1
    """Expert-parallel degree: a mixture-of-experts model's experts split over this many data-parallel
    ranks (it divides dp and the number of experts)."""
    zero_stage: int = 0
    """ZeRO sharding over the data-parallel ranks: 1 optimizer states, 2 also gradients, 3 also parameters
    (0: none). The stages a runtime offers are listed under allowed values."""
    recompute: Recompute = Recompute.NONE
    """Activation recomputation in the backward pass: none, selective (the attention core, Korthikanti et
    al. 2022) or full (each layer's input kept, the layer run again)."""
    attention: str = "flash"
    """Attention kernel: flash (FlashAttention, no score matrix kept) or eager. GPUs before Ampere run
    eager whatever this says."""
    first_stage_layers: int | None = None
    """Megatron-core only: transformer layers on the first pipeline stage (``--decoder-first-pipeline-num-
    layers``); the stages without a fixed count share the rest evenly. None: the runtime's own split
    (:func:`frenzy_opt.core.partition.chunk_layer_counts`)."""
    last_stage_layers: int | None = None
    """Megatron-core only: transformer layers on the last pipeline stage (``--decoder-last-pipeline-num-
    layers``)."""

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "vpp", "cp", "ep"):
            _check_positive_int(f"parallel.{name}", getattr(self, name))
        if self.zero_stage not in (0, 1, 2, 3) or isinstance(self.zero_stage, bool):
            raise ValueError(f"parallel.zero_stage must be one of 0, 1, 2, 3, got {self.zero_stage!r}")
        if not isinstance(self.sequence_parallel, bool):
            raise ValueError(f"parallel.sequence_parallel must be true or false, got {self.sequence_parallel!r}")
        _check_choice("parallel.recompute", self.recompute, RECOMPUTES)
        object.__setattr__(self, "recompute", Recompute(self.recompute))
        _check_choice("parallel.attention", self.attention, ATTENTIONS)
        if self.vpp > 1 and self.pp == 1:
            raise ValueError("parallel.vpp > 1 needs parallel.pp > 1 (interleaving splits pipeline stages)")
        if self.dp % self.ep:
            raise ValueError(f"parallel.ep ({self.ep}) must divide parallel.dp ({self.dp})")
        for name in ("first_stage_layers", "last_stage_layers"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"parallel.{name} must be a non-negative integer or null, got {value!r}")
            if value is not None and self.pp < 2:
                raise ValueError(f"parallel.{name} needs parallel.pp >= 2")

    @property
    def num_gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def to_dict(self) -> dict[str, Any]:
        return plain(asdict(self))


PARALLEL_FIELDS = tuple(f.name for f in fields(ParallelConfig))
SPLIT_FIELDS = ("first_stage_layers", "last_stage_layers")
"""Parallel fields that refine the pipeline split rather than choose a layout: a job that pins every other
parallel field pins its whole layout."""

PRIORITY_RANGE = (-100, 100)


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulingConfig:
    """How the scheduler should treat the job (contract 1's optional ``scheduling`` section)."""

    priority: int = 0
    """Priority class: every queued job of a higher class is served before any of a lower one, and the HAS
    preempts only jobs of a lower or equal class (-100 … 100)."""
    max_gpus: int | None = None
    """At most this many GPUs (None: as many as the planner finds useful)."""
    deadline_s: float | None = None
    """Seconds after submission by which the job should have finished (None: no deadline)."""
    preemptible: bool = True
    """The scheduler may stop the running job to move, grow or shrink it (a checkpoint save and load each
    time); false: once started, it runs where it started until it ends (a failed node still restarts it)."""
    max_moves: int | None = None
    """At most this many moves (preemptions, growths, shrinks, migrations) over the job's life (None: the
    scheduler's own bound)."""

    def __post_init__(self) -> None:
        if not isinstance(self.preemptible, bool):
            raise ValueError(f"scheduling.preemptible must be true or false, got {self.preemptible!r}")
        if self.max_moves is not None and (
            isinstance(self.max_moves, bool) or not isinstance(self.max_moves, int) or self.max_moves < 0
        ):
            raise ValueError(f"scheduling.max_moves must be an integer >= 0, got {self.max_moves!r}")
        low, high = PRIORITY_RANGE
        if isinstance(self.priority, bool) or not isinstance(self.priority, int) or not low <= self.priority <= high:
            raise ValueError(f"scheduling.priority must be an integer in [{low}, {high}], got {self.priority!r}")
        if self.max_gpus is not None:
            _check_positive_int("scheduling.max_gpus", self.max_gpus)
        deadline = self.deadline_s
        if deadline is not None and (
            isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not 0 < deadline < 1e9
        ):
            raise ValueError(f"scheduling.deadline_s must be a number of seconds in (0, 1e9), got {deadline!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """A training job as a user submits it: no hardware named. ``pinned`` lists the parallel fields the
    user fixed; the planner searches the others."""

    name: str
    """The job's name (in tables, exports and the service's records)."""
    model: ModelArch
    """The model to train: a catalogue name (``frenzy catalog models``) or an inline architecture."""
    training: TrainingConfig
    """What to train and how: sequence, batch, steps, number format, optimizer, runtime."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Parallel fields the user fixes; the planner searches those left out."""
    pinned: frozenset[str] = frozenset()
    """The parallel fields the spec gave, and ``micro_batch_size`` when ``training.pin_micro_batch`` is true
    (not a file field: derived from the ``parallel`` section and that flag)."""
    scheduling: SchedulingConfig = field(default_factory=SchedulingConfig)
    """How the scheduler treats the job: priority class, GPU cap, deadline."""

    def to_mapping(self) -> dict[str, Any]:
        """The contract-1 mapping of this spec (:func:`parse_job` reads it back to an equal spec)."""
        data: dict[str, Any] = {
            "name": self.name,
            "model": {k: v for k, v in self.model.to_dict().items() if v is not None},
            "training": plain(asdict(self.training)) | {"pin_micro_batch": "micro_batch_size" in self.pinned},
        }
        pinned = {k: getattr(self.parallel, k) for k in sorted(self.pinned) if k in PARALLEL_FIELDS}
        if pinned:
            data["parallel"] = pinned
        if self.scheduling != SchedulingConfig():
            data["scheduling"] = {k: v for k, v in asdict(self.scheduling).items() if v is not None}
        return data

    def with_parallel(self, parallel: ParallelConfig, micro_batch_size: int | None = None) -> JobSpec:
        training = self.training
        if micro_batch_size is not None:
            training = replace(training, micro_batch_size=micro_batch_size)
        return replace(self, parallel=parallel, training=training)


def check_parallel(model: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> None:
    """``ValueError`` naming the field for a parallel config the runtimes refuse (Megatron-LM's argument
    checks, ``megatron/training/arguments.py``, and torchtitan's ``ParallelDims``): tp divides the attention
    heads, the kv heads and the (expert) ffn width; ep divides the experts; cp splits the sequence into
    ``2 cp`` equal chunks (load-balanced ring attention); pp x vpp <= layers; dp x micro-batch divides the
    global batch; interleaving needs a micro-batch count divisible by pp; the ZeRO stage exists for the
    runtime. The planner applies the same rules to the values it searches."""
    tp, arch = parallel.tp, model
    for what, size in (
        ("num_attention_heads", arch.num_attention_heads),
        ("num_kv_heads", arch.num_kv_heads),
        ("moe_ffn_hidden_size" if arch.is_moe else "ffn_hidden_size", arch.expert_ffn_size),
    ):
        if size % tp:
            raise ValueError(f"parallel.tp ({tp}) must divide model.{what} ({size})")
    if parallel.ep > 1 and not arch.is_moe:
        raise ValueError(f"parallel.ep ({parallel.ep}) needs a mixture-of-experts model (model.num_experts > 1)")
    if parallel.ep > 1 and arch.num_experts % parallel.ep:
        raise ValueError(f"parallel.ep ({parallel.ep}) must divide model.num_experts ({arch.num_experts})")
    if parallel.cp > 1 and training.seq_len % (2 * parallel.cp):
        raise ValueError(
            f"parallel.cp ({parallel.cp}) must split training.seq_len ({training.seq_len}) into 2 x cp equal chunks"
        )
    if parallel.pp * parallel.vpp > arch.num_layers:
        raise ValueError(
            f"parallel.pp x parallel.vpp ({parallel.pp * parallel.vpp}) must be <= model.num_layers ({arch.num_layers})"
        )
    if parallel.first_stage_layers is not None or parallel.last_stage_layers is not None:
        if not profile(training.runtime).uneven_pipeline_split:
            raise ValueError(
                "parallel.first_stage_layers / last_stage_layers are Megatron-core's uneven pipeline split; "
                f"training.runtime is {training.runtime}"
            )
        check_end_stages(arch.num_layers, parallel)
    per_step = parallel.dp * training.micro_batch_size
    if training.global_batch_size % per_step:
        raise ValueError(
            f"parallel.dp ({parallel.dp}) x training.micro_batch_size ({training.micro_batch_size}) must divide "
            f"training.global_batch_size ({training.global_batch_size})"
        )
    if parallel.vpp > 1 and (training.global_batch_size // per_step) % parallel.pp:
        raise ValueError(
            f"parallel.vpp > 1 needs the micro-batch count per step ({training.global_batch_size // per_step}) "
            f"to be a multiple of parallel.pp ({parallel.pp})"
        )
    check_zero_stage(training, parallel)
    check_runtime(training, parallel)


def check_runtime(training: TrainingConfig, parallel: ParallelConfig) -> None:
    """``ValueError`` naming the field and the runtime for a layout outside the runtime's row of
    :data:`frenzy_opt.core.runtimes.CAPABILITIES`."""
    p = parallel
    reason = runtime_refusal(
        training.runtime, tp=p.tp, pp=p.pp, vpp=p.vpp, cp=p.cp, ep=p.ep, sequence_parallel=p.sequence_parallel,
        zero_stage=p.zero_stage, recompute=p.recompute, precision=training.precision,
    )  # fmt: skip
    if reason is not None:
        raise ValueError(reason)


def check_end_stages(num_layers: int, parallel: ParallelConfig) -> None:
    """``ValueError`` unless Megatron-core accepts the uneven first / last pipeline stage
    (``get_num_layers_to_build``): the stages without a fixed count share the rest of the layers evenly,
    and every stage's layers split evenly over its ``vpp`` virtual stages."""
    first, last, pp, vpp = parallel.first_stage_layers, parallel.last_stage_layers, parallel.pp, parallel.vpp
    rest = num_layers - (first or 0) - (last or 0)
    middle = pp - (first is not None) - (last is not None)
    if rest < 0 or (middle == 0 and rest != 0) or (middle > 0 and rest % middle):
        raise ValueError(
            f"parallel.first_stage_layers ({first}) and last_stage_layers ({last}) must leave the other "
            f"{middle} pipeline stages an equal share of the model's {num_layers} layers"
        )
    for rank, layers in ((0, first), (pp - 1, last), (1, rest // middle if middle else None)):
        if layers is not None and layers % vpp:
            raise ValueError(
                f"pipeline stage {rank} holds {layers} layers, which its {vpp} virtual stages (parallel.vpp) "
                "cannot share evenly"
            )


def check_zero_stage(training: TrainingConfig, parallel: ParallelConfig) -> None:
    """``ValueError`` unless the runtime offers the ZeRO stage (:attr:`Runtime.zero_stages`)."""
    allowed = ZERO_STAGES_BY_RUNTIME[training.runtime]
    if parallel.zero_stage not in allowed:
        raise ValueError(
            f"parallel.zero_stage {parallel.zero_stage} is not available with training.runtime "
            f"{training.runtime}; allowed: {', '.join(map(str, allowed))}"
        )


def default_zero_stage(runtime: str, dp: int) -> int:
    """The ZeRO stage a runtime uses unless told otherwise (its profile's ``default_zero_stage``): FSDP2 fully
    shards (3, at dp 1 too); Megatron's distributed optimizer and DeepSpeed's stage 1 shard optimizer states
    when data parallel; HF DDP none."""
    row = profile(runtime)
    return row.default_zero_stage if dp > 1 or row.fully_shard else 0


def check_headroom(name: str, value: object) -> None:
    """A headroom is None or a fraction of GPU memory in [0, 0.9]."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 0.9:
        raise ValueError(f"{name} must be a fraction of GPU memory in [0, 0.9] or null, got {value!r}")


def _check_positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def plain(mapping: dict[str, Any]) -> dict[str, Any]:
    """``mapping`` with its enum members as their strings (what JSON, YAML and the store hold)."""
    return {k: v.value if isinstance(v, StrEnum) else v for k, v in mapping.items()}


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
        raise ValueError(unknown_keys_message(key, unknown, allowed))
    return {k: v.lower() if isinstance(v, str) else v for k, v in section.items()}


def parse_job(data: dict[str, Any]) -> JobSpec:
    """A :class:`JobSpec` from a contract-1 mapping (already loaded from YAML or JSON)."""
    if not isinstance(data, dict):
        raise ValueError("job spec must be a mapping with keys name, model, training, parallel")
    allowed_top = {"name", "model", "training", "parallel", "scheduling", "id", "arrival_s", "weight"}
    unknown = sorted(set(data) - allowed_top)
    if unknown:
        raise ValueError(unknown_keys_message("job spec", unknown, allowed_top))
    if "model" not in data:
        raise ValueError("model is required: a catalogue name or an inline architecture mapping")
    model = parse_model(data["model"])
    training = TrainingConfig(**_section(data, "training", TrainingConfig))
    parallel_raw = _section(data, "parallel", ParallelConfig)
    dp, tp = parallel_raw.get("dp", 1), parallel_raw.get("tp", 1)
    defaults = {
        "zero_stage": default_zero_stage(training.runtime, dp if isinstance(dp, int) else 1),
        "sequence_parallel": default_sequence_parallel(training.runtime, tp if isinstance(tp, int) else 1),
    }
    parallel = ParallelConfig(**{**defaults, **parallel_raw})
    check_parallel(model, training, parallel)
    name = str(data.get("name") or f"{model.name}-job")
    scheduling = SchedulingConfig(**_section(data, "scheduling", SchedulingConfig))
    return JobSpec(
        name=name,
        model=model,
        training=training,
        parallel=parallel,
        pinned=frozenset(parallel_raw) | ({"micro_batch_size"} if training.pin_micro_batch else set()),
        scheduling=scheduling,
    )


def load_mapping(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON file into a mapping, with a clear error for a missing or malformed file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else load_yaml(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a mapping at the top level")
    return data


def load_job(path: str | Path) -> JobSpec:
    """The job spec of a file; a relative ``model:`` path (a Hugging Face config.json) is read beside the file
    when it is there, else from the working directory."""
    data = load_mapping(path)
    model = data.get("model")
    beside = isinstance(model, str) and (model.endswith(".json") or "/" in model) and not Path(model).is_absolute()
    if beside and (Path(path).parent / str(model)).exists():
        data["model"] = str(Path(path).parent / str(model))
    return parse_job(data)


def plan_layout(data: dict[str, Any]) -> tuple[ParallelConfig, int]:
    """The parallel config and micro-batch size of a plan mapping: the shape of
    :meth:`frenzy_opt.planning.plans.Plan.to_dict` (the micro-batch size both at the top and inside
    ``parallel``), or only its ``parallel`` and ``micro_batch_size`` (what a run folder's ``plan.json`` held
    before it carried the whole plan, and what a hand-written placement file may give). Parallel fields left
    out take :class:`ParallelConfig`'s defaults; ``ValueError`` names a bad field."""
    raw = data.get("parallel")
    if not isinstance(raw, dict):
        raise ValueError(f"plan.parallel is required: a mapping of {', '.join(PARALLEL_FIELDS)}")
    given = dict(raw)
    inner = given.pop("micro_batch_size", None)
    unknown = sorted(set(given) - set(PARALLEL_FIELDS))
    if unknown:
        raise ValueError(f"plan.parallel: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(PARALLEL_FIELDS)}")
    micro = data.get("micro_batch_size", inner)
    if micro is None:
        raise ValueError("plan.micro_batch_size is required")
    if isinstance(micro, bool) or not isinstance(micro, int) or micro < 1:
        raise ValueError(f"plan.micro_batch_size must be a positive integer, got {micro!r}")
    if inner is not None and inner != micro:
        raise ValueError(f"plan.parallel.micro_batch_size ({inner!r}) differs from plan.micro_batch_size ({micro})")
    return ParallelConfig(**given), micro
