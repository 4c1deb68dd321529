"""Model FLOPs of a training step and a GPU type's dense peak rate per number format.

:func:`step_flops` counts what Megatron-LM reports as model FLOPs (Narayanan et al. 2021, Eq. 3, with the
recompute chosen), :func:`peak_tflops` the dense peak a utilisation figure divides by.
"""

from __future__ import annotations

import functools

from frenzy_opt.core.enums import Precision, Recompute
from frenzy_opt.core.spec import ParallelConfig, TrainingConfig
from frenzy_opt.hardware.gpus import GpuType
from frenzy_opt.models.arch import ModelArch

__all__ = ["forward_flops_per_token", "peak_tflops", "step_flops"]


def peak_tflops(gpu: GpuType, precision: str) -> float:
    """Dense peak of ``gpu`` for ``precision`` (fp32 trains on TF32 tensor cores where they exist)."""
    if precision == Precision.BF16:
        value = gpu.bf16_tflops
    elif precision == Precision.FP8:
        value = gpu.fp8_tflops
    elif precision == Precision.FP32:
        value = gpu.tf32_tflops or gpu.fp32_tflops
    else:
        value = gpu.fp16_tflops
    if value is None:  # no tensor cores for this format: run it at fp16's rate (see candidates.effective_precision)
        value = gpu.fp16_tflops
    return float(value)


@functools.lru_cache(maxsize=1024)
def forward_flops_per_token(arch: ModelArch, seq_len: int) -> tuple[float, float]:
    """(dense forward FLOPs per token, the attention core's share), Narayanan et al. 2021, Eq. 3: two FLOPs
    per multiply-add over the active matmul weights (output layer included, embedding lookup not) and
    ``4 s (heads x head_dim)`` per layer for QK^T and attention x V. Cached: a plan search reads it once per
    candidate it prices (:func:`step_flops`), always for the same model and sequence length."""
    # Active parameters less the embedding table(s); an untied output layer is among them, a tied one
    # shares the table's weights but multiplies all the same.
    matmul_params = arch.num_active_params - _embedding_params(arch)
    if arch.tied_embeddings:
        matmul_params += arch.vocab_size * arch.hidden_size
    attention = 4.0 * seq_len * arch.num_attention_heads * arch.kv_channels * arch.num_layers
    return 2.0 * matmul_params + attention, attention


def _embedding_params(arch: ModelArch) -> int:
    positions = arch.max_position_embeddings * arch.hidden_size if arch.position_embedding == "learned" else 0
    return arch.vocab_size * arch.hidden_size + positions


def step_flops(arch: ModelArch, training: TrainingConfig, parallel: ParallelConfig) -> float:
    """Model FLOPs of one step: forward + 2x backward (+ recomputed forward or attention core)."""
    per_token, attention = forward_flops_per_token(arch, training.seq_len)
    factor = 3.0 * per_token
    if parallel.recompute == Recompute.FULL:
        factor += per_token
    elif parallel.recompute == Recompute.SELECTIVE:
        factor += attention
    return factor * training.global_batch_size * training.seq_len
