"""LLM decoder architecture description and exact parameter counting.

An :class:`ModelArch` holds the architecture fields of contract 1 (see ``docs/architecture.md``, Contracts) plus the few
extra fields needed to count parameters exactly for the catalogue models (head dimension, biases, learned
position embeddings). Counting follows the layer definitions of the reference decoder in
:mod:`frenzy_opt.models.reference`, so ``ModelArch.num_params`` equals the parameter count of the built
PyTorch module exactly (checked in the tests).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from typing import Any

MLP_KINDS = ("swiglu", "gelu")
NORM_KINDS = ("rmsnorm", "layernorm")
POSITION_KINDS = ("rope", "learned")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelArch:
    """A decoder-only transformer. Sizes are counts of elements, not bytes."""

    num_layers: int
    """Transformer blocks."""
    hidden_size: int
    """Width of the residual stream (the embedding dimension)."""
    ffn_hidden_size: int
    """Inner width of each dense MLP."""
    num_attention_heads: int
    """Query heads per attention layer."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention; equal to the query heads for multi-head attention). It
    divides the query heads."""
    vocab_size: int
    """Tokens in the vocabulary: rows of the embedding and the output layer."""
    mlp: str = "swiglu"
    """MLP kind: swiglu (gate, up and down projections) or gelu (up and down)."""
    norm: str = "rmsnorm"
    """Normalisation: rmsnorm (a scale) or layernorm (a scale and a bias)."""
    tied_embeddings: bool = False
    """The output layer reuses the input embedding's weights."""
    num_experts: int = 1
    """Experts per MLP layer (1: a dense model; more: mixture of experts)."""
    moe_top_k: int = 1
    """Experts each token is routed to (at most ``num_experts``)."""
    moe_ffn_hidden_size: int | None = None
    """Inner width of each expert's MLP (None: ``ffn_hidden_size``)."""
    name: str = "inline"
    """The model's name (a catalogue entry's name; inline architectures are called inline unless named)."""
    head_dim: int | None = None
    """Per-head dimension (None: ``hidden_size / num_attention_heads``, which must then divide evenly)."""
    qkv_bias: bool = False
    """The query, key and value projections have biases."""
    linear_bias: bool = False
    """Every linear layer has a bias (attention and MLP)."""
    position_embedding: str = "rope"
    """Positions: rope (rotary, no parameters) or learned (a table of ``max_position_embeddings`` rows)."""
    max_position_embeddings: int = 4096
    """Rows of the learned position table (counted only with ``position_embedding: learned``)."""
    hidden_dropout: float = 0.0
    """Dropout on each block's attention and MLP outputs (and the embedding); a kept mask per element."""
    attention_dropout: float = 0.0
    """Dropout on the attention probabilities (eager attention keeps its mask; flash attention regenerates
    it from the RNG state, Dao et al. 2022, Sec. 3.1)."""

    def __post_init__(self) -> None:
        validate_arch(self)

    @property
    def kv_channels(self) -> int:
        """Per-head dimension d (hidden / heads unless the model sets it)."""
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def expert_ffn_size(self) -> int:
        return self.moe_ffn_hidden_size if self.moe_ffn_hidden_size is not None else self.ffn_hidden_size

    @property
    def num_params(self) -> int:
        """Total parameters, each counted once (tied embeddings shared)."""
        counts = shard_param_counts(self, tp=1, ep=1)
        return counts.embedding + self.num_layers * counts.per_layer + counts.final_norm + counts.output

    @property
    def num_active_params(self) -> int:
        """Parameters touched per token (MoE: only ``moe_top_k`` experts)."""
        if not self.is_moe:
            return self.num_params
        inactive = (self.num_experts - self.moe_top_k) * _mlp_params(self, self.expert_ffn_size, 1)
        return self.num_params - self.num_layers * inactive

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardParamCounts:
    """Parameters held by one tensor/expert-parallel rank, by part of the model.

    ``per_layer`` is one transformer block; ``output_if_untied`` is the output layer a pipeline's last stage
    holds even for tied embeddings when the embedding lives on another stage (Megatron keeps a copy there).
    """

    embedding: int
    per_layer: int
    final_norm: int
    output: int
    output_if_untied: int
    expert_per_layer: int = 0
    """The part of ``per_layer`` in expert MLPs: replicated over dp / ep ranks only, so ZeRO/FSDP shards it
    over the expert-data-parallel group (Megatron-core ``expert_data_parallel``; torchtitan's ``dp_shard_mod_ep``
    mesh), not over all of dp."""


def _norm_params(arch: ModelArch) -> int:
    # RMSNorm has a scale only (Zhang & Sennrich 2019); LayerNorm a scale and a bias (Ba et al. 2016).
    return arch.hidden_size if arch.norm == "rmsnorm" else 2 * arch.hidden_size


def _mlp_params(arch: ModelArch, ffn: int, tp: int) -> int:
    """One dense MLP, column-parallel up/gate and row-parallel down (Shoeybi et al. 2019, Sec. 3)."""
    h, f_local = arch.hidden_size, ffn // tp
    # SwiGLU has gate, up and down projections (Shazeer 2020); GeLU MLP has up and down (Radford et al. 2019).
    weights = (3 if arch.mlp == "swiglu" else 2) * h * f_local
    biases = 0
    if arch.linear_bias:
        biases = (2 if arch.mlp == "swiglu" else 1) * f_local + h
    return weights + biases


def _attention_params(arch: ModelArch, tp: int) -> int:
    """QKV (column-parallel, GQA: kv heads shared, Ainslie et al. 2023) and output projection (row-parallel)."""
    h, d = arch.hidden_size, arch.kv_channels
    q_local = arch.num_attention_heads // tp * d
    kv_local = max(arch.num_kv_heads // tp, 1) * d
    weights = h * q_local + 2 * h * kv_local + q_local * h
    biases = 0
    if arch.qkv_bias or arch.linear_bias:
        biases += q_local + 2 * kv_local
    if arch.linear_bias:
        biases += h
    return weights + biases


@functools.lru_cache(maxsize=4096)
def shard_param_counts(arch: ModelArch, *, tp: int, ep: int) -> ShardParamCounts:
    """Parameters on one rank of a ``tp`` x ``ep`` shard (Megatron-LM layout, Shoeybi et al. 2019).

    Vocabulary-parallel embedding and output layer hold ``ceil(V / tp)`` rows each; experts are divided
    over ``ep`` ranks and each expert's MLP is tensor-parallel over ``tp`` as well. Cached (exact integers
    of the architecture's fields): a plan search reads :attr:`ModelArch.num_params` twice per candidate it
    prices (:func:`frenzy_opt.prediction.stepterms.step_terms_of`).
    """
    h = arch.hidden_size
    vocab_local = math.ceil(arch.vocab_size / tp)
    norm = _norm_params(arch)
    experts = 0
    if arch.is_moe:
        experts = arch.num_experts // ep * _mlp_params(arch, arch.expert_ffn_size, tp)
        # Router: one h x E linear, replicated on every rank (Fedus et al. 2021, Switch Transformer).
        router = h * arch.num_experts
        mlp = experts + router
    else:
        mlp = _mlp_params(arch, arch.ffn_hidden_size, tp)
    per_layer = _attention_params(arch, tp) + mlp + 2 * norm
    embedding = vocab_local * h
    if arch.position_embedding == "learned":
        embedding += arch.max_position_embeddings * h
    output_untied = vocab_local * h
    return ShardParamCounts(
        embedding=embedding,
        per_layer=per_layer,
        final_norm=norm,
        output=0 if arch.tied_embeddings else output_untied,
        output_if_untied=output_untied,
        expert_per_layer=experts,
    )


def validate_arch(arch: ModelArch) -> None:
    """Raise ``ValueError`` naming the field and allowed values for an impossible architecture."""
    positive = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads")
    for name in (*positive, "vocab_size", "num_experts", "moe_top_k", "max_position_embeddings"):
        value = getattr(arch, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"model.{name} must be a positive integer, got {value!r}")
    if arch.mlp not in MLP_KINDS:
        raise ValueError(f"model.mlp must be one of {', '.join(MLP_KINDS)}, got {arch.mlp!r}")
    if arch.norm not in NORM_KINDS:
        raise ValueError(f"model.norm must be one of {', '.join(NORM_KINDS)}, got {arch.norm!r}")
    if arch.position_embedding not in POSITION_KINDS:
        raise ValueError(
            f"model.position_embedding must be one of {', '.join(POSITION_KINDS)}, got {arch.position_embedding!r}"
        )
    if arch.num_attention_heads % arch.num_kv_heads:
        raise ValueError(
            f"model.num_kv_heads ({arch.num_kv_heads}) must divide num_attention_heads ({arch.num_attention_heads})"
        )
    if arch.head_dim is None and arch.hidden_size % arch.num_attention_heads:
        raise ValueError(
            f"model.hidden_size ({arch.hidden_size}) must be a multiple of num_attention_heads "
            f"({arch.num_attention_heads}) unless model.head_dim is given"
        )
    for name in ("hidden_dropout", "attention_dropout"):
        value = getattr(arch, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < 1.0:
            raise ValueError(f"model.{name} must be a number in [0, 1), got {value!r}")
    if arch.moe_top_k > arch.num_experts:
        raise ValueError(f"model.moe_top_k ({arch.moe_top_k}) must be <= num_experts ({arch.num_experts})")
    if arch.moe_ffn_hidden_size is not None and arch.moe_ffn_hidden_size < 1:
        raise ValueError(
            f"model.moe_ffn_hidden_size must be a positive integer or null, got {arch.moe_ffn_hidden_size}"
        )


def layer_weight_shapes(arch: ModelArch, *, tp: int, ep: int) -> list[tuple[int, ...]]:
    """Shapes of the parameters of one block on one ``tp`` x ``ep`` rank, as the reference decoder holds
    them (``out x in`` for linears). Used for factored optimizer states and per-tensor transients."""
    h, d = arch.hidden_size, arch.kv_channels
    q_local, kv_local = arch.num_attention_heads // tp * d, max(arch.num_kv_heads // tp, 1) * d
    qkv_bias = arch.qkv_bias or arch.linear_bias
    shapes: list[tuple[int, ...]] = [(q_local, h), (kv_local, h), (kv_local, h), (h, q_local)]
    if qkv_bias:
        shapes += [(q_local,), (kv_local,), (kv_local,)]
    if arch.linear_bias:
        shapes.append((h,))
    norm = [(h,)] if arch.norm == "rmsnorm" else [(h,), (h,)]
    shapes += norm * 2

    def mlp(ffn: int) -> list[tuple[int, ...]]:
        f_local = ffn // tp
        out: list[tuple[int, ...]] = [(f_local, h), (h, f_local)]
        if arch.mlp == "swiglu":
            out.append((f_local, h))
        if arch.linear_bias:
            out += [(f_local,), (h,)] + ([(f_local,)] if arch.mlp == "swiglu" else [])
        return out

    if arch.is_moe:
        shapes.append((arch.num_experts, h))
        for _ in range(arch.num_experts // ep):
            shapes += mlp(arch.expert_ffn_size)
    else:
        shapes += mlp(arch.ffn_hidden_size)
    return shapes
