"""YAML reading: libyaml's C parser where PyYAML was built with it, the pure-Python one otherwise.

The C loader (``yaml.CSafeLoader``) reads a 512-job scenario file many times faster than ``yaml.safe_load``
and builds the same objects (both are PyYAML's safe constructor over a different parser). Its errors carry
the same line and column but not the quoted source line, so a document the C parser refuses is parsed again
with the pure-Python loader, whose error (with the offending line shown) is the one raised.
"""

from __future__ import annotations

from typing import Any

import yaml

FAST_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader when PyYAML has it (``yaml.__with_libyaml__``), else the pure-Python one."""


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)`` through :data:`FAST_LOADER`; a malformed document raises the pure-Python
    loader's :class:`yaml.YAMLError` (its message quotes the line at fault)."""
    try:
        return yaml.load(text, Loader=FAST_LOADER)
    except yaml.YAMLError:
        if FAST_LOADER is yaml.SafeLoader:
            raise
    return yaml.safe_load(text)
