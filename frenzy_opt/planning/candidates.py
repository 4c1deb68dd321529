"""Candidates: the parallel layouts a job's plan search tries, before any memory or time is predicted.

A candidate fixes the full parallel config (dp, tp, pp, vpp, cp, ep, sequence parallelism, ZeRO stage,
recompute, attention kernel) and the micro-batch size. Fields the job pins are kept; the others are
searched. Validity is arithmetic (Megatron-LM's argument checks): tp divides the attention and kv heads and
the ffn width and fits in one node; pp x vpp <= layers with layers divisible by pp (and by pp x vpp when
interleaving, which also needs the micro-batch count divisible by pp); cp splits the sequence into 2 x cp
chunks; ep divides the experts and dp; dp x micro-batch divides the global batch. Recompute is part of the
search (less memory for more time, as in Lynx, Zhang et al. 2024).

Two dominance rules shrink the space without losing a useful plan, and are skipped for pinned fields:
sequence parallelism is on whenever tp > 1 (it divides activations by tp at the same communication volume,
Korthikanti et al. 2022, Sec. 4.2.2), and Megatron's distributed optimizer is on whenever dp > 1 (it
shards optimizer states at the all-reduce's volume, Megatron-LM docs "Distributed Optimizer");
:func:`dominated` lists what they set aside.

A GPU without bf16 (or fp8) tensor cores runs the job at the next format it has: bf16 -> fp16, fp8 ->
bf16 -> fp16, as users do on V100/T4-class GPUs (:func:`effective_precision`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from frenzy_opt.core.enums import Precision, Recompute
from frenzy_opt.core.partition import chunk_layer_counts, split_rule
from frenzy_opt.core.runtimes import capabilities
from frenzy_opt.core.spec import ZERO_STAGES_BY_RUNTIME, JobSpec, ParallelConfig
from frenzy_opt.hardware.gpus import GpuType
from frenzy_opt.prediction.marp.activations import activation_terms_for
from frenzy_opt.prediction.marp.layout import StateLayout, fp8_param_gather, state_layout_for
from frenzy_opt.prediction.marp.phases import param_terms
from frenzy_opt.prediction.marp.stages import in_flight_layer_microbatches
from frenzy_opt.prediction.stepeval import FLASH_ARCHITECTURES

MICRO_BATCH_CHOICES = (1, 2, 4, 8, 16)
RECOMPUTE_ORDER = ("none", "selective", "full")


def describe_layout(parallel: ParallelConfig, micro_batch_size: int) -> str:
    """ "dp8 tp4 pp2 vpp2 zero1 selective mb2": the fields of a layout that are not at their defaults."""
    p = parallel
    parts = [f"dp{p.dp}"] + [
        f"{k}{v}" for k, v in (("tp", p.tp), ("pp", p.pp), ("vpp", p.vpp), ("cp", p.cp), ("ep", p.ep)) if v > 1
    ]
    if p.sequence_parallel:
        parts.append("sp")
    parts += [f"zero{p.zero_stage}", f"recompute {p.recompute}", f"mb{micro_batch_size}"]
    return " ".join(parts)


def effective_precision(gpu: GpuType, precision: str) -> str:
    """The format the job runs at on ``gpu`` (see module docstring)."""
    if precision == Precision.FP8 and not gpu.supports("fp8"):
        precision = "bf16"
    if precision == Precision.BF16 and not gpu.supports("bf16"):
        precision = "fp16"
    return precision


@functools.cache
def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _choices(job: JobSpec, name: str, default: list[Any]) -> list[Any]:
    return [getattr(job.parallel, name)] if name in job.pinned else default


def _tp_choices(job: JobSpec, gpus_per_node: int) -> list[int]:
    arch = job.model
    ffn = arch.expert_ffn_size if arch.is_moe else arch.ffn_hidden_size
    valid = [
        tp
        for tp in divisors(gpus_per_node)
        if arch.num_attention_heads % tp == 0 and arch.num_kv_heads % tp == 0 and ffn % tp == 0
    ]
    return _choices(job, "tp", valid if capabilities(job.training.runtime).tp else [1])


def _shape_choices(job: JobSpec) -> Iterator[tuple[int, int, int]]:
    """(pp, vpp, cp) candidates, within what the job's runtime runs (:mod:`frenzy_opt.core.runtimes`)."""
    layers, seq = job.model.num_layers, job.training.seq_len
    caps = capabilities(job.training.runtime)
    pps = _choices(job, "pp", divisors(layers) if caps.pp else [1])
    cp_ok = [cp for cp in (1, 2, 4, 8) if cp == 1 or (seq % (2 * cp) == 0 and seq // cp >= 4096)]
    cps = _choices(job, "cp", cp_ok if caps.cp else [1])
    for pp, cp in itertools.product(pps, cps):
        vpps = [1] + ([2] if caps.vpp and pp > 1 and (layers // pp) % 2 == 0 and layers % pp == 0 else [])
        for vpp in _choices(job, "vpp", vpps):
            yield pp, vpp, cp


def _zero_choices(job: JobSpec, dp: int, cp: int = 1, *, tp: int = 1, pp: int = 1) -> list[int]:
    runtime = job.training.runtime
    default = {
        # Megatron's distributed optimizer shards over the data-parallel group with context parallelism.
        "megatron": [1] if dp * cp > 1 else [0],
        "deepspeed": [1, 2, 3] if dp > 1 else [0],
        "fsdp2": [3, 2],
        "hf": [0],
    }[runtime]
    offered = capabilities(runtime).zero_choices(tp=tp, pp=pp)
    # A pinned stage the runtime does not combine with this shape's tp or pp leaves the shape no plan.
    return [stage for stage in _choices(job, "zero_stage", default) if stage in offered]


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """A candidate without its data-parallel degree."""

    tp: int
    pp: int
    vpp: int
    cp: int
    micro_batch_size: int
    recompute: str
    sequence_parallel: bool

    @property
    def model_gpus(self) -> int:
        return self.tp * self.pp * self.cp


def micro_batch_choices(job: JobSpec) -> list[int]:
    """The micro-batch sizes the planner tries: the spec's alone when it pins it (``training.pin_micro_batch``),
    else every size of :data:`MICRO_BATCH_CHOICES` that divides the global batch."""
    t = job.training
    if "micro_batch_size" in job.pinned:
        return [t.micro_batch_size]
    return [m for m in MICRO_BATCH_CHOICES if t.global_batch_size % m == 0]


def micro_batch_summary(job: JobSpec) -> dict[str, Any]:
    """What ``frenzy plan`` and ``POST /v1/plans`` say about the micro-batch: ``pinned`` (the spec's size kept)
    and ``searched`` (the sizes tried)."""
    return {"pinned": "micro_batch_size" in job.pinned, "searched": micro_batch_choices(job)}


def shapes(job: JobSpec, gpus_per_node: int, max_gpus: int) -> Iterator[Shape]:
    t = job.training
    mbs = micro_batch_choices(job)
    caps = capabilities(t.runtime)
    recomputes = [mode for mode in RECOMPUTE_ORDER if mode in caps.recompute]
    for tp in _tp_choices(job, gpus_per_node):
        sp = (
            job.parallel.sequence_parallel
            if "sequence_parallel" in job.pinned
            else (tp > 1 and caps.sequence_parallel != "never")
        )
        for pp, vpp, cp in _shape_choices(job):
            if tp * pp * cp > max_gpus:
                continue
            for mb, recompute in itertools.product(mbs, _choices(job, "recompute", recomputes)):
                yield Shape(
                    tp=tp,
                    pp=pp,
                    vpp=vpp,
                    cp=cp,
                    micro_batch_size=mb,
                    recompute=recompute,
                    sequence_parallel=sp,
                )


def dp_choices(job: JobSpec, shape: Shape, max_gpus: int) -> list[int]:
    """Valid dp degrees, largest first: dp x micro-batch divides the global batch, the GPUs exist, and
    interleaving gets a micro-batch count divisible by pp."""
    gbs = job.training.global_batch_size
    valid = []
    for dp in _choices(job, "dp", divisors(gbs)):
        if gbs % (dp * shape.micro_batch_size) or dp * shape.model_gpus > max_gpus:
            continue
        if shape.vpp > 1 and job.training.num_micro_batches(dp, shape.micro_batch_size) % shape.pp:
            continue
        valid.append(dp)
    return sorted(valid, reverse=True)


def dp_choices_of(job: JobSpec, shapes: list[Shape], max_gpus: int) -> list[list[int]]:
    """:func:`dp_choices` of each of ``shapes``, worked out once per (micro-batch, model-parallel GPUs, pp, vpp):
    all it reads of a shape (not its tp split or its recompute mode). Shapes of one such kind share one list."""
    by_kind: dict[tuple[int, int, int, int], list[int]] = {}
    out = []
    for shape in shapes:
        kind = (shape.micro_batch_size, shape.model_gpus, shape.pp, shape.vpp)
        found = by_kind.get(kind)
        if found is None:
            found = by_kind[kind] = dp_choices(job, shape, max_gpus)
        out.append(found)
    return out


def configs_at(job: JobSpec, shape: Shape, dp: int) -> Iterator[ParallelConfig]:
    for ep, zero in layout_choices(job, shape, dp):
        yield config_of(job, shape, dp, ep, zero)


def layout_choices(job: JobSpec, shape: Shape, dp: int) -> list[tuple[int, int]]:
    """The (ep, ZeRO stage) pairs a shape takes at ``dp``, in the search's order."""
    arch = job.model
    eps = [ep for ep in divisors(arch.num_experts) if dp % ep == 0] if arch.is_moe else [1]
    if not capabilities(job.training.runtime).ep:
        eps = [1]
    zeros = _zero_choices(job, dp, shape.cp, tp=shape.tp, pp=shape.pp)
    return [(ep, zero) for ep, zero in itertools.product(_choices(job, "ep", eps), zeros) if dp % ep == 0]


def config_of(job: JobSpec, shape: Shape, dp: int, ep: int, zero: int) -> ParallelConfig:
    """The parallel config of a shape at ``dp`` with expert parallelism ``ep`` and ZeRO stage ``zero``."""
    return ParallelConfig(
        dp=dp,
        tp=shape.tp,
        pp=shape.pp,
        vpp=shape.vpp,
        cp=shape.cp,
        ep=ep,
        sequence_parallel=shape.sequence_parallel,
        zero_stage=zero,
        recompute=Recompute(shape.recompute),
        attention=job.parallel.attention,
        first_stage_layers=job.parallel.first_stage_layers if shape.pp == job.parallel.pp else None,
        last_stage_layers=job.parallel.last_stage_layers if shape.pp == job.parallel.pp else None,
    )


def dominated(job: JobSpec, parallel: ParallelConfig) -> list[ParallelConfig]:
    """The configurations the two dominance rules (module docstring) set aside in favour of ``parallel``,
    closest first: sequence parallelism off, the distributed optimizer off (ZeRO 0), both. Pinned fields
    stay as pinned."""
    flips: list[dict[str, Any]] = []
    sp_optional = capabilities(job.training.runtime).sequence_parallel == "optional"
    if parallel.sequence_parallel and parallel.tp > 1 and "sequence_parallel" not in job.pinned and sp_optional:
        flips.append({"sequence_parallel": False})
    zero_allowed = 0 in ZERO_STAGES_BY_RUNTIME[job.training.runtime]
    if parallel.zero_stage == 1 and parallel.dp > 1 and "zero_stage" not in job.pinned and zero_allowed:
        flips.append({"zero_stage": 0})
    if len(flips) == 2:
        flips.append({**flips[0], **flips[1]})
    return [replace(parallel, **flip) for flip in flips]


def attention_on(gpu: GpuType, job: JobSpec) -> str:
    """The attention kernel the job runs on ``gpu``: its own choice where FlashAttention runs (Ampere and
    later, :data:`frenzy_opt.prediction.stepeval.FLASH_ARCHITECTURES`), eager attention (its time and its ``b a s^2``
    scores in memory) on Volta and Turing."""
    return job.parallel.attention if gpu.architecture in FLASH_ARCHITECTURES else "eager"


def lower_bound(job: JobSpec, shape: Shape, dp: int) -> float:
    """Bytes no plan of this shape gets below on its first stage at ``dp`` (at the largest valid dp, below every
    plan of the shape): model states at ``dp``, sharded as far as any ZeRO stage and ep choice allows, plus the
    activations of the micro-batches in flight at that dp, plus the loss when the first stage is also the
    last."""
    return ShapeFloors(job).lower_bound(shape, dp)


def floor_ep(job: JobSpec, dp: int) -> int:
    """The ep :func:`lower_bound` takes at ``dp``: the largest that divides the experts and dp."""
    return max((e for e in divisors(job.model.num_experts) if dp % e == 0), default=1)


class ShapeFloors:
    """The memory floors of a job's shapes (:func:`lower_bound`), and the parts they share, each worked out
    once: the first stage's layers per (pp, vpp), the parameters per (tp, ep, pp, layers), the state layout
    per ZeRO stage with one data-parallel rank or more, the model states per (tp, ep, pp, layers, ZeRO stage,
    dp > 1, state shards), the micro-batches in flight per (pp, vpp, micro-batch count), the activations per
    (micro-batch, tp, cp, ep, sequence parallelism, recompute). A floor reads the model, the training config and
    the pinned stage split, not the GPU or its attention kernel (flash attention's activations bound any
    kernel's), so the searches of GPU groups with one training config may share one
    (:class:`frenzy_opt.planning.bestfirst.GroupBestFirst`).

    The *offered* floors (``offered=True`` in :meth:`of` and :meth:`at`) shard the states at the deepest ZeRO
    stage the search offers the shape at that dp (:func:`_zero_choices`: Megatron-core's default is its
    distributed optimizer alone, Megatron FSDP's stages 2 and 3 only when pinned) instead of the deepest the
    runtime implements: still below every candidate the search builds of the shape at that dp (only the stage
    changes, and a deeper stage shards more of the states, :func:`state_layout_for`), and far tighter where the
    runtime's deepest stage is not offered (llama3-70b at tp 1, pp 2, cp 2, dp 4: 79 GiB against its candidate's
    246 GiB of states at ZeRO 1). The best-first search refuses a shape's dp on them; the test of a whole shape
    stays :func:`lower_bound` at its largest dp, the full search's (it decides whether the shape's dp = 1, which
    the dp scan checks whatever the larger dps held, is searched at all), and
    :func:`frenzy_opt.planning.plans.enumerate_plans` reads only :func:`lower_bound` (its tally, the least bound
    and the closest refusal, reads every shape that passes)."""

    def __init__(self, job: JobSpec) -> None:
        self.job = job
        self.values: dict[Shape, dict[int, float]] = {}
        self.offered: dict[Shape, dict[int, float]] = {}
        self.eps: dict[int, int] = {}
        self._deepest = max(ZERO_STAGES_BY_RUNTIME[job.training.runtime])
        self._zeros: dict[tuple[int, int, int, int], int] = {}
        self._chunks: dict[tuple[int, int], tuple[tuple[int, ...], int]] = {}
        self._params: dict[tuple[int, int, int, int], tuple[float, float]] = {}
        self._layouts: dict[tuple[int, bool], StateLayout] = {}
        self._acts: dict[tuple[int, int, int, int, bool, str], tuple[float, float]] = {}
        self._states: dict[tuple[int, int, int, int, int, bool, int], float] = {}
        self._in_flight: dict[tuple[int, int, int], float] = {}

    def of(self, shape: Shape, *, offered: bool = False) -> dict[int, float]:
        """The shape's floors by dp worked out so far (:meth:`at` with the same ``offered`` adds to it)."""
        table = self.offered if offered else self.values
        values = table.get(shape)
        if values is None:
            values = table[shape] = {}
        return values

    def lower_bound(self, shape: Shape, dp: int) -> float:
        """:func:`lower_bound` of the shape at ``dp``, worked out once."""
        return self.at(shape, self.of(shape), dp)

    def at(self, shape: Shape, values: dict[int, float], dp: int, *, offered: bool = False) -> float:
        """:func:`lower_bound` of the shape at ``dp``, or (``offered``) its offered floor (class docstring), kept
        in ``values`` (the shape's :meth:`of` with the same ``offered``)."""
        value = values.get(dp)
        if value is None:
            value = values[dp] = self._value(shape, dp, self._zero_of(shape, dp) if offered else self._deepest)
        return value

    def _zero_of(self, shape: Shape, dp: int) -> int:
        """The deepest ZeRO stage the search offers the shape at ``dp`` (the runtime's deepest where it offers
        none: then the shape has no candidate there), per (tp, pp, cp, dp), all :func:`_zero_choices` reads of
        a shape."""
        zkey = (shape.tp, shape.pp, shape.cp, dp)
        zero = self._zeros.get(zkey)
        if zero is None:
            choices = _zero_choices(self.job, dp, shape.cp, tp=shape.tp, pp=shape.pp)
            zero = self._zeros[zkey] = max(choices, default=self._deepest)
        return zero

    def _value(self, shape: Shape, dp: int, zero: int) -> float:
        """:func:`lower_bound` of the shape at ``dp`` with the states sharded at ZeRO stage ``zero``, from the
        terms the shapes share (class docstring)."""
        ep = self.eps.get(dp)
        if ep is None:
            ep = self.eps[dp] = floor_ep(self.job, dp)
        pp, multi, shards = shape.pp, dp > 1, dp * shape.cp
        chunks, layers = self._chunks_of(shape)
        skey = (shape.tp, ep, pp, layers, zero, multi, shards)
        states = self._states.get(skey)
        if states is None:
            dense, expert = self._params_of(shape, ep, layers)
            layout = self._layout_of(zero, multi)
            states = self._states[skey] = dense * sum(layout.per_param(shards)) + expert * sum(
                layout.per_param(max(shards // ep, 1))
            )
        microbatches = self.job.training.num_micro_batches(dp, shape.micro_batch_size)
        fkey = (pp, shape.vpp, microbatches)
        in_flight = self._in_flight.get(fkey)
        if in_flight is None:
            in_flight = self._in_flight[fkey] = in_flight_layer_microbatches(chunks, 0, pp, microbatches)
        layer_activations, loss = self._acts_of(shape, ep)
        return states + in_flight * layers * layer_activations + (loss if pp == 1 else 0)

    def _params_of(self, shape: Shape, ep: int, layers: int) -> tuple[float, float]:
        """The first stage's dense and expert parameters, per (tp, ep, pp, layers)."""
        pkey = (shape.tp, ep, shape.pp, layers)
        params = self._params.get(pkey)
        if params is None:
            terms = param_terms(self.job.model, shape.tp, ep, shape.pp, layers, True, shape.pp == 1)
            params = self._params[pkey] = (terms.params - terms.expert_params, terms.expert_params)
        return params

    def _layout_of(self, zero: int, multi: bool) -> StateLayout:
        """The state layout at ZeRO stage ``zero``, with more than one data-parallel rank or one."""
        layout = self._layouts.get((zero, multi))
        if layout is None:
            training = self.job.training
            layout = self._layouts[(zero, multi)] = state_layout_for(
                training.runtime, training.precision, training.optimizer, zero, multi, fp8_param_gather(training, zero)
            )
        return layout

    def _acts_of(self, shape: Shape, ep: int) -> tuple[float, float]:
        """A layer's activations and the loss's (forward and backward), per (micro-batch, tp, cp, ep, sequence
        parallelism, recompute)."""
        akey = (shape.micro_batch_size, shape.tp, shape.cp, ep, shape.sequence_parallel, shape.recompute)
        acts = self._acts.get(akey)
        if acts is None:
            # Flash attention keeps the least of the two kernels, so its activations bound any attention choice.
            mb, sp = shape.micro_batch_size, shape.sequence_parallel
            a = activation_terms_for(self.job.model, self.job.training, micro_batch_size=mb, tp=shape.tp,
                                     cp=shape.cp, ep=ep, sp=sp, recompute=shape.recompute)  # fmt: skip
            acts = self._acts[akey] = (a.layer, a.loss + a.loss_backward)
        return acts

    def _chunks_of(self, shape: Shape) -> tuple[tuple[int, ...], int]:
        """The first stage's chunks' layers and their sum (the pinned split applies at the pinned pp)."""
        ckey = (shape.pp, shape.vpp)
        found = self._chunks.get(ckey)
        if found is None:
            arch, training, p = self.job.model, self.job.training, self.job.parallel
            split = (p.first_stage_layers, p.last_stage_layers) if shape.pp == p.pp else (None, None)
            rule = split_rule(training.runtime)
            chunks = chunk_layer_counts(arch.num_layers, shape.pp, shape.vpp, rule, *split)[:: shape.pp]
            found = self._chunks[ckey] = (chunks, sum(chunks))
        return found
