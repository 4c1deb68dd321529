"""LLM architectures: the catalogue, exact parameter counting and a pure-PyTorch reference decoder."""

from frenzy_opt.models.arch import ModelArch, ShardParamCounts, shard_param_counts
from frenzy_opt.models.catalog import catalog_names, load_catalog, lookup_model, parse_model

__all__ = [
    "ModelArch",
    "ShardParamCounts",
    "catalog_names",
    "load_catalog",
    "lookup_model",
    "parse_model",
    "shard_param_counts",
]
