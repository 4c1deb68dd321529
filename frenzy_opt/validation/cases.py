"""The configurations MARP is validated on: sizes, sequence lengths, micro-batches, precisions,
recompute, attention kernels, GQA, MoE, tied embeddings, and tp/pp/cp/ep/ZeRO through per-rank shapes.

Each case is a contract-1 job spec (the Megatron-style runtime, the one the harness emulates). The same
list drives the tests (``tests/test_validation.py``) and the report (``python -m
frenzy_opt.validation.harness_report``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from frenzy_opt.core.spec import JobSpec, parse_job

# A small LLaMA-style model (GQA 16/4, SwiGLU, RMSNorm, RoPE): fast to run, every term visible.
SMALL: dict[str, Any] = {
    "num_layers": 4,
    "hidden_size": 1024,
    "ffn_hidden_size": 2816,
    "num_attention_heads": 16,
    "num_kv_heads": 4,
    "vocab_size": 32000,
}
# A small GPT-style model: LayerNorm, GeLU, biases, learned positions, tied embeddings, MHA.
SMALL_GPT: dict[str, Any] = {
    **SMALL,
    "num_kv_heads": 16,
    "ffn_hidden_size": 4096,
    "mlp": "gelu",
    "norm": "layernorm",
    "linear_bias": True,
    "position_embedding": "learned",
    "max_position_embeddings": 2048,
    "tied_embeddings": True,
    "vocab_size": 50257,
}
SMALL_MOE: dict[str, Any] = {**SMALL, "num_experts": 4, "moe_top_k": 2, "moe_ffn_hidden_size": 1408}


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    name: str
    spec: dict[str, Any]

    def job(self) -> JobSpec:
        return parse_job({"name": self.name, **self.spec})


def _case(name: str, model: str | dict[str, Any], parallel: dict[str, Any] | None = None, **training: Any) -> Case:
    train = {"seq_len": 1024, "micro_batch_size": 2, "global_batch_size": 64, "precision": "bf16", **training}
    return Case(name=name, spec={"model": model, "training": train, "parallel": parallel or {}})


CASES: tuple[Case, ...] = (
    _case("small-base", SMALL),
    _case("small-seq512", SMALL, seq_len=512),
    _case("small-seq2048", SMALL, seq_len=2048),
    _case("small-mb1", SMALL, micro_batch_size=1),
    _case("small-mb4", SMALL, micro_batch_size=4),
    _case("small-vocab1k", {**SMALL, "vocab_size": 1000}),
    _case("small-fp16", SMALL, precision="fp16"),
    _case("small-fp32", SMALL, precision="fp32"),
    _case("small-fp32-tp2", SMALL, {"tp": 2}, precision="fp32"),
    _case("small-eager-gqa", SMALL, {"attention": "eager"}),
    _case("small-eager-mha", {**SMALL, "num_kv_heads": 16}, {"attention": "eager"}),
    _case("small-selective", SMALL, {"recompute": "selective"}),
    _case("small-eager-selective", SMALL, {"attention": "eager", "recompute": "selective"}),
    _case("small-full", SMALL, {"recompute": "full"}),
    _case("small-full-eager", SMALL, {"attention": "eager", "recompute": "full"}),
    _case("small-tp2", SMALL, {"tp": 2}),
    _case("small-tp4", SMALL, {"tp": 4}),
    _case("small-pp2", SMALL, {"pp": 2}),
    _case("small-pp4-dp2-zero1", SMALL, {"pp": 4, "dp": 2, "zero_stage": 1}),
    _case("small-pp2-full", SMALL, {"pp": 2, "recompute": "full"}),
    _case("small-dp4-zero1", SMALL, {"dp": 4, "zero_stage": 1}),
    _case("small-dp8-tp2-zero1", SMALL, {"dp": 8, "tp": 2, "zero_stage": 1}),
    _case("small-cp2", SMALL, {"cp": 2}, seq_len=2048),
    _case("small-gpt", SMALL_GPT),
    _case("small-gpt-eager", SMALL_GPT, {"attention": "eager"}),
    _case("small-gpt-pp2-tied", SMALL_GPT, {"pp": 2}),
    _case("small-moe", SMALL_MOE),
    _case("small-moe-ep2", {**SMALL_MOE, "num_experts": 8}, {"dp": 2, "ep": 2, "zero_stage": 1}),
    _case("gpt3-125m", "gpt3-125m", seq_len=2048, micro_batch_size=4),
    _case("gpt3-1.3b-tp2-pp4", "gpt3-1.3b", {"tp": 2, "pp": 4}, seq_len=2048),
    _case("qwen2.5-0.5b-pp2-tied", "qwen2.5-0.5b", {"pp": 2}, seq_len=2048, micro_batch_size=1),
    _case(
        "llama2-7b-tp4-pp4-dp2",
        "llama2-7b",
        {"tp": 4, "pp": 4, "dp": 2, "zero_stage": 1},
        seq_len=4096,
        micro_batch_size=1,
    ),
    _case(
        "llama3-8b-tp8-pp8",
        "llama3-8b",
        {"tp": 8, "pp": 8, "dp": 4, "zero_stage": 1},
        seq_len=8192,
        micro_batch_size=1,
    ),
    _case(
        "mistral-7b-tp4-pp8-cp2",
        "mistral-7b",
        {"tp": 4, "pp": 8, "cp": 2, "recompute": "selective"},
        seq_len=8192,
        micro_batch_size=1,
    ),
    _case(
        "mixtral-8x7b-tp4-pp8-ep8",
        "mixtral-8x7b",
        {"tp": 4, "pp": 8, "dp": 8, "ep": 8, "zero_stage": 1},
        seq_len=4096,
        micro_batch_size=1,
    ),
)
