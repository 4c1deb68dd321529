"""The package imports from the repository root with a plain interpreter (no ``-P``, no install needed for the
source tree): ``frenzy_opt/`` links the user's top-level folders in as its subpackages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = ("models", "solvers", "api", "scenarios")


def test_the_top_level_folders_are_linked_into_the_package() -> None:
    for name in SUBPACKAGES:
        link = ROOT / "frenzy_opt" / name
        assert link.is_symlink() and link.resolve() == ROOT / name


def test_the_package_imports_from_the_repository_root() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    code = (
        "import frenzy_opt.models.catalog, frenzy_opt.solvers.greedy, frenzy_opt.api.app, frenzy_opt.cli\n"
        "import frenzy_opt.models.catalog as c\n"
        "print(c.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout
    assert Path(out.strip()).resolve() == (ROOT / "models" / "catalog.py").resolve()
