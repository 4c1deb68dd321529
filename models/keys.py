"""Unknown keys named with their nearest known key: the contract-1 parsers' error messages.

Users arrive with other formats' names for contract-1 fields. :data:`FOREIGN_KEYS` maps the names of the
formats ``frenzy import`` reads to ours, so a Hugging Face key in a ``model:`` mapping is answered with the
field it means; any other unknown key gets its closest known key by spelling (:func:`difflib.get_close_matches`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

FOREIGN_KEYS: dict[str, str] = {
    # Hugging Face config.json (transformers' LlamaConfig, MistralConfig, Qwen2Config, MixtralConfig, ...).
    "num_hidden_layers": "num_layers",
    "intermediate_size": "ffn_hidden_size",
    "num_key_value_heads": "num_kv_heads",
    "tie_word_embeddings": "tied_embeddings",
    "num_local_experts": "num_experts",
    "num_experts_per_tok": "moe_top_k",
    "moe_intermediate_size": "moe_ffn_hidden_size",
    "attention_bias": "qkv_bias",
    "mlp_bias": "linear_bias",
    "hidden_act": "mlp",
    # Megatron-LM arguments (megatron/training/arguments.py), with dashes as underscores.
    "num_query_groups": "num_kv_heads",
    "kv_channels": "head_dim",
    "untie_embeddings_and_output_weights": "tied_embeddings",
    "normalization": "norm",
    "swiglu": "mlp",
    "moe_router_topk": "moe_top_k",
    "position_embedding_type": "position_embedding",
    "seq_length": "seq_len",
    "train_iters": "train_steps",
    "tensor_model_parallel_size": "tp",
    "pipeline_model_parallel_size": "pp",
    "context_parallel_size": "cp",
    "expert_model_parallel_size": "ep",
    "recompute_granularity": "recompute",
    "use_distributed_optimizer": "zero_stage",
    # torchtitan's JobConfig and TransformerModelArgs (torchtitan/config/job_config.py, models/llama3).
    "n_layers": "num_layers",
    "dim": "hidden_size",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_kv_heads",
    "local_batch_size": "micro_batch_size",
    "steps": "train_steps",
    "tensor_parallel_degree": "tp",
    "pipeline_parallel_degree": "pp",
    "context_parallel_degree": "cp",
    "expert_parallel_degree": "ep",
    "data_parallel_shard_degree": "dp",
    "data_parallel_replicate_degree": "dp",
    "mixed_precision_param": "precision",
}
"""Other formats' names for contract-1 fields (``frenzy import`` reads these formats; the sources are the
modules of :mod:`frenzy_opt.formats` and :mod:`frenzy_opt.models.hf`)."""


def nearest_key(key: str, known: Iterable[str]) -> str | None:
    """The known key ``key`` most likely means: its contract-1 name when another format uses ``key``
    (:data:`FOREIGN_KEYS`), else the shortest known key it begins (``micro_batch`` -> ``micro_batch_size``),
    else the closest spelling (difflib ratio >= 0.6), else None."""
    known = list(known)
    foreign = FOREIGN_KEYS.get(key.replace("-", "_").lstrip("_"))
    if foreign in known:
        return foreign
    longer = sorted((k for k in known if k.startswith(key)), key=len)
    if longer:
        return longer[0]
    close = difflib.get_close_matches(key, known, n=1)
    return close[0] if close else None


def unknown_keys_message(where: str, unknown: Iterable[str], known: Iterable[str]) -> str:
    """``"model: unknown field(s) num_hidden_layers (nearest known: num_layers); allowed: ..."``."""
    known = sorted(known)
    parts = []
    for key in sorted(unknown):
        near = nearest_key(key, known)
        parts.append(f"{key} (nearest known: {near})" if near else key)
    return f"{where}: unknown field(s) {', '.join(parts)}; allowed: {', '.join(known)}"
