"""Whether the trace path's runtimes (the ``validate`` extra: torchtitan, megatron-core) can be imported, and
the skip mark for the tests that need them."""

from __future__ import annotations

import importlib.util

import pytest

MISSING = [name for name in ("torchtitan", "megatron") if importlib.util.find_spec(name) is None]
if not MISSING:
    try:
        import megatron.core  # noqa: F401
    except Exception:  # pragma: no cover - a broken install
        MISSING.append("megatron.core")

needs_runtimes = pytest.mark.skipif(
    bool(MISSING),
    reason=f"trace path needs the validate extra ({', '.join(MISSING)} not importable): "
    'pip install "torch==2.13.0" -e ".[validate]"',
)
