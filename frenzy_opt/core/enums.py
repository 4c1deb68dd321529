"""The closed sets of names the specs, the store and the solvers use. Each is a ``StrEnum`` whose values are
the strings of the job-spec contract (docs/DESIGN.md), so JSON, YAML and the store's rows hold plain strings."""

from __future__ import annotations

from enum import StrEnum


class Precision(StrEnum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    FP8 = "fp8"


class Runtime(StrEnum):
    MEGATRON = "megatron"
    FSDP2 = "fsdp2"
    DEEPSPEED = "deepspeed"
    HF = "hf"

    @property
    def zero_stages(self) -> tuple[int, ...]:
        """ZeRO stages this runtime implements: Megatron-core's distributed optimizer (1) and Megatron FSDP's
        ``optim_grads`` (2) and ``optim_grads_params`` (3); DeepSpeed ZeRO 1-3; FSDP2 ``fully_shard`` with
        ``reshard_after_forward`` False (2) or True (3); Hugging Face Trainer on DDP (0). The row of
        :data:`frenzy_opt.core.runtimes.CAPABILITIES`, the one table of what each runtime runs."""
        from frenzy_opt.core.runtimes import CAPABILITIES  # the table imports this module

        return CAPABILITIES[self].zero_stages


class Recompute(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class JobState(StrEnum):
    """A service job's state (:mod:`frenzy_opt.service.store`)."""

    QUEUED = "queued"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
ACTIVE_STATES = (JobState.QUEUED, JobState.SCHEDULED, JobState.RUNNING)


class SolverStatus(StrEnum):
    """How a solver's schedule stands (CP-SAT's names)."""

    OPTIMAL = "OPTIMAL"
    FEASIBLE = "FEASIBLE"
    INFEASIBLE = "INFEASIBLE"
    UNKNOWN = "UNKNOWN"
