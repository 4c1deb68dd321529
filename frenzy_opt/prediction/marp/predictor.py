"""MARP: per-stage peak memory of one training step, as named components and three totals.

For each pipeline stage the step passes through three phases whose live memory we sum from named
components (bytes, one rank):

* ``loss_backward`` (last stage): model states + every in-flight micro-batch's activations + the loss's
  kept tensors + the fp32 gradients of log-probabilities and logits;
* ``block_backward``: model states + activations + the gradients alive inside one block's backward
  (plus the block being recomputed under full recompute, gathered ZeRO-3/FSDP weights and gradients);
* ``optimizer_step``: model states + the optimizer's temporaries.

``peak_allocated_bytes`` is the largest phase plus the GEMM libraries' workspaces (what
``torch.cuda.max_memory_allocated`` reports). ``peak_reserved_bytes`` adds the caching allocator's
fitted fragmentation and ``device_used_bytes`` the CUDA context and NCCL's buffers per communicator (what
nvidia-smi shows); the CUDA-only terms can be switched off, as the CPU validation does. The upper bound
that admission uses is built of parts in :mod:`frenzy_opt.prediction.marp.bound` (:func:`stage_bound`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

from frenzy_opt.core.partition import chunk_layer_counts, split_rule
from frenzy_opt.core.runtime_profile import profile
from frenzy_opt.core.spec import JobSpec, ParallelConfig, TrainingConfig
from frenzy_opt.hardware.gpus import GpuType
from frenzy_opt.models.arch import ModelArch, layer_weight_shapes, shard_param_counts
from frenzy_opt.prediction.marp import activations as act
from frenzy_opt.prediction.marp import bound
from frenzy_opt.prediction.marp.fit import SHIPPED_FIT, MemoryFit
from frenzy_opt.prediction.marp.layout import StateLayout, state_layout
from frenzy_opt.prediction.marp.stages import in_flight_layer_microbatches

MIB = 2**20


@dataclass(frozen=True, slots=True, kw_only=True)
class CudaTerms:
    """CUDA-only memory outside tensors. Defaults are public figures, calibratable from GPU runs."""

    fragmentation: float = 0.05
    """Reserved/allocated - 1 of the point prediction. The caching allocator rounds blocks to 2 MiB and
    splits them (PyTorch docs, "CUDA memory management"); GMLake (Guo et al., ASPLOS 2024, Fig. 2) measures
    5-30 % fragmentation in LLM training, the low end for static-shape training without offload."""
    context_bytes: int = 500 * MIB
    """CUDA context and kernel images, created at the first CUDA call (NVIDIA CUDA C++ Programming Guide,
    "Initialization"; typically 300-600 MiB with the PyTorch kernels loaded)."""
    workspaces: bool = True
    """Count the GEMM libraries' workspaces in the allocated peak (:func:`bound.library_workspace_bytes`)."""
    nccl: bool = True
    """Count NCCL's buffers per communicator (:func:`bound.nccl_buffer_bytes`)."""


def cuda_terms_of(fit: MemoryFit, family: str | None = None) -> CudaTerms:
    """The CUDA-only terms of a fit: its fragmentation and its CUDA context (what nvidia-smi shows beyond
    the allocator and NCCL). Public defaults when nothing was fitted."""
    if not fit.rows:
        return CudaTerms()
    return CudaTerms(fragmentation=fit.fragmentation, context_bytes=fit.context_of(family))


DEFAULT_CUDA = cuda_terms_of(SHIPPED_FIT)
TE_SCALING_STATE_BYTES_PER_LAYER = 4 * 5 * 1024 * 4
"""Transformer Engine's delayed-scaling state per transformer layer, counted with the fp8 weight cache: each
of its 4 GEMM modules (QKV, attention output, fc1, fc2) keeps an fp32 amax history of ``amax_history_len``
entries (``DelayedScaling`` default 1024) for its 3 forward (input, weight, output) and 2 backward (grad output,
grad input) fp8 tensors (TE docs, "Using FP8 with Transformer Engine", ``fp8_meta``): 80 KiB a layer, 10 MiB
for 126 layers. Current (per-tensor) scaling keeps no history; the bound counts the delayed recipe."""
STATE_COMPONENTS = ("weights", "grads", "master_weights", "optimizer_states", "weight_cache")


@dataclass(frozen=True, slots=True, kw_only=True)
class StagePrediction:
    stage: int
    num_layers: int
    num_params: int
    peak_phase: str
    breakdown: dict[str, int]
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    device_used_bytes: int
    peak_allocated_upper_bytes: int = 0
    peak_reserved_upper_bytes: int = 0
    device_used_upper_bytes: int = 0
    """Upper bounds of the three totals (:class:`bound.MemoryBound`), from the fitted margins
    (:mod:`frenzy_opt.prediction.marp.fit`; ``frenzy validate memory`` cross-validates them)."""
    required_upper_bytes: int = 0
    """What must fit the GPU (:attr:`bound.MemoryBound.required`): the planner's test."""
    bound: dict[str, int] = field(default_factory=dict)
    """The bound's named rows (:data:`bound.REQUIRED_ROWS` and ``cached_reserve``)."""

    def to_dict(self) -> dict[str, object]:
        return {
            "stage": self.stage,
            "num_layers": self.num_layers,
            "num_params": self.num_params,
            "peak_phase": self.peak_phase,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "device_used_bytes": self.device_used_bytes,
            "peak_allocated_upper_bytes": self.peak_allocated_upper_bytes,
            "peak_reserved_upper_bytes": self.peak_reserved_upper_bytes,
            "device_used_upper_bytes": self.device_used_upper_bytes,
            "required_upper_bytes": self.required_upper_bytes,
            "breakdown": dict(self.breakdown),
            "bound": dict(self.bound),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryPrediction:
    stages: tuple[StagePrediction, ...]
    capacity_bytes: int | None = None
    gpu_type: str | None = None
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    @property
    def peak_allocated_bytes(self) -> int:
        return max(s.peak_allocated_bytes for s in self.stages)

    @property
    def peak_reserved_bytes(self) -> int:
        return max(s.peak_reserved_bytes for s in self.stages)

    @property
    def device_used_bytes(self) -> int:
        return max(s.device_used_bytes for s in self.stages)

    @property
    def peak_allocated_upper_bytes(self) -> int:
        return max(s.peak_allocated_upper_bytes for s in self.stages)

    @property
    def peak_reserved_upper_bytes(self) -> int:
        return max(s.peak_reserved_upper_bytes for s in self.stages)

    @property
    def device_used_upper_bytes(self) -> int:
        return max(s.device_used_upper_bytes for s in self.stages)

    @property
    def required_upper_bytes(self) -> int:
        return max(s.required_upper_bytes for s in self.stages)

    @property
    def fits(self) -> bool | None:
        """Whether every stage's nvidia-smi footprint fits the GPU (None without a GPU)."""
        return None if self.capacity_bytes is None else self.device_used_bytes <= self.capacity_bytes

    @property
    def fits_upper(self) -> bool | None:
        """Whether every stage's required bound fits the GPU (the planner's test, without headroom)."""
        return None if self.capacity_bytes is None else self.required_upper_bytes <= self.capacity_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamTerms:
    """Parameter counts one pipeline rank holds (after tp/ep partitioning)."""

    params: int
    embedding_params: int
    output_params: int
    """The output layer's weight on the last stage (``ceil(V / tp) x h``, tied or not: its weight gradient
    is made there either way); 0 elsewhere."""
    layer_params: int
    expert_params: int
    """The part of ``params`` in expert MLPs (sharded over dp x cp / ep by ZeRO/FSDP, see ``StageModel``)."""
    largest_layer_param: int
    adafactor_state_bytes: int
    """fp32 bytes of Adafactor's factored second moments on this rank's blocks (Shazeer & Stern 2018,
    Alg. 4: row and column factors per matrix, a full moment per vector)."""


@functools.lru_cache(maxsize=65536)
def param_terms(arch: ModelArch, tp: int, ep: int, pp: int, num_layers: int, first: bool, last: bool) -> ParamTerms:
    counts = shard_param_counts(arch, tp=tp, ep=ep)
    shapes = layer_weight_shapes(arch, tp=tp, ep=ep)
    total = num_layers * counts.per_layer
    embedding = counts.embedding if first else 0
    total += embedding
    if last:
        # A tied output layer on another stage than the embedding is a separate copy (Megatron-LM keeps
        # the word embeddings on the last stage and all-reduces their gradients with the first).
        total += counts.final_norm + (counts.output if pp == 1 else counts.output_if_untied)
    factored = sum(sum(shape) if len(shape) == 2 else shape[0] for shape in shapes)
    return ParamTerms(
        params=total,
        embedding_params=embedding,
        output_params=counts.output_if_untied if last else 0,
        layer_params=counts.per_layer,
        expert_params=num_layers * counts.expert_per_layer,
        largest_layer_param=max(math.prod(shape) for shape in shapes),
        adafactor_state_bytes=act.FP32 * num_layers * factored,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Phase:
    """One moment of the step that can hold the peak, beyond the model states and (if ``holds_activations``)
    the in-flight activations: bytes of loss tensors, communication buffers and temporaries."""

    name: str
    holds_activations: bool
    logits_and_loss: int
    communication_buffers: int
    temporaries: int
    reduced_params: int = 0
    """Parameters whose gradient shard exists twice at this moment: FSDP2's reduce-scatter writes a new
    output (``foreach_reduce``: ``reduce_output``, the gradient shard, ``grad bytes / (dp x cp)`` per
    parameter) that is added to the existing sharded ``.grad`` from the second micro-batch of a step on.
    Its bytes depend on dp; :meth:`StageModel.at` folds them into ``communication_buffers``."""

    @property
    def extra_bytes(self) -> int:
        """Bytes beyond the states and activations, the reduce-scatter output (``reduced_params``) not
        included (it depends on dp: :meth:`StageModel.extra_at`)."""
        return self.logits_and_loss + self.communication_buffers + self.temporaries


@dataclass(frozen=True, slots=True, kw_only=True)
class StageModel:
    """Everything about one pipeline rank's memory that does not depend on dp, so that a plan search
    evaluates many data-parallel degrees cheaply (:meth:`allocated_bytes`); :func:`predict_stage` builds
    the named breakdown from the same :meth:`states`, :meth:`activations` and ``phases``."""

    stage: int
    pp: int
    cp: int
    ep: int
    chunk_layers: tuple[int, ...]
    has_embedding: bool
    params: ParamTerms
    acts: act.ActivationTerms
    layout: StateLayout
    adafactor: bool
    training: TrainingConfig
    phases: tuple[Phase, ...]
    max_extra_with_activations: int
    """Largest ``extra_bytes`` of the phases that hold the activations (derived from ``phases``; a phase's
    reduce-scatter output counted at dp 1, or 2 when dp > 1: see :func:`_extra_bound`)."""
    max_extra_without_activations: int

    @property
    def num_layers(self) -> int:
        return sum(self.chunk_layers)

    def states(self, dp: int) -> dict[str, int]:
        """Model-state copies at data parallelism ``dp``, bytes."""
        return dict(zip(STATE_COMPONENTS, self._state_values(dp), strict=True))

    def _state_values(self, dp: int) -> tuple[int, int, int, int, int]:
        # ZeRO/FSDP shard over every rank that holds the same parameters: dp x cp for dense parameters
        # (Megatron-core's distributed optimizer uses the data-parallel group with context parallelism;
        # torchtitan shards over dp_shard x cp), dp x cp / ep for expert parameters (the expert-data-parallel
        # group: each expert lives on dp / ep of the dp ranks).
        expert = self.params.expert_params
        dense = self.params.params - expert
        w, g, m, o = self.layout.per_param(dp * self.cp)
        values = [w * dense, g * dense, m * dense, o * dense]
        if expert:
            we, ge, me, oe = self.layout.per_param(max(dp * self.cp // self.ep, 1))
            values = [v + e * expert for v, e in zip(values, (we, ge, me, oe), strict=True)]
        if self.adafactor:
            shard = dp * self.cp if self.layout.shard_optimizer else 1
            values[3] = self.params.adafactor_state_bytes / shard
        # fp8 weight caches follow the weights: under ZeRO-3 / FSDP each rank caches only its shard (the
        # gathered fp8 copy of a block is a communication buffer), never the whole model.
        cache = self.layout.weight_cache_bytes * self.params.params
        if self.layout.shard_weights:
            cache /= dp * self.cp
        if self.layout.weight_cache_bytes and profile(self.training.runtime).fp8_scaling_state:
            cache += self.num_layers * TE_SCALING_STATE_BYTES_PER_LAYER
        return int(values[0]), int(values[1]), int(values[2]), int(values[3]), int(cache)

    def activations(self, dp: int) -> int:
        """Activations of every in-flight micro-batch at the stage's peak, bytes."""
        microbatches = self.training.num_micro_batches(dp)
        in_flight = in_flight_layer_microbatches(self.chunk_layers, self.stage, self.pp, microbatches)
        held = int(in_flight * self.num_layers * self.acts.layer)
        if self.has_embedding:
            held += math.ceil(in_flight) * self.acts.embedding
        return held

    def extra_at(self, phase: Phase, dp: int) -> int:
        """``phase``'s bytes beyond the states and activations at data parallelism ``dp``."""
        return phase.extra_bytes + self._reduce_output_bytes(phase, dp)

    def at(self, phase: Phase, dp: int) -> Phase:
        """``phase`` at data parallelism ``dp``: its reduce-scatter output in ``communication_buffers``."""
        if not phase.reduced_params:
            return phase
        comm = phase.communication_buffers + self._reduce_output_bytes(phase, dp)
        return replace(phase, communication_buffers=comm, reduced_params=0)

    def _reduce_output_bytes(self, phase: Phase, dp: int) -> int:
        if not phase.reduced_params:
            return 0
        return int(self.layout.per_param(dp * self.cp)[1] * phase.reduced_params)

    def peak_phase(self, dp: int) -> tuple[Phase, int]:
        """The phase holding the peak (at ``dp``: :meth:`at`) and its bytes beyond the model states."""
        held = self.activations(dp)
        phase, beyond = max(
            ((p, (held if p.holds_activations else 0) + self.extra_at(p, dp)) for p in self.phases), key=lambda x: x[1]
        )
        return self.at(phase, dp), beyond

    def allocated_bytes(self, dp: int) -> int:
        """Peak allocated bytes at data parallelism ``dp``: the value :func:`predict_stage` reports, without
        building its breakdown (the plan search's fast path)."""
        return sum(self.split(dp))

    def split(self, dp: int) -> tuple[int, int]:
        """(model states, everything else at the peak) in bytes at data parallelism ``dp``: the certain and
        the uncertain part of the allocated peak (:mod:`frenzy_opt.prediction.marp.bound`)."""
        held = self.activations(dp)
        if any(p.reduced_params for p in self.phases):
            # A phase whose reduce-scatter output depends on dp (:meth:`extra_at`): the exact maximum.
            beyond_states = max((held if p.holds_activations else 0) + self.extra_at(p, dp) for p in self.phases)
        else:
            beyond_states = max(held + self.max_extra_with_activations, self.max_extra_without_activations)
        return sum(self._state_values(dp)), beyond_states

    def step_shape(self, dp: int, factor: float) -> bound.StepShape:
        """The rank's step for :func:`bound.stage_events`, the uncertain sizes times ``factor``."""
        phase, _ = self.peak_phase(dp)
        layers = self.num_layers
        states = tuple(size for value in self._state_values(dp) for size in bound.split_sizes(value, layers))
        mlp = self.acts.mlp_part
        rest = max(self.acts.layer - mlp, 0)
        parts = (mlp, rest // 2, rest - rest // 2)
        microbatches = self.training.num_micro_batches(dp)
        in_flight = in_flight_layer_microbatches(self.chunk_layers, self.stage, self.pp, microbatches)
        return bound.StepShape(
            state_tensors=states,
            layer_parts=tuple(int(p * factor) for p in parts),
            num_layers=layers,
            in_flight=in_flight if phase.holds_activations else 0.0,
            peak_temporaries=tuple(
                int(v * factor) for v in (phase.logits_and_loss, phase.communication_buffers, phase.temporaries)
            ),
            backward_transient=int(self.acts.block_incoming_grad * factor),
        )


def layer_counts(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> tuple[int, ...]:
    """Layers per model chunk as ``training.runtime`` splits them (:func:`chunk_layer_counts`)."""
    return chunk_layer_counts(
        arch.num_layers,
        parallel.pp,
        parallel.vpp,
        split_rule(training.runtime),
        parallel.first_stage_layers,
        parallel.last_stage_layers,
    )


def stage_model(job: JobSpec, stage: int) -> StageModel:
    return stage_model_of(job.model, job.training, job.parallel, stage)


def stage_model_of(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig, stage: int) -> StageModel:
    """The :class:`StageModel` of pipeline rank ``stage`` (dp only through the ZeRO stage it allows)."""
    counts = layer_counts(arch, training, parallel)
    chunk_layers = counts[stage :: parallel.pp]
    first, last = stage == 0, stage == parallel.pp - 1
    params = param_terms(arch, parallel.tp, parallel.ep, parallel.pp, sum(chunk_layers), first, last)
    acts = act.activation_terms(arch, training, parallel)
    layout = state_layout(training, parallel)
    # The runtime's buffers kept across steps (Megatron-core's global memory buffer and RoPE table,
    # torchtitan's RoPE table per block) are alive in every phase, next to the communication buffers they
    # mostly are.
    persistent = acts.persistent + sum(chunk_layers) * acts.layer_persistent
    comm = comm_buffer_bytes(training, parallel, layout, params) + persistent
    block_temp = acts.block_backward(layout.transient_grad_bytes * params.largest_layer_param) + acts.recompute
    embedding_grad = layout.transient_grad_bytes * params.embedding_params
    phases = [
        Phase(name="block_backward", holds_activations=True, logits_and_loss=0, communication_buffers=comm,
              temporaries=block_temp),
        # A block's second norm runs its backward once the block's MLP activations are freed; the
        # recomputed block (full recompute) is alive then, and on a stage before the last so is the gradient
        # received from the next stage (Megatron keeps it for the micro-batch's whole backward).
        Phase(name="norm_backward", holds_activations=True, logits_and_loss=0, communication_buffers=comm,
              temporaries=acts.recompute - acts.mlp_part + acts.norm_backward
              + (0 if last else acts.block_incoming_grad)),
        # The embedding's gradient is made last, when the micro-batch's block activations are already freed.
        embedding_phase(chunk_layers, acts, comm, embedding_grad, pipelined=first and parallel.pp > 1),
        Phase(name="optimizer_step", holds_activations=False, logits_and_loss=0,
              communication_buffers=int(layout.grad_buffer_bytes * params.params) + persistent, temporaries=0),
    ]  # fmt: skip
    if last:
        phases += head_phases(training, parallel, params, acts, layout, comm, persistent)
    if profile(training.runtime).pipeline_defers_reshard and parallel.pp > 1:
        phases = pipelined_fsdp2_phases(phases, params, acts, layout, persistent, first=first, last=last,
                                        blocks=sum(chunk_layers))  # fmt: skip
    return StageModel(
        stage=stage,
        pp=parallel.pp,
        cp=parallel.cp,
        ep=parallel.ep,
        chunk_layers=chunk_layers,
        has_embedding=first,
        params=params,
        acts=acts,
        layout=layout,
        adafactor=training.optimizer == "adafactor",
        training=training,
        phases=tuple(phases),
        max_extra_with_activations=max(_extra_bound(p, layout, parallel) for p in phases if p.holds_activations),
        max_extra_without_activations=max(_extra_bound(p, layout, parallel) for p in phases if not p.holds_activations),
    )


def _extra_bound(phase: Phase, layout: StateLayout, parallel: ParallelConfig) -> int:
    """``phase``'s extra bytes for :attr:`StageModel.max_extra_with_activations`, which may not depend on dp
    beyond ``dp > 1`` (the plan search shares a stage model over every dp > 1): the reduce-scatter output at
    the smallest such dp (1, else 2), exact there and an upper bound at larger dp (:meth:`StageModel.extra_at`
    is exact at every dp)."""
    dp = 1 if parallel.dp == 1 else 2
    shards = int(layout.per_param(dp * parallel.cp)[1] * phase.reduced_params)
    # Shards a phase lacks (negative ``reduced_params``, :func:`pipelined_fsdp2_phases`) shrink as dp grows:
    # at dp > 1 only 0 bounds them from above.
    return phase.extra_bytes + (shards if dp == 1 else max(shards, 0))


def head_phases(
    training: TrainingConfig,
    parallel: ParallelConfig,
    params: ParamTerms,
    acts: act.ActivationTerms,
    layout: StateLayout,
    comm: int,
    persistent: int,
) -> list[Phase]:
    """The last stage's phases at the loss and the output layer (``comm``: the stage's communication
    buffers, :func:`comm_buffer_bytes`, with the ``persistent`` buffers kept across steps)."""
    output, c = params.output_params, layout.compute_bytes
    head_comm = chunk_comm = output_comm = norm_comm = comm
    reduced = 0
    output_logits, output_temp = acts.logits_grad, layout.transient_grad_bytes * output + acts.block_incoming_grad
    output_group = profile(training.runtime).output_fsdp_group
    if output_group and parallel.pp == 1:
        # torchtitan's last FSDP group, [norm, output], is not resharded after forward (``apply_fsdp_to_decoder``,
        # ``torchtitan/distributed/fsdp.py``): its unsharded compute-precision weight, ``c`` bytes per output
        # parameter, is alive from the forward on (trace path finding F2, benchmarks/results/marp_vs_trace.md). The
        # blocks are resharded then (zero_stage 3, torchtitan's default): these phases hold the output
        # group's buffers alone; with every block kept gathered (zero_stage 2), beside the stage's buffers.
        reduced = output

        def beside(group: int) -> int:
            return persistent + group if parallel.zero_stage >= 3 else max(comm, group)

        if acts.loss_chunk:
            # Chunked loss (``ChunkedLossWrapper``, finding F1): the output layer's gradient sync is off until
            # the last chunk, so FSDP2 accumulates its unsharded gradient in the fp32 reduce dtype
            # (``FSDPParam.to_accumulated_grad_if_needed``): c + 4 bytes per output parameter inside a
            # chunk; at the last chunk's reduce-scatter (``foreach_reduce``) also the fp32 reduce-scatter
            # input (+4) and its output, the gradient shard (``reduced_params``): the loss's peak. (fp32
            # training: the gradient accumulates in place, the same c + 4 and c + 8.)
            chunk_comm = beside((c + 4) * output)
            head_comm = output_comm = beside((c + 8) * output)
        else:
            # The loss on the full logits: the weight alone at the loss's backward; at the output group's
            # reduce-scatter, after its backward, the compute-precision gradient, the fp32 reduce-scatter input
            # and the gradient shard, the weight already resharded, beside the next block's prefetched weights.
            head_comm = beside(c * output)
            output_comm = beside(layout.gathered_weight_bytes * params.layer_params + (c + 4) * output)
            output_logits = 0
    elif output_group and acts.loss_chunk:
        # Under pipelining the stage's other parameters stay gathered with their fp32 gradients
        # (:func:`comm_buffer_bytes`), but ``ChunkedLossWrapper`` drives the output group itself (``recurse=False``
        # flags, reduce-scatter at each micro-batch's last chunk) as without pipelining: in place of its share
        # of ``comm``, c + 8 bytes per output parameter and the gradient shard at the last chunk.
        reduced = output
        base = comm - (layout.gathered_weight_bytes + layout.gathered_grad_bytes) * output
        chunk_comm = base + (c + 4) * output
        head_comm = output_comm = base + (c + 8) * output
    phases = []
    if acts.loss_chunk:
        # Inside one chunk of the chunked loss, before the last (finding F1).
        phases.append(
            Phase(name="loss_chunk", holds_activations=True, logits_and_loss=acts.loss + acts.loss_chunk,
                  communication_buffers=chunk_comm, temporaries=0)
        )  # fmt: skip
    return [
        *phases,
        Phase(name="loss_backward", holds_activations=True, logits_and_loss=acts.loss + acts.loss_backward,
              communication_buffers=head_comm, temporaries=0, reduced_params=reduced if acts.loss_chunk else 0),
        # The output layer's backward: the 16-bit gradient of the logits, the input gradient and the
        # output layer's transient 16-bit weight gradient (trace path finding M1: Megatron-core's last
        # stage peaks here when the tokens are few against the hidden size).
        Phase(name="output_backward", holds_activations=True, logits_and_loss=output_logits,
              communication_buffers=output_comm, temporaries=output_temp, reduced_params=reduced),
        # The final norm runs its backward before any block: every activation is alive.
        Phase(name="final_norm_backward", holds_activations=True, logits_and_loss=acts.final_norm,
              communication_buffers=norm_comm, temporaries=acts.norm_backward),
    ]  # fmt: skip


def pipelined_fsdp2_phases(
    phases: list[Phase], params: ParamTerms, acts: act.ActivationTerms, layout: StateLayout, persistent: int,
    *, first: bool, last: bool, blocks: int,
) -> list[Phase]:  # fmt: skip
    """A torchtitan pipeline stage's phases under FSDP2 (trace path finding F4, benchmarks/results/
    marp_vs_trace.md; torch 2.13 ``_PipelineStageBase``): ``backward_maybe_with_nosync`` turns gradient sync
    off for every micro-batch, so no gradient shard exists until ``perform_reduce_grad`` after the last one
    (``optimizer.zero_grad`` set them to None), and that call reduce-scatters the groups one by one in module
    order. Three corrections to the phases of :func:`stage_model_of`, as ``reduced_params`` (shards, at dp):

    * every micro-batch phase lacks the shards of the groups not yet reduced (all but the output group,
      which ``ChunkedLossWrapper`` reduces at each micro-batch's last chunk);
    * on the last stage under the chunked loss, from the second micro-batch on the final norm's first
      shard is a view of the output group's flat reduce-scatter output (``foreach_reduce`` hands each
      parameter an ``as_strided`` view; the norm has no ``.grad`` yet, the output layer's is accumulated in
      place), which keeps the whole output group's shard alive once more until ``zero_grad``;
    * a new phase ``reduce_grad``: at the first group's reduce-scatter (the embedding on the first stage, else
      the first block) its weight is resharded and its fp32 accumulated gradient sits beside the fp32
      reduce-scatter input, while every later group still holds its gathered weight and fp32 gradient
      and no shard, and the chunked output group its gathered weight (re-gathered by the stage's
      backward, resharded at its own, last, reduce)."""
    chunked = last and acts.loss_chunk > 0
    output = params.output_params if chunked else 0  # reduced by ChunkedLossWrapper, and its shard pinned
    unreduced = params.params - output
    pinned = output
    adjusted = [
        replace(p, reduced_params=p.reduced_params - (unreduced if p.holds_activations else 0) + pinned) for p in phases
    ]
    if first:
        group = params.embedding_params
    elif blocks:
        group = params.layer_params
    else:
        group = 0 if chunked else params.output_params
    gathered = layout.gathered_weight_bytes + layout.gathered_grad_bytes
    rest = unreduced - group
    reduce_grad = Phase(
        name="reduce_grad", holds_activations=False, logits_and_loss=0,
        communication_buffers=persistent + gathered * rest + 2 * layout.gathered_grad_bytes * group
        + layout.compute_bytes * output,
        temporaries=0, reduced_params=pinned - rest,
    )  # fmt: skip
    return [*adjusted, reduce_grad]


def embedding_phase(
    chunk_layers: tuple[int, ...], acts: act.ActivationTerms, comm: int, embedding_grad: int, *, pipelined: bool
) -> Phase:
    """The embedding's backward: its transient weight gradient ``embedding_grad`` (0 off the first stage).

    Without pipelining the micro-batch's activations are freed by then. On the first stage of a pipeline
    (``pipelined``) under 1F1B the embedding's backward
    of one micro-batch runs while the later in-flight micro-batches still hold their activations (trace
    path finding M5, benchmarks/results/marp_vs_trace.md): every in-flight activation but the first
    chunk's of that micro-batch, plus the gradient that arrives at the embedding's output. Written as a
    phase that holds the activations with that one chunk-micro-batch taken off its temporaries (the
    activations are counted per stage, :meth:`StageModel.activations`); where the micro-batch holds more
    than the embedding's gradient, :func:`stage_model_of`'s block backward is higher and the phase is
    floored at 0."""
    if not pipelined:
        return Phase(name="embedding_backward", holds_activations=False, logits_and_loss=0,
                     communication_buffers=comm, temporaries=embedding_grad)  # fmt: skip
    one_microbatch = chunk_layers[0] * acts.layer + acts.embedding
    temporaries = max(0, embedding_grad + acts.block_incoming_grad - one_microbatch)
    return Phase(name="embedding_backward", holds_activations=True, logits_and_loss=0, communication_buffers=comm,
                 temporaries=temporaries)  # fmt: skip


def comm_buffer_bytes(
    training: TrainingConfig, parallel: ParallelConfig, layout: StateLayout, terms: ParamTerms
) -> int:
    """Communication buffers held through backward: DDP buckets (hf), DeepSpeed's ZeRO-2 reduce bucket
    (``reduce_bucket_size`` default 5e8 elements, DeepSpeed config docs), gathered FSDP/ZeRO-3 weights of
    the current and the prefetched block (FSDP2 default prefetch of one, Zhao et al. 2023, Sec. 3.3) or of
    every block when weights stay gathered (zero_stage 2 under fsdp2), and the unsharded gradients of one
    block before its reduce-scatter."""
    params, layer_params = terms.params, terms.layer_params
    zero = parallel.zero_stage
    buffers = int(layout.grad_buffer_bytes * params)
    row = profile(training.runtime)
    bucket = row.zero2_reduce_bucket_elements if zero == 2 else 0
    if bucket:
        buffers += layout.compute_bytes * min(params, bucket)
    if row.pipeline_defers_reshard and parallel.pp > 1:
        # FSDP2 under torch.distributed.pipelining: the stage turns off resharding after backward and
        # gradient sync until the step's last micro-batch (``_PipelineStage`` calls
        # ``set_reshard_after_backward(False)`` and ``set_requires_gradient_sync(False)``), so the stage's
        # 16-bit weights stay gathered and its unsharded gradients accumulate in the fp32 reduce dtype
        # (FSDP2 ``FSDPParam.to_accumulated_grad_if_needed``) over the whole step.
        return buffers + (layout.gathered_weight_bytes + layout.gathered_grad_bytes) * params
    if layout.gathered_weight_bytes:
        gathered = 2 * layer_params if zero >= 3 else params
        buffers += layout.gathered_weight_bytes * gathered
    if layout.gathered_grad_bytes and not bucket:
        buffers += layout.gathered_grad_bytes * layer_params
    return buffers


def nccl_bytes(job: JobSpec, cuda: CudaTerms, gpu: GpuType | None) -> int:
    """NCCL's buffers of ``job``'s layout (:func:`bound.nccl_buffer_bytes`), 0 when switched off."""
    if not cuda.nccl:
        return 0
    return bound.nccl_buffer_bytes(job.training.runtime, job.parallel, gpu.intra_node if gpu is not None else None)


def workspace_bytes(job: JobSpec, cuda: CudaTerms | None, architecture: str | None) -> int:
    """The GEMM libraries' workspaces in the allocator (:func:`bound.library_workspace_bytes`), 0 on the CPU."""
    if cuda is None or not cuda.workspaces:
        return 0
    return bound.library_workspace_bytes(job.training.runtime, architecture)


def cuda_totals(allocated: int, cuda: CudaTerms | None, outside: int, capacity: int | None = None) -> tuple[int, int]:
    """(peak_reserved_bytes, device_used_bytes) from the allocated peak and the memory ``outside`` the
    allocator (CUDA context and NCCL buffers). On a GPU of ``capacity`` bytes the allocator's cache stops
    where the device ends: it frees cached segments and retries before it fails (``release_cached_blocks``,
    :mod:`frenzy_opt.prediction.marp.allocator`), so the fitted fragmentation never pushes a run over."""
    if cuda is None:
        return allocated, allocated
    reserved = int(allocated * (1 + cuda.fragmentation))
    if capacity is not None:
        reserved = max(allocated, min(reserved, capacity - outside))
    return reserved, reserved + outside


def stage_bound(
    model: StageModel,
    dp: int,
    runtime: str,
    fit: MemoryFit,
    *,
    cuda: CudaTerms | None,
    workspaces: int,
    nccl: int,
    with_reserve: bool = True,
    reserve_ratio: float | None = None,
    split: tuple[int, int] | None = None,
) -> bound.MemoryBound:
    """The rank's bound of parts (:mod:`frenzy_opt.prediction.marp.bound`). ``with_reserve=False`` leaves
    the allocator replay out (a lower figure the plan search refuses on before paying for the replay);
    ``reserve_ratio`` (reserve over the bounded allocated peak, from a replay of the same stage at another
    dp) stands in for the replay; ``split`` is :meth:`StageModel.split` at ``dp`` when the caller has it."""
    states, beyond = split if split is not None else model.split(dp)
    margin = fit.margin_of(runtime)
    rows = {
        "states": states,
        "activations": beyond,
        "activation_margin": math.ceil(margin * beyond) + fit.fixed_margin_of(runtime),
        "library_workspaces": workspaces,
        "allocator_reserve": 0,
        "cuda_context": 0,
        "nccl_buffers": 0,
        "cached_reserve": 0,
    }
    if cuda is not None:
        if with_reserve and reserve_ratio is not None:
            allocated = states + beyond + rows["activation_margin"] + workspaces
            rows["allocator_reserve"] = math.ceil(reserve_ratio * allocated)
        elif with_reserve:
            rows["allocator_reserve"] = bound.allocator_reserve_bytes(model.step_shape(dp, 1 + margin))
        rows["cuda_context"] = cuda.context_bytes
        rows["nccl_buffers"] = nccl
        allocated = states + beyond + rows["activation_margin"] + workspaces
        rows["cached_reserve"] = math.ceil(fit.cached_fraction * allocated)
    return bound.MemoryBound(rows)


def predict_stage(
    job: JobSpec,
    stage: int,
    cuda: CudaTerms | None,
    gpu: GpuType | None,
    fit: MemoryFit = SHIPPED_FIT,
    architecture: str | None = None,
) -> StagePrediction:
    """One stage's peak and its named breakdown (see the module docstring for the phases), and its bound."""
    model = stage_model(job, stage)
    dp = job.parallel.dp
    phase, _ = model.peak_phase(dp)
    breakdown = {
        **model.states(dp),
        "activations": model.activations(dp) if phase.holds_activations else 0,
        "logits_and_loss": phase.logits_and_loss,
        "communication_buffers": phase.communication_buffers,
        "temporaries": phase.temporaries,
    }
    workspaces = workspace_bytes(job, cuda, gpu.architecture if gpu is not None else architecture)
    if cuda is not None:
        breakdown["library_workspaces"] = workspaces
    allocated = sum(breakdown.values())
    nccl = nccl_bytes(job, cuda, gpu) if cuda is not None else 0
    outside = cuda.context_bytes + nccl if cuda is not None else 0
    reserved, used = cuda_totals(allocated, cuda, outside, gpu.memory_bytes if gpu is not None else None)
    if cuda is not None:
        breakdown |= {
            "allocator_reserve": reserved - allocated,
            "cuda_context": cuda.context_bytes,
            "nccl_buffers": nccl,
        }
    upper = stage_bound(model, dp, job.training.runtime, fit, cuda=cuda, workspaces=workspaces, nccl=nccl)
    if gpu is not None:
        upper = upper.within(gpu.memory_bytes)
    return StagePrediction(
        stage=stage,
        num_layers=model.num_layers,
        num_params=model.params.params,
        peak_phase=phase.name,
        breakdown=breakdown,
        peak_allocated_bytes=allocated,
        peak_reserved_bytes=reserved,
        device_used_bytes=used,
        peak_allocated_upper_bytes=upper.allocated,
        peak_reserved_upper_bytes=upper.reserved,
        device_used_upper_bytes=upper.device_used,
        required_upper_bytes=upper.required,
        bound=dict(upper.rows),
    )


@functools.lru_cache(maxsize=4096)
def peak_stages(pp: int, counts: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The stages that can hold the peak: the first (most in-flight micro-batches, the embedding), the last
    (output layer and loss) and, when a split gives a middle stage more layers than the first
    (``counts``: layers per chunk, :func:`layer_counts`), the middle stage with the most layers (it holds
    fewer in-flight micro-batches and neither table, so only more layers can make it the peak)."""
    if pp == 1:
        return (0,)
    stages = [0, pp - 1]
    if counts is not None and pp > 2:
        per_rank = [sum(counts[r::pp]) for r in range(pp)]
        middle = max(range(1, pp - 1), key=lambda r: per_rank[r])
        if per_rank[middle] > per_rank[0]:
            stages.insert(1, middle)
    return tuple(stages)


def predict_peak(
    job: JobSpec,
    gpu: GpuType | None = None,
    *,
    cuda: CudaTerms | None = DEFAULT_CUDA,
    fit: MemoryFit = SHIPPED_FIT,
    architecture: str | None = None,
) -> MemoryPrediction:
    """Like :func:`predict_memory` but only for the stages of :func:`peak_stages`."""
    counts = layer_counts(job.model, job.training, job.parallel)
    return _prediction(job, gpu, cuda, list(peak_stages(job.parallel.pp, counts)), fit, architecture)


def predict_memory(
    job: JobSpec,
    gpu: GpuType | None = None,
    *,
    cuda: CudaTerms | None = DEFAULT_CUDA,
    fit: MemoryFit = SHIPPED_FIT,
    architecture: str | None = None,
) -> MemoryPrediction:
    """Per-stage peak memory of ``job`` at its parallel config, on ``gpu`` if given (for capacity/fit).

    ``cuda=None`` switches the CUDA-only terms off (reserved = used = allocated), as on the CPU.
    ``fit`` gives the bound's margins; ``architecture`` sizes the library workspaces when no ``gpu`` is given
    (an unknown one takes Hopper's).
    """
    return _prediction(job, gpu, cuda, list(range(job.parallel.pp)), fit, architecture)


def _prediction(
    job: JobSpec,
    gpu: GpuType | None,
    cuda: CudaTerms | None,
    stages: list[int],
    fit: MemoryFit,
    architecture: str | None,
) -> MemoryPrediction:
    layer_counts(job.model, job.training, job.parallel)  # validates pp x vpp and the split
    return MemoryPrediction(
        stages=tuple(predict_stage(job, stage, cuda, gpu, fit, architecture) for stage in stages),
        capacity_bytes=gpu.memory_bytes if gpu is not None else None,
        gpu_type=gpu.name if gpu is not None else None,
        parallel=job.parallel,
    )
