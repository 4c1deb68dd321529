"""MARP's phases of a training step: the moments that can hold a pipeline rank's peak (:class:`Phase`) beyond
its model states and activations, the last stage's head (:func:`head_phases`), the embedding's backward
(:func:`embedding_phase`), FSDP2 under pipelining (:func:`pipelined_fsdp2_phases`), the communication buffers
held through backward (:func:`comm_buffer_bytes`) and the parameter counts they are sized from
(:class:`ParamTerms`). :func:`frenzy_opt.prediction.marp.stage_model.stage_model_of` assembles them.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from frenzy_opt.core.runtime_profile import profile
from frenzy_opt.core.spec import ParallelConfig, TrainingConfig
from frenzy_opt.models.arch import ModelArch, layer_weight_shapes, shard_param_counts
from frenzy_opt.prediction.marp import activations as act
from frenzy_opt.prediction.marp.layout import StateLayout


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
