"""Imports point one way, from the CLI down to the specs: each concept package sits on a layer."""

from __future__ import annotations

import ast
import subprocess
import sys
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
    "frenzy_opt.yamlload": 0,
    "frenzy_opt.core": 1,
    "frenzy_opt.formats": 1,
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


def _runtime_imports(tree: ast.Module) -> list[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:`` (imports for annotations only: no run-time edge)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return [node for node in ast.walk(tree) if id(node) not in skipped]


def test_nothing_imports_upward() -> None:
    violations = []
    for name, path in _modules():
        own = _layer(name)
        if own is None:
            continue
        for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
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


def test_a_training_rank_loads_no_planner() -> None:
    """The worker's room (launch/worker) loads what a rank needs: not the planner, MARP, the step-time model,
    the solvers or networkx (every torchrun rank imports it)."""
    code = (
        "import sys, frenzy_opt.launch.worker.train\n"
        "heavy = ('frenzy_opt.planning', 'frenzy_opt.prediction', 'frenzy_opt.solvers', 'frenzy_opt.launch.executors',"
        " 'networkx')\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith(heavy))))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""


def test_the_service_loads_no_offline_solver() -> None:
    """The orchestrator and the app use the greedy alone: OR-Tools, PuLP, HiGHS and the baselines stay out."""
    code = (
        "import sys, frenzy_opt.service.orchestrator, frenzy_opt.api.app\n"
        "heavy = ('ortools', 'pulp', 'highspy', 'frenzy_opt.solvers.cpsat', 'frenzy_opt.solvers.policies')\n"
        "print(','.join(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""
