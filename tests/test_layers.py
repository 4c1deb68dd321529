"""Imports follow the design: each concept package builds only on the packages it is meant to build on.

:data:`DEPENDS` is written from the design (docs/architecture.md, "Imports point one way"), not read off
the import graph: a package may import what its entries give, transitively, and nothing else of the
project. A new edge between packages is a design change, made here and in the docs first. Narrower rooms
inside a package (the training worker) have entries of their own.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Source folder -> import prefix (frenzy_opt/ links the user's top-level folders in as subpackages).
FOLDERS = {
    "frenzy_opt": "frenzy_opt",
    "models": "frenzy_opt.models",
    "solvers": "frenzy_opt.solvers",
    "api": "frenzy_opt.api",
}
DEPENDS: dict[str, set[str]] = {
    "yamlload": set(),  # YAML through libyaml's C parser: a leaf every package may use
    "models": {"yamlload"},  # architectures, exact parameter counts, the catalogue, the reference decoder
    "core": {"models"},  # the job spec, the plan and measurement records, enums, the runtimes' tables
    "formats": {"core"},  # job specs from other tools' configurations
    "hardware": {"core"},  # GPUs, clusters, topology, placement, measured kernel and link rates
    "prediction": {"hardware"},  # MARP and the step-time model
    "planning": {"prediction"},  # plans and the scheduling problem
    "tracing": {"prediction"},  # MARP's figures from real runtimes under FakeTensorMode
    "validation": {"planning", "tracing"},  # predictions against measured runs
    "launch": {
        "planning",
        "launch.worker",
    },  # the executors: a plan becomes processes (the worker's rule, what it runs)
    "launch.worker": {"core"},  # what one training rank runs: no planner, MARP or solver
    "simulation": {"planning"},  # the discrete-event simulator and its truths
    "solvers": {"simulation"},  # the greedy, CP-SAT, the bound, the baselines, the simulator's policies
    "plots": {"simulation"},
    "service": {"solvers", "launch"},  # the orchestrator and its store
    "research": {"solvers", "plots"},  # experiments and comparisons over policies
    "api": {"service"},
    "client": {"planning"},  # the HTTP client; planning only to find shipped scenario files by name
    "cli": {"api", "research", "validation", "formats", "client"},
}


@cache
def allowed(package: str) -> frozenset[str]:
    """The packages ``package`` may import: its own, its entries and theirs, transitively."""
    found = {package}
    for below in DEPENDS[package]:
        found |= allowed(below)
    return frozenset(found)


def package_of(module: str) -> str | None:
    """The :data:`DEPENDS` entry a ``frenzy_opt`` module belongs to (the longest that prefixes it)."""
    if not module.startswith("frenzy_opt."):
        return None
    name = module.removeprefix("frenzy_opt.")
    best = None
    for package in DEPENDS:
        if (name == package or name.startswith(package + ".")) and (best is None or len(package) > len(best)):
            best = package
    return best


def _modules() -> list[tuple[str, Path]]:
    found = []
    for folder, prefix in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found.append((".".join([prefix, *parts]), path))
    return found


def _runtime_imports(tree: ast.Module) -> list[str]:
    """The modules imported outside ``if TYPE_CHECKING:`` (imports for annotations only are no run-time
    edge)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    targets = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            targets.append(node.module)
    return targets


def test_every_module_belongs_to_a_package_of_the_design() -> None:
    missing = [name for name, _ in _modules() if name != "frenzy_opt" and package_of(name) is None]
    assert not missing


def test_the_design_has_no_cycle_and_names_only_its_packages() -> None:
    for package, below in DEPENDS.items():
        assert below <= DEPENDS.keys(), package
        assert all(package not in allowed(b) for b in below), f"{package} depends on itself"


def test_every_import_is_one_the_design_allows() -> None:
    violations = []
    for name, path in _modules():
        own = package_of(name)
        if own is None:
            continue
        for target in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            to = package_of(target)
            if to is not None and to not in allowed(own):
                violations.append(f"{name} ({own}) imports {target} ({to})")
    assert not violations


def test_the_check_refuses_an_edge_the_design_lacks() -> None:
    """The rule could fail: the planner importing the service, or the worker the planner, is refused."""
    assert package_of("frenzy_opt.service.store") not in allowed(package_of("frenzy_opt.planning.plans") or "")
    assert "planning" not in allowed(package_of("frenzy_opt.launch.worker.train") or "")
    assert "planning" in allowed(package_of("frenzy_opt.launch.executors.local") or "")


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
