"""A Hugging Face ``config.json`` as a :class:`ModelArch` (``model: path/to/config.json`` in a job spec, and
``frenzy import hf FILE``). Local files only.

The keys and their defaults are those of the ``transformers`` configuration classes of each ``model_type``
(``src/transformers/models/<type>/configuration_<type>.py``: ``LlamaConfig``, ``MistralConfig``,
``MixtralConfig``, ``Qwen2Config``, ``Qwen2MoeConfig``, ``Qwen3Config``, ``Qwen3MoeConfig``,
``DeepseekV2Config``, ``DeepseekV3Config``) and the layer definitions of their ``modeling_<type>.py``:

* llama, mistral, qwen2, mixtral and qwen2_moe (without a shared expert, every layer sparse) are decoders
  frenzy models exactly: RMSNorm, rotary positions, a SwiGLU MLP (``hidden_act: silu`` with gate, up and down
  projections), grouped-query attention. Qwen2's attention has biases on q, k and v only
  (``Qwen2Attention``: ``bias=True`` on ``q_proj``/``k_proj``/``v_proj``, none on ``o_proj``); Llama's
  ``attention_bias`` puts biases on all four projections and ``mlp_bias`` on the MLP's.
* Sliding-window attention (Mistral's ``sliding_window``, Qwen2's ``use_sliding_window``) adds no parameters;
  frenzy prices it as full causal attention (equal at ``seq_len`` <= the window, an upper bound beyond), and
  says so in a note.
* What frenzy does not model is refused naming the feature: Qwen3's per-head q/k RMSNorm (``q_norm``,
  ``k_norm``), shared experts (Qwen2-MoE's ``shared_expert_intermediate_size``, DeepSeek's
  ``n_shared_experts``), multi-head latent attention (DeepSeek's ``kv_lora_rank``), dense layers among MoE
  ones (``first_k_dense_replace``, ``mlp_only_layers``, ``decoder_sparse_step`` > 1), biases on a subset
  frenzy has no field for, other MLP activations.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from frenzy_opt.models.arch import ModelArch
from frenzy_opt.models.keys import nearest_key

# PretrainedConfig's own attributes and the serialisation's bookkeeping (transformers
# configuration_utils.py): none changes the parameter count or the activations.
_COMMON = frozenset(
    [
        "architectures",
        "model_type",
        "torch_dtype",
        "dtype",
        "transformers_version",
        "_name_or_path",
        "name_or_path",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "initializer_range",
        "rms_norm_eps",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "partial_rotary_factor",
        "use_cache",
        "pretraining_tp",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "id2label",
        "label2id",
        "task_specific_params",
        "torchscript",
        "tie_encoder_decoder",
        "is_encoder_decoder",
        "is_decoder",
        "add_cross_attention",
        "auto_map",
        "_attn_implementation",
        "_attn_implementation_autoset",
        "problem_type",
        "chunk_size_feed_forward",
        "use_return_dict",
        "tokenizer_class",
        "prefix",
        "finetuning_task",
        "keys_to_ignore_at_inference",
        "layer_types",
        "quantization_config",
    ]
)
_DENSE = frozenset(
    [
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "hidden_act",
        "max_position_embeddings",
        "tie_word_embeddings",
        "attention_dropout",
        "head_dim",
    ]
)
_MOE_ROUTER = frozenset(["output_router_logits", "router_aux_loss_coef", "router_jitter_noise", "norm_topk_prob"])
KNOWN_KEYS: dict[str, frozenset[str]] = {
    "llama": _COMMON | _DENSE | {"attention_bias", "mlp_bias"},
    "mistral": _COMMON | _DENSE | {"sliding_window"},
    "mixtral": _COMMON | _DENSE | _MOE_ROUTER | {"sliding_window", "num_local_experts", "num_experts_per_tok"},
    "qwen2": _COMMON | _DENSE | {"sliding_window", "use_sliding_window", "max_window_layers", "use_mrope"},
    "qwen2_moe": _COMMON
    | _DENSE
    | _MOE_ROUTER
    | {
        "sliding_window",
        "use_sliding_window",
        "max_window_layers",
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "decoder_sparse_step",
        "mlp_only_layers",
        "qkv_bias",
    },
}
"""The keys each modelled ``model_type``'s configuration class has (with :data:`_COMMON`)."""

TIED_DEFAULT = {"llama": False, "mistral": False, "mixtral": False, "qwen2": False, "qwen2_moe": False}
"""``tie_word_embeddings``' default per configuration class (each passes its own to ``PretrainedConfig``)."""

REFUSED_TYPES = {
    "qwen3": "per-head q/k RMSNorm (Qwen3Attention's q_norm and k_norm)",
    "qwen3_moe": "per-head q/k RMSNorm (Qwen3MoeAttention's q_norm and k_norm)",
    "deepseek_v2": "multi-head latent attention (kv_lora_rank, q_lora_rank), shared experts (n_shared_experts) "
    "and dense first layers (first_k_dense_replace)",
    "deepseek_v3": "multi-head latent attention (kv_lora_rank, q_lora_rank), shared experts (n_shared_experts), "
    "dense first layers (first_k_dense_replace) and multi-token prediction (num_nextn_predict_layers)",
}
"""Model types of the issue's list that frenzy does not model yet, with the missing feature."""


def load_hf_config(path: str | Path) -> dict[str, Any]:
    """The mapping of a local ``config.json`` (a directory holding one is accepted)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object (a Hugging Face config.json)")
    return data


def _default_name(data: dict[str, Any], path: str | Path | None) -> str:
    name = str(data.get("_name_or_path") or "").rstrip("/").split("/")[-1]
    if not name and path is not None:
        where = Path(path)
        name = (where if where.is_dir() else where.parent).name
    return name or f"hf-{data.get('model_type', 'model')}"


def arch_from_hf(data: dict[str, Any], path: str | Path | None = None) -> tuple[ModelArch, list[str]]:
    """The architecture of a ``config.json`` mapping and the notes on what was approximated;
    ``ValueError`` names an unmodelled feature or an unknown key (with the nearest known one)."""
    where = f"{path or 'config.json'}"
    kind = str(data.get("model_type", ""))
    if kind in REFUSED_TYPES:
        raise ValueError(f"{where}: model_type {kind} is not modelled yet; missing feature: {REFUSED_TYPES[kind]}")
    if kind not in KNOWN_KEYS:
        modelled = ", ".join(sorted(KNOWN_KEYS))
        raise ValueError(f"{where}: model_type {kind or '(none)'!r} is not modelled; modelled: {modelled}")
    unknown = sorted(set(data) - KNOWN_KEYS[kind])
    if unknown:
        hints = [f"{k} (nearest known: {nearest_key(k, KNOWN_KEYS[kind])})" for k in unknown]
        raise ValueError(f"{where}: unknown key(s) for model_type {kind}: {', '.join(hints)}")
    act = data.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{where}: hidden_act {act!r} in a gated MLP is not modelled; modelled: silu (SwiGLU)")
    missing = [k for k in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                           "vocab_size") if k not in data]  # fmt: skip
    if missing:
        raise ValueError(f"{where}: missing key(s) {', '.join(missing)}")
    notes: list[str] = []
    fields: dict[str, Any] = {
        "name": _default_name(data, path),
        "num_layers": data["num_hidden_layers"],
        "hidden_size": data["hidden_size"],
        "ffn_hidden_size": data["intermediate_size"],
        "num_attention_heads": data["num_attention_heads"],
        "num_kv_heads": data.get("num_key_value_heads") or data["num_attention_heads"],
        "vocab_size": data["vocab_size"],
        "tied_embeddings": bool(data.get("tie_word_embeddings", TIED_DEFAULT[kind])),
        "attention_dropout": float(data.get("attention_dropout") or 0.0),
        "max_position_embeddings": data.get("max_position_embeddings", 4096),
    }
    if data.get("head_dim") is not None:
        fields["head_dim"] = data["head_dim"]
    fields |= _biases(kind, data, where)
    fields |= _experts(kind, data, where)
    window = data.get("sliding_window")
    if window and (kind in ("mistral", "mixtral") or data.get("use_sliding_window")):
        notes.append(
            f"sliding-window attention (window {window}) is priced as full causal attention: equal at "
            f"seq_len <= {window}, an upper bound of time and memory beyond"
        )
    return ModelArch(**fields), notes


def _biases(kind: str, data: dict[str, Any], where: str) -> dict[str, Any]:
    if kind in ("qwen2", "qwen2_moe"):  # q, k and v carry biases, o_proj none (Qwen2Attention)
        return {"qkv_bias": True}
    attention, mlp = bool(data.get("attention_bias")), bool(data.get("mlp_bias"))
    if attention and mlp:
        return {"linear_bias": True}
    if attention or mlp:
        which = "attention_bias (q, k, v and o)" if attention else "mlp_bias"
        raise ValueError(
            f"{where}: {which} without the other is not modelled (frenzy's linear_bias puts biases on both)"
        )
    return {}


def _experts(kind: str, data: dict[str, Any], where: str) -> dict[str, Any]:
    if kind == "mixtral":  # every expert is an intermediate_size SwiGLU MLP (MixtralSparseMoeBlock)
        experts, ffn = data.get("num_local_experts", 8), data["intermediate_size"]
    elif kind == "qwen2_moe":
        shared = data.get("shared_expert_intermediate_size", 5632)  # Qwen2MoeConfig's default
        if shared:
            raise ValueError(f"{where}: shared experts (shared_expert_intermediate_size {shared}) are not modelled")
        if data.get("decoder_sparse_step", 1) != 1 or data.get("mlp_only_layers"):
            raise ValueError(
                f"{where}: dense layers among MoE ones (decoder_sparse_step, mlp_only_layers) are not modelled"
            )
        experts, ffn = data.get("num_experts", 60), data.get("moe_intermediate_size", 1408)
    else:
        return {}
    top_k = data.get("num_experts_per_tok", 2 if kind == "mixtral" else 4)  # MixtralConfig 2, Qwen2MoeConfig 4
    return {"num_experts": experts, "moe_top_k": top_k, "moe_ffn_hidden_size": ffn}
