"""What each runtime (training library) can run: the one table the planner searches within, the job-spec
parser checks pinned fields against, the training worker checks plans against and ``frenzy reference``
prints. How each runtime behaves (its memory layout, operators, overlaps) is its row of
:mod:`frenzy_opt.core.runtime_profile`, beside this one.

Each row states what the real library runs, with its source, restricted to what frenzy-opt models for it
(the memory layout of :mod:`frenzy_opt.prediction.marp.layout`, the step-time overlaps of
:mod:`frenzy_opt.prediction.steptime`):

* **megatron** (Megatron-LM / Megatron-core): tp with optional sequence parallelism (``--sequence-parallel``),
  pp with interleaving (``--num-layers-per-virtual-pipeline-stage``), cp (``--context-parallel-size``), ep
  (``--expert-model-parallel-size``), the distributed optimizer (ZeRO 1) and Megatron FSDP (ZeRO 2 and 3,
  ``--data-parallel-sharding-strategy``), ``--recompute-granularity selective|full`` and fp8 through Transformer
  Engine (``--fp8-format``); Megatron-LM ``megatron/training/arguments.py`` and the Megatron-core docs
  ("Parallelism guide", "Megatron FSDP").
* **fsdp2** (PyTorch FSDP2 as torchtitan runs it): ``fully_shard`` (ZeRO 3; ZeRO 2 with
  ``reshard_after_forward=False``), ``tensor_parallel_degree`` whose plan always shards the norms along the
  sequence (``SequenceParallel()`` on ``attention_norm``, ``ffn_norm`` and ``norm``,
  ``torchtitan/models/llama3/infra/parallelize.py``), ``pipeline_parallel_degree`` with interleaved schedules
  (``Interleaved1F1B``), ``context_parallel_degree``, ``expert_parallel_degree``, activation checkpointing
  ``mode = none|selective|full`` and torchao float8 (``converters = ["float8"]``);
  ``torchtitan/config/job_config.py``.
* **deepspeed** (the DeepSpeed engine): ZeRO 0-3; its pipeline engine (``PipelineModule``) runs 1F1B only
  (``deepspeed/runtime/pipe/schedule.py`` ``TrainSchedule``; no interleaving) and refuses ZeRO 2 and 3
  ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism", ``deepspeed/runtime/pipe/engine.py``);
  AutoTP training splits linears over tp with ZeRO 0, 1 or 2 and no sequence-parallel norms (DeepSpeed docs,
  "Automatic Tensor Parallelism (Training)"); DeepSpeed-MoE's expert parallelism (``deepspeed.moe.layer.MoE``,
  ``ep_size``); activation checkpointing re-runs whole layers (``deepspeed.checkpointing.checkpoint``, no
  selective granularity); fp8 through Transformer Engine modules (Hugging Face Accelerate docs, "Low precision
  training": fp8 with the DeepSpeed backend). DeepSpeed-Ulysses' all-to-all sequence parallelism is not
  modelled (frenzy's cp is ring attention), so cp is refused.
* **hf** (the Hugging Face Trainer on PyTorch DDP with ``torch.autocast``): data parallel only, no ZeRO,
  ``gradient_checkpointing`` re-runs whole decoder layers (Transformers docs, "Efficient training on a single
  GPU": gradient checkpointing), no fp8 (autocast runs 16-bit formats only).
"""

from __future__ import annotations

from dataclasses import dataclass

from frenzy_opt.core.enums import Precision, Recompute, Runtime

SP_MODES = ("never", "optional", "always")
"""How a runtime treats Megatron sequence parallelism when tp > 1: never runs it, lets the user choose, or
always runs it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeCapabilities:
    """What one runtime can run (a row of :data:`CAPABILITIES`). Degrees not listed run at 1."""

    description: str
    """The library, as the reference page and error messages name it."""
    tp: bool
    """Tensor parallelism (tp > 1)."""
    sequence_parallel: str
    """Megatron sequence parallelism with tp > 1: one of :data:`SP_MODES`."""
    pp: bool
    """Pipeline parallelism (pp > 1)."""
    vpp: bool
    """Interleaved pipeline schedules (vpp > 1)."""
    cp: bool
    """Context parallelism (cp > 1, ring attention)."""
    ep: bool
    """Expert parallelism (ep > 1)."""
    zero_stages: tuple[int, ...]
    """ZeRO stages offered (0: none, 1 optimizer states, 2 also gradients, 3 also parameters)."""
    recompute: tuple[Recompute, ...]
    """Activation recomputation modes offered."""
    fp8: bool
    """fp8 training (``training.precision: fp8``)."""
    max_zero_with_pp: int | None = None
    """Highest ZeRO stage the runtime combines with pp > 1 (None: any it offers)."""
    max_zero_with_tp: int | None = None
    """Highest ZeRO stage the runtime combines with tp > 1 (None: any it offers)."""

    def zero_choices(self, *, tp: int, pp: int) -> tuple[int, ...]:
        """The ZeRO stages this runtime runs at these tensor and pipeline degrees."""
        limit = 3
        if pp > 1 and self.max_zero_with_pp is not None:
            limit = min(limit, self.max_zero_with_pp)
        if tp > 1 and self.max_zero_with_tp is not None:
            limit = min(limit, self.max_zero_with_tp)
        return tuple(stage for stage in self.zero_stages if stage <= limit)


_ALL_RECOMPUTE = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
_WHOLE_LAYERS = (Recompute.NONE, Recompute.FULL)

CAPABILITIES: dict[Runtime, RuntimeCapabilities] = {
    Runtime.MEGATRON: RuntimeCapabilities(
        description="Megatron-LM / Megatron-core",
        tp=True,
        sequence_parallel="optional",
        pp=True,
        vpp=True,
        cp=True,
        ep=True,
        zero_stages=(0, 1, 2, 3),
        recompute=_ALL_RECOMPUTE,
        fp8=True,
    ),
    Runtime.FSDP2: RuntimeCapabilities(
        description="PyTorch FSDP2 as torchtitan runs it",
        tp=True,
        sequence_parallel="always",
        pp=True,
        vpp=True,
        cp=True,
        ep=True,
        zero_stages=(2, 3),
        recompute=_ALL_RECOMPUTE,
        fp8=True,
    ),
    Runtime.DEEPSPEED: RuntimeCapabilities(
        description="DeepSpeed: ZeRO, pipeline engine, AutoTP training",
        tp=True,
        sequence_parallel="never",
        pp=True,
        vpp=False,
        cp=False,
        ep=True,
        zero_stages=(0, 1, 2, 3),
        recompute=_WHOLE_LAYERS,
        fp8=True,
        max_zero_with_pp=1,
        max_zero_with_tp=2,
    ),
    Runtime.HF: RuntimeCapabilities(
        description="Hugging Face Trainer on DDP with autocast",
        tp=False,
        sequence_parallel="never",
        pp=False,
        vpp=False,
        cp=False,
        ep=False,
        zero_stages=(0,),
        recompute=_WHOLE_LAYERS,
        fp8=False,
    ),
}
"""The capability table, one row per :class:`Runtime` (sources in the module docstring)."""

WORKER = RuntimeCapabilities(
    description="frenzy's training worker, frenzy_opt.launch.worker.train",
    tp=True,
    sequence_parallel="optional",
    pp=True,
    vpp=True,
    cp=False,
    ep=False,
    zero_stages=(0, 1, 2, 3),
    recompute=_ALL_RECOMPUTE,
    fp8=False,
)
"""What the worker implements whatever the job's runtime (the reference decoder in PyTorch: DTensor tp,
``torch.distributed.pipelining``, DDP / ZeroRedundancyOptimizer / FSDP2; :mod:`frenzy_opt.launch.worker.train`); it
runs a plan only where both its runtime's row and this one allow it. fp8 jobs run at 16 bits there."""


def capabilities(runtime: str) -> RuntimeCapabilities:
    """The row of ``runtime`` (a :class:`Runtime` value); ``ValueError`` lists the runtimes."""
    try:
        return CAPABILITIES[Runtime(runtime)]
    except ValueError:
        raise ValueError(f"training.runtime must be one of {', '.join(Runtime)}, got {runtime!r}") from None


def default_sequence_parallel(runtime: str, tp: int) -> bool:
    """Sequence parallelism when the spec leaves it out: on with tp > 1 where the runtime always runs it."""
    return tp > 1 and capabilities(runtime).sequence_parallel == "always"


def runtime_refusal(
    runtime: str,
    *,
    tp: int = 1,
    pp: int = 1,
    vpp: int = 1,
    cp: int = 1,
    ep: int = 1,
    sequence_parallel: bool = False,
    zero_stage: int | None = None,
    recompute: str = "none",
    precision: str = "bf16",
) -> str | None:
    """Why ``runtime`` cannot run this layout (a sentence naming the field, the runtime and the allowed
    values), or None when it can."""
    caps = capabilities(runtime)
    who = f"training.runtime {runtime} ({caps.description})"
    for name, value, offered in (("tp", tp, caps.tp), ("pp", pp, caps.pp), ("vpp", vpp, caps.vpp),
                                 ("cp", cp, caps.cp), ("ep", ep, caps.ep)):  # fmt: skip
        if value > 1 and not offered:
            return f"parallel.{name} {value} is not available with {who}; allowed: 1"
    if tp > 1 and sequence_parallel != (caps.sequence_parallel != "never") and caps.sequence_parallel != "optional":
        return (
            f"parallel.sequence_parallel {str(sequence_parallel).lower()} with tp {tp} is not available with {who}, "
            f"which {caps.sequence_parallel} runs it; allowed: {str(caps.sequence_parallel == 'always').lower()}"
        )
    if zero_stage is not None:
        allowed = caps.zero_choices(tp=tp, pp=pp)
        if zero_stage not in allowed:
            at = "".join(f" with {k} {v}" for k, v in (("tp", tp), ("pp", pp)) if v > 1)
            return (
                f"parallel.zero_stage {zero_stage} is not available with {who}{at}; "
                f"allowed: {', '.join(map(str, allowed))}"
            )
    if recompute not in caps.recompute:
        return f"parallel.recompute {recompute} is not available with {who}; allowed: {', '.join(caps.recompute)}"
    if precision == Precision.FP8 and not caps.fp8:
        others = ", ".join(p for p in Precision if p != Precision.FP8)
        return f"training.precision fp8 is not available with {who}; allowed: {others}"
    return None


def capability_table() -> list[tuple[str, ...]]:
    """The table as rows of cells, a header first (``frenzy reference``), the worker's row last."""
    header = ("runtime", "tp", "sequence_parallel", "pp", "vpp", "cp", "ep", "zero_stage", "recompute", "fp8")
    rows: list[tuple[str, ...]] = [header]
    for name, caps in [*((r.value, c) for r, c in CAPABILITIES.items()), ("worker", WORKER)]:
        degrees = ["yes" if flag else "1 only" for flag in (caps.tp, caps.pp, caps.vpp, caps.cp, caps.ep)]
        limits = [f"≤ {v} with {k} > 1" for k, v in (("pp", caps.max_zero_with_pp), ("tp", caps.max_zero_with_tp)) if v]
        zero = ", ".join(map(str, caps.zero_stages)) + (f" ({'; '.join(limits)})" if limits else "")
        sp = caps.sequence_parallel if caps.tp else "—"
        recompute = ", ".join(caps.recompute)
        rows.append(
            (f"{name} ({caps.description})", degrees[0], sp, *degrees[1:], zero, recompute, "yes" if caps.fp8 else "no")
        )
    return rows
