"""Load the architecture catalogue (``catalog.yaml``) and parse inline architectures from job specs."""

from __future__ import annotations

import functools
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any

from frenzy_opt.models.arch import ModelArch
from frenzy_opt.models.hf import arch_from_hf, load_hf_config
from frenzy_opt.models.keys import unknown_keys_message
from frenzy_opt.yamlload import load_yaml

_ARCH_FIELDS = frozenset(f.name for f in fields(ModelArch))
REQUIRED_ARCH_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size")
"""The fields an inline architecture must give (``num_kv_heads`` defaults to ``num_attention_heads``)."""


@functools.cache
def _raw_catalog() -> tuple[dict[str, Any], ...]:
    text = resources.files("frenzy_opt.models").joinpath("catalog.yaml").read_text(encoding="utf-8")
    return tuple(load_yaml(text)["models"])


@functools.cache
def load_catalog() -> dict[str, ModelArch]:
    """All catalogue models by lower-case name."""
    catalog = {}
    for entry in _raw_catalog():
        arch = parse_model({k: v for k, v in entry.items() if k != "published_params"})
        catalog[arch.name.lower()] = arch
    return catalog


def published_params(name: str) -> float:
    """The parameter total the model's authors state (for tests and docs)."""
    for entry in _raw_catalog():
        if entry["name"].lower() == name.lower():
            return float(entry["published_params"])
    raise KeyError(name)


def catalog_names() -> list[str]:
    return sorted(load_catalog())


def lookup_model(name: str) -> ModelArch:
    """A catalogue model by name (case-insensitive); ``ValueError`` lists the valid names."""
    try:
        return load_catalog()[name.lower()]
    except KeyError:
        raise ValueError(
            f"model: unknown catalogue name {name!r} (nor a path to a Hugging Face config.json); "
            f"allowed: {', '.join(catalog_names())}"
        ) from None


def _looks_like_path(value: str) -> bool:
    return value.endswith(".json") or "/" in value or Path(value).is_dir()


def parse_model(value: str | dict[str, Any]) -> ModelArch:
    """A catalogue name, a path to a Hugging Face ``config.json`` (or its folder; :mod:`frenzy_opt.models.hf`)
    or an inline architecture mapping (contract 1) as a :class:`ModelArch`."""
    if isinstance(value, str):
        if value.lower() in load_catalog() or not _looks_like_path(value):
            return lookup_model(value)
        try:
            return arch_from_hf(load_hf_config(value), value)[0]
        except ValueError as err:
            raise ValueError(f"model: {err}") from None
    if not isinstance(value, dict):
        raise ValueError(f"model must be a catalogue name or a mapping of architecture fields, got {value!r}")
    unknown = sorted(set(value) - _ARCH_FIELDS)
    if unknown:
        raise ValueError(unknown_keys_message("model", unknown, _ARCH_FIELDS))
    missing = [name for name in REQUIRED_ARCH_FIELDS if name not in value]
    if missing:
        raise ValueError(f"model: missing required field(s) {', '.join(missing)}")
    kwargs = dict(value)
    kwargs.setdefault("num_kv_heads", kwargs["num_attention_heads"])
    for key in ("mlp", "norm", "position_embedding"):
        if isinstance(kwargs.get(key), str):
            kwargs[key] = kwargs[key].lower()
    return ModelArch(**kwargs)
