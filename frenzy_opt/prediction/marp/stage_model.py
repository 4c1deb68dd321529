"""MARP's stage model: everything about one pipeline rank's memory that does not depend on dp
(:class:`StageModel`, built by :func:`stage_model_of` from the phases of
:mod:`frenzy_opt.prediction.marp.phases`): its model states, in-flight activations, peak phase, the
(states, rest) split the bound starts from and the step shape the allocator replay takes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from frenzy_opt.core.partition import chunk_layer_counts, split_rule
from frenzy_opt.core.runtime_profile import profile
from frenzy_opt.core.spec import JobSpec, ParallelConfig, TrainingConfig
from frenzy_opt.models.arch import ModelArch
from frenzy_opt.prediction.marp import activations as act
from frenzy_opt.prediction.marp import bound
from frenzy_opt.prediction.marp.layout import StateLayout, state_layout
from frenzy_opt.prediction.marp.phases import (
    ParamTerms,
    Phase,
    comm_buffer_bytes,
    embedding_phase,
    head_phases,
    param_terms,
    pipelined_fsdp2_phases,
)
from frenzy_opt.prediction.marp.stages import in_flight_layer_microbatches

TE_SCALING_STATE_BYTES_PER_LAYER = 4 * 5 * 1024 * 4
"""Transformer Engine's delayed-scaling state per transformer layer, counted with the fp8 weight cache: each
of its 4 GEMM modules (QKV, attention output, fc1, fc2) keeps an fp32 amax history of ``amax_history_len``
entries (``DelayedScaling`` default 1024) for its 3 forward (input, weight, output) and 2 backward (grad output,
grad input) fp8 tensors (TE docs, "Using FP8 with Transformer Engine", ``fp8_meta``): 80 KiB a layer, 10 MiB
for 126 layers. Current (per-tensor) scaling keeps no history; the bound counts the delayed recipe."""
STATE_COMPONENTS = ("weights", "grads", "master_weights", "optimizer_states", "weight_cache")


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
