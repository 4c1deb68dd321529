"""A pure-PyTorch reference decoder built from a :class:`ModelArch`, optionally as one parallel shard.

The module is what the validation harness trains to measure peak memory, so every layer is written to be
the plain PyTorch a training framework would run: GQA attention with RoPE (Su et al. 2021) or learned
positions, SwiGLU (Shazeer 2020) or GeLU MLP, RMSNorm or LayerNorm, tied or untied embeddings and an
optional mixture-of-experts MLP. A :class:`ShardSpec` builds the slice one rank holds: a contiguous range of
layers (pipeline stage), Megatron-style tensor-parallel widths (heads, ffn and vocabulary divided by ``tp``)
and the local experts of an expert-parallel rank. Collectives are not run: shapes are what each rank holds.

The MoE layer routes with fixed expert capacity, ``C = ceil(top_k * tokens / num_experts)`` tokens per
expert (GShard, Lepikhin et al. 2020, capacity factor 1.0), chosen per expert by router score (expert-choice
selection, Zhou et al. 2022), so shapes are static and the module runs under ``FakeTensorMode``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from frenzy_opt.models.arch import ModelArch

ATTENTION_KINDS = ("flash", "eager")
RECOMPUTE_KINDS = ("none", "selective", "full")


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardSpec:
    """Which part of the model one rank holds. ``num_layers=None`` means all layers from ``first_layer``."""

    tp: int = 1
    ep: int = 1
    first_layer: int = 0
    num_layers: int | None = None
    has_embedding: bool = True
    has_output: bool = True


class _RMSNormFunction(torch.autograd.Function):
    """RMSNorm (Zhang & Sennrich 2019, Eq. 4) that keeps only its input and the per-token reciprocal RMS
    for backward, as fused kernels do (Apex ``FusedRMSNorm``, Transformer Engine ``RMSNorm``)."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:  # type: ignore[override]
        wide = torch.promote_types(x.dtype, torch.float32)
        rstd = torch.rsqrt(x.to(wide).pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (x.to(wide) * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, None]:  # type: ignore[override]
        x, weight, rstd = ctx.saved_tensors  # type: ignore[attr-defined]
        wide = rstd.dtype
        # Three wide (fp32) temporaries at most: the normalised input, the scaled gradient, one product.
        normed = x.to(wide, copy=True).mul_(rstd)
        g = grad.to(wide, copy=True)
        grad_weight = (g * normed).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
        g.mul_(weight.to(wide))
        # d/dx of x * rstd(x) applied to g: rstd * (g - normed * mean(g * normed)).
        dot = (g * normed).mean(-1, keepdim=True)
        grad_x = g.sub_(normed.mul_(dot)).mul_(rstd)
        return grad_x.to(x.dtype), grad_weight, None


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _RMSNormFunction.apply(x, self.weight, self.eps)
        return out


def _norm(arch: ModelArch) -> nn.Module:
    if arch.norm == "rmsnorm":
        return RMSNorm(arch.hidden_size, eps=1e-5)
    return nn.LayerNorm(arch.hidden_size, eps=1e-5)


class Attention(nn.Module):
    """Causal self-attention over the rank's ``num_attention_heads / tp`` heads."""

    def __init__(self, arch: ModelArch, tp: int, attention: str) -> None:
        super().__init__()
        d = arch.kv_channels
        self.num_heads = arch.num_attention_heads // tp
        self.num_kv_heads = max(arch.num_kv_heads // tp, 1)
        self.head_dim = d
        self.attention = attention
        self.use_rope = arch.position_embedding == "rope"
        qkv_bias = arch.qkv_bias or arch.linear_bias
        self.wq = nn.Linear(arch.hidden_size, self.num_heads * d, bias=qkv_bias)
        self.wk = nn.Linear(arch.hidden_size, self.num_kv_heads * d, bias=qkv_bias)
        self.wv = nn.Linear(arch.hidden_size, self.num_kv_heads * d, bias=qkv_bias)
        self.wo = nn.Linear(self.num_heads * d, arch.hidden_size, bias=arch.linear_bias)
        self.selective_recompute = False

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = _apply_rope(q, rope), _apply_rope(k, rope)
        if self.selective_recompute:
            # Selective recompute of the attention core (Korthikanti et al. 2022, Sec. 5).
            out = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            out = self._core(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim))

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.attention == "flash":
            # Memory-efficient exact attention (Dao et al. 2022): no s x s matrix is kept.
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        s = q.shape[2]
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        # Softmax in fp32, probabilities cast back (the eager attention of common training code).
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(probs, v)


def _apply_rope(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotary position embedding, rotate-half form (Su et al. 2021, Eq. 34)."""
    cos, sin = rope
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class MLP(nn.Module):
    """Dense MLP over ``ffn / tp`` columns: SwiGLU or GeLU."""

    def __init__(self, arch: ModelArch, ffn: int, tp: int) -> None:
        super().__init__()
        f_local = ffn // tp
        self.swiglu = arch.mlp == "swiglu"
        bias = arch.linear_bias
        self.up = nn.Linear(arch.hidden_size, f_local, bias=bias)
        self.gate = nn.Linear(arch.hidden_size, f_local, bias=bias) if self.swiglu else None
        self.down = nn.Linear(f_local, arch.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class MoE(nn.Module):
    """Mixture of experts with a replicated router and the rank's ``num_experts / ep`` local experts."""

    def __init__(self, arch: ModelArch, tp: int, ep: int) -> None:
        super().__init__()
        self.num_experts = arch.num_experts
        self.top_k = arch.moe_top_k
        self.first_local = 0
        self.router = nn.Linear(arch.hidden_size, arch.num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(arch, arch.expert_ffn_size, tp) for _ in range(arch.num_experts // ep))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        tokens = x.reshape(b * s, h)
        probs = torch.softmax(self.router(tokens), dim=-1, dtype=torch.float32)
        capacity = math.ceil(self.top_k * b * s / self.num_experts)
        out = torch.zeros_like(tokens)
        for i, expert in enumerate(self.experts):
            weight, index = torch.topk(probs[:, self.first_local + i], capacity)
            picked = tokens.index_select(0, index)
            y = expert(picked) * weight.to(tokens.dtype).unsqueeze(-1)
            out = out.index_add(0, index, y)
        return out.view(b, s, h)


class Block(nn.Module):
    """Pre-norm transformer block (Xiong et al. 2020)."""

    def __init__(self, arch: ModelArch, shard: ShardSpec, attention: str) -> None:
        super().__init__()
        self.norm1 = _norm(arch)
        self.attn = Attention(arch, shard.tp, attention)
        self.norm2 = _norm(arch)
        self.mlp: nn.Module = (
            MoE(arch, shard.tp, shard.ep) if arch.is_moe else MLP(arch, arch.ffn_hidden_size, shard.tp)
        )

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope)
        return x + self.mlp(self.norm2(x))


class ReferenceDecoder(nn.Module):
    """The layers of one shard of ``arch``. First stage takes token ids, later stages hidden states."""

    def __init__(
        self,
        arch: ModelArch,
        shard: ShardSpec | None = None,
        *,
        attention: str = "flash",
        recompute: str = "none",
        max_seq_len: int = 0,
    ) -> None:
        super().__init__()
        if attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION_KINDS)}, got {attention!r}")
        if recompute not in RECOMPUTE_KINDS:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE_KINDS)}, got {recompute!r}")
        shard = shard or ShardSpec()
        self.arch, self.shard, self.recompute = arch, shard, recompute
        num_layers = shard.num_layers if shard.num_layers is not None else arch.num_layers - shard.first_layer
        vocab_local = math.ceil(arch.vocab_size / shard.tp)
        self.embed = nn.Embedding(vocab_local, arch.hidden_size) if shard.has_embedding else None
        self.pos_embed = (
            nn.Embedding(arch.max_position_embeddings, arch.hidden_size)
            if shard.has_embedding and arch.position_embedding == "learned"
            else None
        )
        self.layers = nn.ModuleList(Block(arch, shard, attention) for _ in range(num_layers))
        for layer in self.layers:
            layer.attn.selective_recompute = recompute == "selective"
        self.final_norm = _norm(arch) if shard.has_output else None
        self.output: nn.Linear | None = None
        if shard.has_output:
            self.output = nn.Linear(arch.hidden_size, vocab_local, bias=False)
            if arch.tied_embeddings and self.embed is not None:
                self.output.weight = self.embed.weight
        rope_len = max(max_seq_len, 1) if arch.position_embedding == "rope" else 0
        self.register_buffer("rope_cos", torch.empty(rope_len, arch.kv_channels), persistent=False)
        self.register_buffer("rope_sin", torch.empty(rope_len, arch.kv_channels), persistent=False)
        self._init_rope()

    def _init_rope(self) -> None:
        if self.rope_cos.shape[0] == 0 or self.rope_cos.is_meta:
            return
        d = self.arch.kv_channels
        # RoPE frequencies theta_i = 10000^(-2i/d) (Su et al. 2021, Eq. 15).
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        angles = torch.outer(torch.arange(self.rope_cos.shape[0], dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.rope_cos.copy_(angles.cos())
        self.rope_sin.copy_(angles.sin())

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids ``(b, s)`` (first stage) or hidden states ``(b, s, h)``; returns the mean loss when the
        shard has the output layer and ``targets`` are given, else the hidden states."""
        if self.embed is not None:
            x = self.embed(inputs)
            if self.pos_embed is not None:
                x = x + self.pos_embed(torch.arange(inputs.shape[1], device=inputs.device))
        else:
            x = inputs
        rope = None
        if self.rope_cos.shape[0]:
            s = x.shape[1]
            rope = (self.rope_cos[:s].to(x.dtype), self.rope_sin[:s].to(x.dtype))
        for layer in self.layers:
            if self.recompute == "full":
                # Full recompute keeps only each block's input (Chen et al. 2016; Korthikanti et al. 2022).
                x = checkpoint(layer, x, rope, use_reentrant=False)
            else:
                x = layer(x, rope)
        if self.output is None or self.final_norm is None:
            return x
        logits = self.output(self.final_norm(x))
        if targets is None:
            return logits
        # Cross-entropy on fp32 logits (the upcast common training code does before the loss).
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

    def num_params(self) -> int:
        """Distinct parameters (tied weights counted once)."""
        return sum(p.numel() for p in self.parameters())
