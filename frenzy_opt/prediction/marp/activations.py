"""Activation memory of one transformer block and of the embedding and loss, per micro-batch, in bytes.

The accounting follows Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models", Sec. 4): sum the tensors each operator keeps for its backward pass. The operators are those of the
reference decoder (``frenzy_opt.models.reference``), which are the ones a Megatron-style runtime runs:

* a fused RMSNorm/LayerNorm keeps its input and per-token statistics in fp32 (Apex/Transformer Engine
  kernels; LayerNorm keeps mean and reciprocal std, RMSNorm the reciprocal RMS);
* each linear keeps its input (shared by the q, k and v projections);
* RoPE keeps only its tables, so attention keeps the rotated q and k and the value projection;
* flash attention (Dao et al. 2022, Alg. 2) keeps its output and the fp32 log-sum-exp per row instead of
  the ``s x s`` probabilities; eager attention keeps the fp32 softmax output, its 16-bit copy, the causal
  mask and, with grouped-query attention, the k/v heads expanded to the query heads;
* SwiGLU keeps the gate, its SiLU, the up projection and their product; GeLU its input and output;
* a mixture-of-experts layer keeps the router probabilities and, per local expert, the routed tokens and
  that expert's MLP activations at capacity ``ceil(top_k * tokens / num_experts)`` (GShard capacity factor 1);
* the loss keeps the final norm, the output-layer input and fp32 log-probabilities (``4 * tokens * vocab``);
  torchtitan's chunked loss (fsdp2, :func:`loss_chunks`) never makes the full logits: it keeps the hidden
  states and the fp32 buffer of their gradient, and one chunk's logits at a time.

Parallelism divides the shapes as in Korthikanti et al. 2022, Table 2: tensor parallelism divides heads,
ffn columns and vocabulary by ``tp``; sequence parallelism divides the norm/residual region by ``tp``;
context parallelism divides the sequence by ``cp``. Full recompute keeps only each block's input
(Chen et al. 2016); selective recompute drops the attention core's internals (Korthikanti Sec. 5).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from frenzy_opt.core.enums import Precision, Recompute
from frenzy_opt.core.runtime_profile import profile
from frenzy_opt.core.spec import ParallelConfig, TrainingConfig
from frenzy_opt.models.arch import ModelArch

NATIVE_OPS: contextvars.ContextVar[bool] = contextvars.ContextVar("native_ops", default=False)
"""True inside :func:`native_operators`: every runtime is priced with PyTorch-native operators (unfused
SwiGLU, ``log_softmax`` + ``nll_loss``), as the reference decoder of :mod:`frenzy_opt.models.reference`
runs them. The CPU harness (:mod:`frenzy_opt.validation.harness`) measures that decoder under a Megatron
state layout, so its comparisons set this; real Megatron-core fuses both operators."""


@contextlib.contextmanager
def native_operators() -> Iterator[None]:
    token = NATIVE_OPS.set(True)
    try:
        yield
    finally:
        NATIVE_OPS.reset(token)


# int64 token ids and targets (PyTorch's index dtype for embedding and nll_loss).
INDEX_BYTES = 8
FP32 = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class Dims:
    """Per-rank tensor sizes of one micro-batch."""

    b: int
    s: int
    tokens: int
    h: int
    hq: int
    hkv: int
    heads: int
    ffn: int
    vocab: int
    a: int
    """Bytes of a 16-bit (or fp32) activation element."""
    a_linear: int
    """Bytes of a saved linear input (1 under fp8 with Transformer Engine, which keeps fp8 copies; torchao
    under fsdp2 keeps the 16-bit input: the runtime profile's ``fp8_saves_fp8_inputs``)."""
    sp: int
    """Divisor of the norm/residual region (tp with sequence parallelism, else 1)."""
    sp_linear: int
    """Divisor of the saved input of a column-parallel linear under sequence parallelism: Megatron-core saves
    the sequence-sharded input and all-gathers it again in backward (Korthikanti et al. 2022, Sec. 4.2.2);
    torchtitan's DTensor ``ColwiseParallel`` saves the all-gathered input (``SequenceParallel`` norms ahead
    of ``input_layouts=Shard(1)``), so its divisor is 1."""
    runtime: str
    fused_swiglu: bool
    """Megatron-core fuses SwiGLU (saves gate and up only); PyTorch-native models (torchtitan, HF) keep
    gate, SiLU, up and product."""


def dims(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> Dims:
    tp = parallel.tp
    row = profile(training.runtime)
    d = arch.kv_channels
    s = math.ceil(training.seq_len / parallel.cp)
    a = 4 if training.precision == Precision.FP32 else 2
    return Dims(
        b=training.micro_batch_size,
        s=s,
        tokens=training.micro_batch_size * s,
        h=arch.hidden_size,
        hq=arch.num_attention_heads // tp * d,
        hkv=max(arch.num_kv_heads // tp, 1) * d,
        heads=arch.num_attention_heads // tp,
        ffn=arch.ffn_hidden_size // tp,
        vocab=math.ceil(arch.vocab_size / tp),
        a=a,
        a_linear=1 if training.precision == Precision.FP8 and row.fp8_saves_fp8_inputs else a,
        sp=tp if parallel.sequence_parallel else 1,
        sp_linear=tp if parallel.sequence_parallel and row.sequence_parallel_saves_split_input else 1,
        runtime=training.runtime,
        fused_swiglu=row.fused_swiglu and not NATIVE_OPS.get(),
    )


def _norm_bytes(arch: ModelArch, x: Dims) -> int:
    """Saved input plus fp32 statistics (2 per token for LayerNorm, 1 for RMSNorm)."""
    stats = 2 if arch.norm == "layernorm" else 1
    return (x.a * x.tokens * x.h + stats * FP32 * x.tokens) // x.sp


def _mlp_bytes(arch: ModelArch, x: Dims, tokens: int, ffn: int) -> int:
    if arch.mlp == "swiglu" and x.fused_swiglu:
        # Megatron-core's fused SwiGLU (``fused_bias_swiglu.SwiGLUFunction``) saves only its input, the
        # concatenated gate and up projections, and recomputes SiLU in backward; the product feeds fc2.
        return 2 * x.a * tokens * ffn + x.a_linear * tokens * ffn
    if arch.mlp == "swiglu":
        # gate, silu(gate), up (16-bit each) and the product that feeds the down projection.
        return 3 * x.a * tokens * ffn + x.a_linear * tokens * ffn
    # GeLU input (16-bit) and GeLU output that feeds the down projection.
    return x.a * tokens * ffn + x.a_linear * tokens * ffn


MASK = 1
"""Bytes per element of a kept dropout mask (``torch.bool``: PyTorch's native dropout and Megatron-core's
fused bias-dropout-add save a boolean mask for backward)."""


def _attention_core_bytes(arch: ModelArch, x: Dims, attention: str, recompute: str) -> int:
    """What the attention core keeps beyond q, k, v and its output.

    Eager attention keeps the softmax output (used by the softmax backward), in fp32 when the softmax runs
    in fp32 (fp32 training; Hugging Face models under ``torch.autocast``, which runs softmax in fp32) and in
    16-bit under Megatron-core's fused scale-mask-softmax; the matmul with V keeps its own input: the
    dropout output (with its mask) under attention dropout, else a 16-bit cast of an fp32 softmax output
    (nothing when the softmax output already has the matmul's format). With grouped-query attention the
    k/v heads are expanded to the query heads and kept by the matmuls."""
    if recompute == Recompute.SELECTIVE:
        return 0
    if attention == "flash":
        # Log-sum-exp per query row, fp32 (Dao et al. 2022, Alg. 2 output L).
        return FP32 * x.b * x.heads * x.s
    probs = x.b * x.heads * x.s * x.s
    expanded_kv = 2 * x.a * x.tokens * (x.hq - x.hkv)
    native = NATIVE_OPS.get()
    row = profile(x.runtime)
    unfused = row.fused_scale_mask_softmax and not _fused_softmax_applies(x)
    softmax = FP32 if x.a == FP32 or row.softmax_fp32 or native or unfused else x.a
    if arch.attention_dropout > 0:
        matmul_input = MASK + x.a
    else:
        matmul_input = 0 if softmax == x.a else x.a
    # The reference decoder builds its s x s boolean causal mask in each attention call; the runtimes keep
    # one shared mask (Megatron) or none (flash kernels, Hugging Face's additive b x 1 x 1 x s mask).
    causal_mask = x.s * x.s if native else 0
    return (softmax + matmul_input) * probs + causal_mask + expanded_kv


def layer_buffer_bytes(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> int:
    """Buffers each transformer block keeps across steps beside its parameters: torchtitan's attention layers
    each own a RoPE module whose ``cache`` buffer holds the complex64 ``(max_seq_len, d / 2)`` table
    (``ComplexRoPE._precompute_cache``, ``torchtitan/models/common/rope.py``), ``max_seq_len`` set to
    ``training.seq_len`` by ``Decoder.Config.update_from_config`` (``torchtitan/models/common/decoder.py``);
    FSDP2 does not shard buffers: ``8 x seq_len x d / 2`` per block. 0 for the other runtimes."""
    if not profile(training.runtime).rope_cache_buffer or arch.position_embedding != "rope":
        return 0
    return 8 * training.seq_len * (arch.kv_channels // 2)


def _fused_softmax_applies(x: Dims) -> bool:
    """Whether Megatron-core's fused scale-mask-softmax kernel runs (``FusedScaleMaskSoftmax.
    is_kernel_available``, ``megatron/core/fusions/fused_softmax.py``: 16-bit input, ``16 < sk <= 4096``,
    ``sq`` and ``b x heads / tp`` multiples of 4). Otherwise its PyTorch fallback runs the softmax in fp32
    (``attention_softmax_in_fp32``) and casts the probabilities back to 16-bit."""
    return x.a == 2 and 16 < x.s <= 4096 and x.s % 4 == 0 and (x.b * x.heads) % 4 == 0


def _hidden_dropout_bytes(arch: ModelArch, x: Dims) -> int:
    """Masks of the block's two hidden dropouts (after attention and after the MLP)."""
    return 2 * MASK * x.tokens * x.h // x.sp if arch.hidden_dropout > 0 else 0


def _moe_bytes(arch: ModelArch, x: Dims, parallel: ParallelConfig) -> int:
    experts = arch.num_experts
    capacity = math.ceil(arch.moe_top_k * x.tokens / experts)
    local = experts // parallel.ep
    ffn = arch.expert_ffn_size // parallel.tp
    # The MoE input (kept by the router and the token gather), router logits and fp32 probabilities.
    router = x.a_linear * x.tokens * x.h // x.sp + (x.a + FP32) * x.tokens * experts
    per_expert = (
        INDEX_BYTES * capacity  # token indices chosen
        + x.a_linear * capacity * x.h  # routed tokens (expert input)
        + _mlp_bytes(arch, x, capacity, ffn)
        + x.a * capacity * (x.h + 1)  # expert output and its gate weight, kept by the weighting product
        + x.a * capacity * x.h  # the weighted output, kept by the scatter-add (index_add) for its backward
    )
    return router + local * per_expert


def mlp_part_bytes(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> int:
    """The MLP (or MoE) share of a block's activations without recompute: freed before the block's
    second norm runs its backward."""
    x = dims(arch, training, parallel)
    if arch.is_moe:
        return _moe_bytes(arch, x, parallel)
    return x.a_linear * x.tokens * x.h // x.sp_linear + _mlp_bytes(arch, x, x.tokens, x.ffn)


def layer_bytes(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> int:
    """Activations one block keeps for backward, one micro-batch, one rank."""
    x = dims(arch, training, parallel)
    if parallel.recompute == Recompute.FULL:
        return x.a * x.tokens * x.h // x.sp
    row = profile(x.runtime)
    if parallel.recompute == Recompute.SELECTIVE and row.op_level_selective_recompute:
        return op_sac_bytes(arch, x)
    qkv = x.a * x.tokens * (x.hq + 2 * x.hkv)
    if row.rope_out_of_place and arch.position_embedding == "rope" and not NATIVE_OPS.get():
        # Megatron-core splits q, k, v as views of the fused QKV GEMM output, which stays alive, and
        # applies RoPE out of place: the rotated q and k are kept too (trace path finding M2).
        qkv += x.a * x.tokens * (x.hq + x.hkv)
    out = x.a_linear * x.tokens * x.hq  # attention output, the input of the output projection
    attention = (
        _norm_bytes(arch, x)
        + x.a_linear * x.tokens * x.h // x.sp_linear
        + qkv
        + out
        + _attention_core_bytes(arch, x, parallel.attention, parallel.recompute)
    )
    return attention + _norm_bytes(arch, x) + mlp_part_bytes(arch, training, parallel) + _hidden_dropout_bytes(arch, x)


def op_sac_bytes(arch: ModelArch, x: Dims) -> int:
    """torchtitan's selective activation checkpointing (``activation_checkpoint.mode = "selective"``,
    ``selective_ac_option = "op"``, the default of its Llama configs): inside each checkpointed block only
    the outputs of the ops in its save list are kept -- every second matmul (the policy counts ``aten.mm``
    calls and recomputes the even ones: wk, wo, w3 of a Llama block), the SDPA output and its log-sum-exp --
    plus the block's input (torchtitan ``apply_ac``, ``_save_list`` and ``_get_custom_policy``)."""
    kept_mm = x.hq + x.hkv + x.ffn + x.h  # wq, wv, w1, w2 outputs
    sdpa = x.a * x.tokens * x.hq + FP32 * x.b * x.heads * x.s
    return x.a * x.tokens * (x.h // x.sp + kept_mm) + sdpa


def recompute_bytes(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> int:
    """Extra activations alive while one block is recomputed during backward (full recompute, and
    torchtitan's op-level selective recompute, which re-runs the block's unsaved ops)."""
    selective_sac = parallel.recompute == Recompute.SELECTIVE and profile(training.runtime).op_level_selective_recompute
    if parallel.recompute != Recompute.FULL and not selective_sac:
        return 0
    full = ParallelConfig(**{**parallel.to_dict(), "recompute": "none"})
    return layer_bytes(arch, training, full)


def embedding_bytes(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> int:
    """Token ids kept by the embedding backward (and position ids for learned positions)."""
    x = dims(arch, training, parallel)
    positions = INDEX_BYTES * x.s if arch.position_embedding == "learned" else 0
    dropout = MASK * x.tokens * x.h // x.sp if arch.hidden_dropout > 0 else 0
    return INDEX_BYTES * x.tokens + positions + dropout


def loss_chunks(training: TrainingConfig) -> int:
    """Chunks of the sequence the loss is computed in (``training.loss_chunks``, else the runtime's default,
    its profile's ``default_loss_chunks``)."""
    if training.loss_chunks is not None:
        return training.loss_chunks
    return profile(training.runtime).default_loss_chunks


def _chunk_tokens(x: Dims, chunks: int) -> int:
    """Tokens of one loss chunk: ``ChunkedLossWrapper`` splits the rank's sequence into ``chunks`` equal
    parts (it requires the local sequence length to be a multiple of ``num_chunks``)."""
    return x.b * math.ceil(x.s / chunks)


def loss_bytes(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> int:
    """Final norm, output-layer input, fp32 log-probabilities and targets kept for backward.

    Under torchtitan's chunked loss (``ChunkedLossWrapper.__call__``, ``torchtitan/components/loss.py``) the
    output layer and the cross entropy run one chunk at a time, each chunk's backward right after its
    forward, so no log-probabilities are kept across chunks. Kept instead: the final norm's input and
    statistics, its output (the hidden states, replicated over the tp ranks before chunking, referenced until
    the decoder's backward), the fp32 ``GradAccumulator`` buffer of their gradient (``4 * tokens * h``), the
    chunks themselves when they are copies (``.contiguous()`` of a split along the sequence: a copy unless the
    micro-batch is one sequence) and the targets. Trace path finding F1 (benchmarks/results/marp_vs_trace.md).
    """
    x = dims(arch, training, parallel)
    if loss_chunks(training) > 1:
        copies = x.a * x.tokens * x.h if x.b > 1 else 0
        hidden = x.a * x.tokens * x.h + copies + FP32 * x.tokens * x.h
        return _norm_bytes(arch, x) + hidden + INDEX_BYTES * x.tokens
    return _norm_bytes(arch, x) + x.a_linear * x.tokens * x.h + FP32 * x.tokens * x.vocab + INDEX_BYTES * x.tokens


def logits_grad_bytes(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> int:
    """The 16-bit gradient of the logits that the output layer's backward takes: one chunk's under a chunked
    loss (:func:`loss_chunks`)."""
    x = dims(arch, training, parallel)
    return x.a * _chunk_tokens(x, loss_chunks(training)) * x.vocab


def loss_chunk_bytes(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> int:
    """The largest moment inside one chunk of torchtitan's chunked loss (0 unchunked): the chunk's 16-bit
    logits, their fp32 copy (``cross_entropy_loss`` casts ``pred.float()``) and the fp32 log-probabilities
    that ``log_softmax`` keeps; in the chunk's backward, the kept log-probabilities, the fp32 gradients of
    ``nll_loss`` and ``log_softmax`` and the 16-bit logits: ``(a + 3 * 4) * chunk tokens * V / tp`` at most
    (``torchtitan/components/loss.py``, ``ChunkedLossWrapper.__call__`` and ``cross_entropy_loss``)."""
    x = dims(arch, training, parallel)
    chunks = loss_chunks(training)
    if chunks == 1:
        return 0
    return (x.a + 3 * FP32) * _chunk_tokens(x, chunks) * x.vocab


def fused_cross_entropy(runtime: str) -> bool:
    """Megatron-core's vocab-parallel cross entropy (``_VocabParallelCrossEntropy``) works in place on the
    fp32 logits and saves their softmax; its backward turns that softmax into the gradient in place."""
    return profile(runtime).vocab_parallel_cross_entropy and not NATIVE_OPS.get()


def loss_backward_transient_bytes(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> int:
    """Backward of the loss: the fp32 gradient of the log-probabilities and of the logits exist together
    with the kept log-probabilities (``nll_loss`` then ``log_softmax`` backward), ``8 * tokens * vocab``.

    Chunked (torchtitan, :func:`loss_chunks`): when the output layer's weight gradient of the last chunk is
    reduced (the peak of the loss, :func:`frenzy_opt.prediction.marp.stage_model.stage_model_of`), one chunk's
    16-bit logits and the 16-bit gradient of its hidden states are alive (trace path finding F1)."""
    x = dims(arch, training, parallel)
    chunks = loss_chunks(training)
    if chunks > 1:
        return x.a * _chunk_tokens(x, chunks) * (x.vocab + x.h)
    if fused_cross_entropy(training.runtime):
        # The in-place fp32 gradient, then its 16-bit cast for the output layer's backward.
        return x.a * x.tokens * x.vocab
    return 2 * FP32 * x.tokens * x.vocab


def layer_backward_transient_bytes(
    arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig, weight_grad_bytes: int
) -> int:
    """Net growth inside one block's backward: the incoming gradient plus, at the MLP, either the SiLU-product
    backward (gradients of both factors while the product's own gradient lives and the product itself is
    freed: two ffn-wide tensors; one for GeLU) or the down projection's backward (its input gradient and a
    ``weight_grad_bytes`` weight gradient not yet folded into the runtime's buffer)."""
    incoming, ffn_grad, wide = _block_backward_parts(arch, training, parallel)
    return incoming + max(wide * ffn_grad, ffn_grad + weight_grad_bytes)


def _block_backward_parts(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> tuple[int, int, int]:
    x = dims(arch, training, parallel)
    ffn, tokens = x.ffn, x.tokens
    if arch.is_moe:
        ffn = arch.expert_ffn_size // parallel.tp
        tokens = math.ceil(arch.moe_top_k * x.tokens / arch.num_experts)
    return x.a * x.tokens * x.h // x.sp, x.a * tokens * ffn, 2 if arch.mlp == "swiglu" else 1


def norm_backward_transient_bytes(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> int:
    """A norm's backward: the incoming gradient plus, for the reference RMSNorm, three fp32 token x hidden
    temporaries (normalised input, scaled gradient, one product); LayerNorm's native kernel writes only the
    input gradient."""
    x = dims(arch, training, parallel)
    wide = 3 * FP32 if arch.norm == "rmsnorm" else x.a
    return (x.a + wide) * x.tokens * x.h // x.sp


def final_norm_bytes(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> int:
    return _norm_bytes(arch, dims(arch, training, parallel))


def persistent_buffer_bytes(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> int:
    """Megatron-core's buffers that live from the first step on beside the model states (trace path findings
    M3 and M4, benchmarks/results/marp_vs_trace.md):

    * the global memory buffer (``parallel_state.get_global_memory_buffer()``, ``GlobalMemoryBuffer`` in
      ``megatron/core/utils.py``): one tensor per (name, dtype), grown to the largest request and never
      freed. Under sequence parallelism the column-parallel linears all-gather their input into its "mpu"
      tensor (``LinearWithGradAccumulationAndAsyncCommunication``, ``tensor_parallel/layers.py``:
      ``a * tokens * h``, the whole sequence); eager attention takes its ``[b * heads / tp, s, s]`` score
      matrix from the same "mpu" tensor (``DotProductAttention.forward``): the larger of the two;
    * the RoPE table ``[s, 1, 1, d]`` in fp32 that ``RotaryEmbedding.forward`` keeps in its ``lru_cache``
      (``models/common/embeddings/rotary_pos_embedding.py``).

    0 for the other runtimes and for the reference decoder (:func:`native_operators`)."""
    if not profile(training.runtime).global_memory_buffer or NATIVE_OPS.get():
        return 0
    x = dims(arch, training, parallel)
    gather = x.a * x.tokens * x.h if parallel.sequence_parallel and parallel.tp > 1 else 0
    scores = x.a * x.b * x.heads * x.s * x.s if parallel.attention == "eager" else 0
    rope = FP32 * x.s * arch.kv_channels if arch.position_embedding == "rope" else 0
    return max(gather, scores) + rope


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivationTerms:
    """Every activation term of one micro-batch on one rank, computed once per shape (see
    :func:`activation_terms`)."""

    layer: int
    mlp_part: int
    recompute: int
    embedding: int
    loss: int
    loss_backward: int
    norm_backward: int
    final_norm: int
    block_incoming_grad: int
    block_ffn_grad: int
    block_ffn_wide: int
    logits_grad: int = 0
    """The 16-bit gradient of the logits, ``a x tokens x V / tp``, alive through the output layer's backward."""
    loss_chunk: int = 0
    """The largest moment inside one chunk of a chunked loss (:func:`loss_chunk_bytes`; 0 unchunked)."""
    persistent: int = 0
    """Runtime buffers kept across steps beside the model states (:func:`persistent_buffer_bytes`)."""
    layer_persistent: int = 0
    """Such buffers per transformer block of the stage (:func:`layer_buffer_bytes`)."""

    def block_backward(self, weight_grad_bytes: int) -> int:
        """:func:`layer_backward_transient_bytes` from the cached parts."""
        return self.block_incoming_grad + max(
            self.block_ffn_wide * self.block_ffn_grad, self.block_ffn_grad + weight_grad_bytes
        )


_CACHE_TRAINING = TrainingConfig()
_CACHE_PARALLEL = ParallelConfig()


def activation_terms(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> ActivationTerms:
    """All terms for the shape that ``training`` and ``parallel`` give one rank. Memoised on the fields
    activations depend on (not dp, pp, vpp, ZeRO stage, batch totals or runtime), so a plan search computes
    each shape once."""
    p = parallel
    key = (arch, training.seq_len, training.micro_batch_size, training.precision, training.runtime, p.tp, p.cp, p.ep)
    return _activation_terms(
        (*key, p.sequence_parallel, p.recompute, p.attention, NATIVE_OPS.get(), loss_chunks(training))
    )


def activation_terms_for(
    arch: ModelArch,
    training: TrainingConfig,
    *,
    micro_batch_size: int,
    tp: int,
    cp: int,
    ep: int,
    sp: bool,
    recompute: str,
) -> ActivationTerms:
    """:func:`activation_terms` from the fields alone (no :class:`ParallelConfig` to build)."""
    key = (arch, training.seq_len, micro_batch_size, training.precision, training.runtime, tp, cp, ep, sp, recompute)
    return _activation_terms((*key, "flash", NATIVE_OPS.get(), loss_chunks(training)))


@functools.lru_cache(maxsize=65536)
def _activation_terms(key: tuple[Any, ...]) -> ActivationTerms:
    arch, seq_len, mb, precision, runtime, tp, cp, ep, sp, recompute, attention, _native, chunks = key
    training = replace(
        _CACHE_TRAINING,
        seq_len=seq_len,
        micro_batch_size=mb,
        global_batch_size=mb,
        precision=precision,
        runtime=runtime,
        loss_chunks=chunks,
    )
    parallel = replace(
        _CACHE_PARALLEL,
        tp=tp,
        cp=cp,
        ep=ep,
        dp=ep,
        sequence_parallel=sp,
        recompute=recompute,
        attention=attention,
    )
    incoming, ffn_grad, wide = _block_backward_parts(arch, training, parallel)
    return ActivationTerms(
        layer=layer_bytes(arch, training, parallel),
        mlp_part=mlp_part_bytes(arch, training, parallel),
        recompute=recompute_bytes(arch, training, parallel),
        embedding=embedding_bytes(arch, training, parallel),
        loss=loss_bytes(arch, training, parallel),
        loss_backward=loss_backward_transient_bytes(arch, training, parallel),
        norm_backward=norm_backward_transient_bytes(arch, training, parallel),
        final_norm=final_norm_bytes(arch, training, parallel),
        block_incoming_grad=incoming,
        block_ffn_grad=ffn_grad,
        block_ffn_wide=wide,
        logits_grad=logits_grad_bytes(arch, training, parallel),
        loss_chunk=loss_chunk_bytes(arch, training, parallel),
        persistent=persistent_buffer_bytes(arch, training, parallel),
        layer_persistent=layer_buffer_bytes(arch, training, parallel),
    )
