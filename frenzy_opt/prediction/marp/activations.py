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
* the loss keeps the final norm, the output-layer input and fp32 log-probabilities (``4 * tokens * vocab``).

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

from frenzy_opt.core.spec import ParallelConfig, TrainingConfig
from frenzy_opt.models.arch import ModelArch
from frenzy_opt.prediction.marp.layout import fp8_saves_fp8_inputs

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
    under fsdp2 keeps the 16-bit input: see :func:`frenzy_opt.prediction.marp.layout.fp8_saves_fp8_inputs`)."""
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
    d = arch.kv_channels
    s = math.ceil(training.seq_len / parallel.cp)
    a = 4 if training.precision == "fp32" else 2
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
        a_linear=1 if training.precision == "fp8" and fp8_saves_fp8_inputs(training.runtime) else a,
        sp=tp if parallel.sequence_parallel else 1,
        sp_linear=tp if parallel.sequence_parallel and training.runtime != "fsdp2" else 1,
        runtime=training.runtime,
        fused_swiglu=training.runtime == "megatron" and not NATIVE_OPS.get(),
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
    if recompute == "selective":
        return 0
    if attention == "flash":
        # Log-sum-exp per query row, fp32 (Dao et al. 2022, Alg. 2 output L).
        return FP32 * x.b * x.heads * x.s
    probs = x.b * x.heads * x.s * x.s
    expanded_kv = 2 * x.a * x.tokens * (x.hq - x.hkv)
    native = NATIVE_OPS.get()
    softmax = FP32 if x.a == FP32 or x.runtime == "hf" or native else x.a
    if arch.attention_dropout > 0:
        matmul_input = MASK + x.a
    else:
        matmul_input = 0 if softmax == x.a else x.a
    # The reference decoder builds its s x s boolean causal mask in each attention call; the runtimes keep
    # one shared mask (Megatron) or none (flash kernels, Hugging Face's additive b x 1 x 1 x s mask).
    causal_mask = x.s * x.s if native else 0
    return (softmax + matmul_input) * probs + causal_mask + expanded_kv


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
    if parallel.recompute == "full":
        return x.a * x.tokens * x.h // x.sp
    if parallel.recompute == "selective" and x.runtime == "fsdp2":
        return op_sac_bytes(arch, x)
    qkv = x.a * x.tokens * (x.hq + 2 * x.hkv)
    if x.runtime == "megatron" and arch.position_embedding == "rope" and not NATIVE_OPS.get():
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
    selective_sac = parallel.recompute == "selective" and training.runtime == "fsdp2"
    if parallel.recompute != "full" and not selective_sac:
        return 0
    full = ParallelConfig(**{**parallel.to_dict(), "recompute": "none"})
    return layer_bytes(arch, training, full)


def embedding_bytes(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> int:
    """Token ids kept by the embedding backward (and position ids for learned positions)."""
    x = dims(arch, training, parallel)
    positions = INDEX_BYTES * x.s if arch.position_embedding == "learned" else 0
    dropout = MASK * x.tokens * x.h // x.sp if arch.hidden_dropout > 0 else 0
    return INDEX_BYTES * x.tokens + positions + dropout


def loss_bytes(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> int:
    """Final norm, output-layer input, fp32 log-probabilities and targets kept for backward."""
    x = dims(arch, training, parallel)
    return _norm_bytes(arch, x) + x.a_linear * x.tokens * x.h + FP32 * x.tokens * x.vocab + INDEX_BYTES * x.tokens


def logits_grad_bytes(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> int:
    x = dims(arch, training, parallel)
    return x.a * x.tokens * x.vocab


def fused_cross_entropy(runtime: str) -> bool:
    """Megatron-core's vocab-parallel cross entropy (``_VocabParallelCrossEntropy``) works in place on the
    fp32 logits and saves their softmax; its backward turns that softmax into the gradient in place."""
    return runtime == "megatron" and not NATIVE_OPS.get()


def loss_backward_transient_bytes(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> int:
    """Backward of the loss: the fp32 gradient of the log-probabilities and of the logits exist together
    with the kept log-probabilities (``nll_loss`` then ``log_softmax`` backward), ``8 * tokens * vocab``."""
    x = dims(arch, training, parallel)
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
    return _activation_terms((*key, p.sequence_parallel, p.recompute, p.attention, NATIVE_OPS.get()))


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
    return _activation_terms((*key, "flash", NATIVE_OPS.get()))


@functools.lru_cache(maxsize=65536)
def _activation_terms(key: tuple[Any, ...]) -> ActivationTerms:
    arch, seq_len, mb, precision, runtime, tp, cp, ep, sp, recompute, attention, _native = key
    training = replace(
        _CACHE_TRAINING,
        seq_len=seq_len,
        micro_batch_size=mb,
        global_batch_size=mb,
        precision=precision,
        runtime=runtime,
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
    )
