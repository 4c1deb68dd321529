"""Imports point one way, from the CLI down to the specs: each concept package sits on a layer."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Source folder -> import prefix (frenzy_opt/ links the user's top-level folders in as subpackages).
FOLDERS = {
    "frenzy_opt": "frenzy_opt",
    "models": "frenzy_opt.models",
    "solvers": "frenzy_opt.solvers",
    "api": "frenzy_opt.api",
}
# Packages by concept, lowest first; a module may import only its own layer or lower ones (docs/architecture.md).
LAYERS = {
    "frenzy_opt.models": 0,
    "frenzy_opt.core": 1,
    "frenzy_opt.hardware": 2,
    "frenzy_opt.prediction": 3,
    "frenzy_opt.planning": 4,
    "frenzy_opt.tracing": 4,
    "frenzy_opt.validation": 5,
    "frenzy_opt.launch": 5,
    "frenzy_opt.simulation": 5,
    "frenzy_opt.plots": 6,
    "frenzy_opt.solvers": 6,
    "frenzy_opt.service": 7,
    "frenzy_opt.research": 7,
    "frenzy_opt.api": 8,
    "frenzy_opt.client": 9,
    "frenzy_opt.cli": 9,
}


def _layer(module: str) -> int | None:
    best = None
    for prefix, layer in LAYERS.items():
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, layer)
    return None if best is None else best[1]


def _modules() -> list[tuple[str, Path]]:
    found = []
    for folder, prefix in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found.append((".".join([prefix, *parts]), path))
    return found


def test_every_module_has_a_layer() -> None:
    missing = [name for name, _ in _modules() if name != "frenzy_opt" and _layer(name) is None]
    assert not missing


def test_nothing_imports_upward() -> None:
    violations = []
    for name, path in _modules():
        own = _layer(name)
        if own is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module]
            for target in targets:
                layer = _layer(target)
                if layer is not None and layer > own:
                    violations.append(f"{name} imports {target}")
    assert not violations
