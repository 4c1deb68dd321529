"""Request and response models of the HTTP API (pydantic): contract 1 as JSON, every number bounded.

The bounds are wide enough for any real job (a million-token sequence, a million-sequence batch, 65,536-way
data parallelism) and small enough that no request can make the server allocate without limit: every
numeric input has one (an unbounded count once let a generated request grow a process to 24 GB). The
request model checks types and ranges; :func:`frenzy_opt.core.spec.parse_job` then checks the job's own rules
(divisibility, catalogue names) and its errors become 422 answers too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from frenzy_opt.core.spec import ATTENTIONS, OPTIMIZERS, PRECISIONS, PRIORITY_RANGE, RECOMPUTES, RUNTIMES

Precision = Literal[PRECISIONS]  # type: ignore[valid-type]
Optimizer = Literal[OPTIMIZERS]  # type: ignore[valid-type]
Runtime = Literal[RUNTIMES]  # type: ignore[valid-type]
Recompute = Literal[RECOMPUTES]  # type: ignore[valid-type]
Attention = Literal[ATTENTIONS]  # type: ignore[valid-type]

STATES = Literal["queued", "scheduled", "running", "succeeded", "failed", "cancelled"]
"""The values of :class:`frenzy_opt.core.enums.JobState`, spelled out so that it stays a type."""


class _Strict(BaseModel):
    """No unknown fields, no coercion (``true`` is not 1, ``"1.5"`` is not 1.5, ``0`` is not false; an int is
    a float) and no NaN or infinity, each refused with the field's location."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class ArchitectureIn(_Strict):
    """An inline architecture (contract 1)."""

    num_layers: int = Field(ge=1, le=1024)
    hidden_size: int = Field(ge=1, le=262_144)
    ffn_hidden_size: int = Field(ge=1, le=1_048_576)
    num_attention_heads: int = Field(ge=1, le=4096)
    num_kv_heads: int | None = Field(default=None, ge=1, le=4096)
    vocab_size: int = Field(ge=1, le=4_194_304)
    mlp: Literal["swiglu", "gelu"] = "swiglu"
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    tied_embeddings: bool = False
    num_experts: int = Field(default=1, ge=1, le=4096)
    moe_top_k: int = Field(default=1, ge=1, le=4096)
    moe_ffn_hidden_size: int | None = Field(default=None, ge=1, le=1_048_576)
    name: str | None = Field(default=None, max_length=200)
    head_dim: int | None = Field(default=None, ge=1, le=65_536)
    qkv_bias: bool = False
    linear_bias: bool = False
    position_embedding: Literal["rope", "learned"] = "rope"
    max_position_embeddings: int = Field(default=4096, ge=1, le=16_777_216)
    hidden_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    attention_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)


class TrainingIn(_Strict):
    seq_len: int = Field(default=2048, ge=1, le=1_048_576)
    micro_batch_size: int = Field(default=1, ge=1, le=65_536)
    pin_micro_batch: bool = False
    global_batch_size: int = Field(default=512, ge=1, le=16_777_216)
    train_steps: int = Field(default=1000, ge=1, le=100_000_000)
    precision: Precision = "bf16"
    optimizer: Optimizer = "adamw"
    memory_headroom: float | None = Field(default=None, ge=0.0, le=0.9)
    runtime: Runtime = "megatron"
    tp_comm_overlap: bool = False
    fp8_param_gather: bool | None = None
    loss_chunks: int | None = Field(default=None, ge=1, le=4096)


class ParallelIn(_Strict):
    """Optional pinned parallel fields; missing ones are searched."""

    dp: int | None = Field(default=None, ge=1, le=65_536)
    tp: int | None = Field(default=None, ge=1, le=1024)
    pp: int | None = Field(default=None, ge=1, le=1024)
    vpp: int | None = Field(default=None, ge=1, le=128)
    sequence_parallel: bool | None = None
    cp: int | None = Field(default=None, ge=1, le=1024)
    ep: int | None = Field(default=None, ge=1, le=4096)
    zero_stage: int | None = Field(default=None, ge=0, le=3)
    recompute: Recompute | None = None
    attention: Attention | None = None
    first_stage_layers: int | None = Field(default=None, ge=0, le=100_000)
    last_stage_layers: int | None = Field(default=None, ge=0, le=100_000)


class SchedulingIn(_Strict):
    """How the scheduler treats the job (contract 1's ``scheduling``;
    :class:`frenzy_opt.core.spec.SchedulingConfig`)."""

    priority: int = Field(default=0, ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1], description="priority class")
    max_gpus: int | None = Field(default=None, ge=1, le=1_048_576, description="at most this many GPUs")
    deadline_s: float | None = Field(default=None, gt=0, lt=1e9, description="finish within this many seconds")


class JobIn(_Strict):
    """A training job (contract 1). No hardware: the scheduler chooses it."""

    name: str | None = Field(default=None, max_length=200)
    model: Annotated[str, Field(min_length=1, max_length=200)] | ArchitectureIn = Field(
        description="a catalogue name (see `frenzy catalog models`) or an architecture"
    )
    training: TrainingIn = Field(default_factory=TrainingIn)
    parallel: ParallelIn | None = None
    scheduling: SchedulingIn | None = None
    weight: float = Field(default=1.0, gt=0, le=1000, description="priority weight in the scheduler's objective")
    max_retries: int = Field(
        default=2,
        ge=0,
        le=10,
        description="failed attempts retried; moves (preemption, a service restart) do not count",
    )

    @field_validator("model")
    @classmethod
    def _no_file_paths(cls, value: Any) -> Any:
        """A path to a Hugging Face config.json is the CLI's (``frenzy submit``/``plan`` read the file there and
        send the architecture): the service reads no files a request names."""
        if isinstance(value, str) and (value.endswith(".json") or "/" in value):
            raise ValueError(
                "model: a file path is read by the CLI, not the service; send a catalogue name or an inline "
                "architecture (frenzy submit JOB reads a config.json path and sends its architecture)"
            )
        return value

    def spec_mapping(self) -> dict[str, Any]:
        """The contract-1 mapping :func:`frenzy_opt.core.spec.parse_job` reads."""
        data: dict[str, Any] = {
            "model": self.model if isinstance(self.model, str) else self.model.model_dump(exclude_none=True),
            "training": self.training.model_dump(),
        }
        if self.name is not None:
            data["name"] = self.name
        if self.parallel is not None:
            pinned = self.parallel.model_dump(exclude_none=True)
            if pinned:
                data["parallel"] = pinned
        if self.scheduling is not None:
            data["scheduling"] = self.scheduling.model_dump(exclude_none=True)
        return data


class PlanOut(BaseModel):
    gpu_type: str
    num_gpus: int
    parallel: dict[str, Any]
    micro_batch_size: int
    precision: str
    peak_allocated_bytes: int
    device_used_bytes: int
    step_time_s: float | None
    step_time_p10_s: float | None = None
    step_time_p90_s: float | None = None
    est_runtime_s: float | None
    memory_risk: bool = False


class MicroBatchOut(BaseModel):
    """Whether the plans keep the spec's micro-batch (``training.pin_micro_batch``) or searched it."""

    pinned: bool
    searched: list[int]


class PlansOut(BaseModel):
    cluster: str
    num_plans: int
    min_gpus_per_type: dict[str, int]
    micro_batch: MicroBatchOut
    plans: list[PlanOut]


class EventOut(BaseModel):
    at: float
    state: str
    detail: str


class JobOut(BaseModel):
    id: str
    name: str
    tenant: str
    state: str
    reason: str
    attempts: int
    """Attempts launched, of any kind."""
    failures: int = 0
    """Attempts that failed on their own; the job fails for good past ``max_retries`` of them."""
    moves: int = 0
    """Attempts the scheduler stopped or lost (preempted, grown, lost to a restart of the service)."""
    max_retries: int
    created_at: float
    updated_at: float
    plan: dict[str, Any] | None = None
    placement: dict[str, Any] | None = None
    predicted: dict[str, Any] | None = None
    measured: dict[str, Any] | None = None
    progress: dict[str, Any] | None = None
    """The running attempt's latest worker report (step, loss, step time), while it runs."""
    queue_position: int | None = None
    """While queued: 1 for the job the next scheduling decision considers first."""
    estimated_start_in_s: float | None = None
    """While queued: seconds of cluster time (see ``time_scale``) until the GPUs it waits for are expected
    free, from the scheduler's reservation for it (the predicted ends of the jobs running and waiting ahead);
    null when not yet planned."""
    waiting_for: str | None = None
    """While queued: the GPUs it waits for (``<count> x <GPU type>``)."""
    history: list[EventOut] | None = None
    deadline_risk: bool | None = None
    """With ``scheduling.deadline_s``: whether the job's plan is predicted to end after its deadline (queued:
    the planned wait and run; placed: the placement's predicted end); null without a deadline or a plan."""
    deadline_missed_by_s: float | None = None
    """After it ended: cluster seconds past its deadline it ended (null: no deadline, or met)."""
    time_scale: float = 1.0
    """Cluster seconds per wall second (the simulated executor's ``--time-scale``; 1 on real GPUs): every
    duration the service answers is cluster time."""


class JobListOut(BaseModel):
    items: list[JobOut]
    total: int
    limit: int
    offset: int
    next_offset: int | None
