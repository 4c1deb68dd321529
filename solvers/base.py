"""The registries of solvers (``frenzy solve --solver``) and simulator policies (``frenzy simulate --policy``).

Names are declared with the module that registers them, which is imported only when the name is asked for.
"""

from __future__ import annotations

from collections.abc import Callable

from frenzy_opt.core.registry import Registry
from frenzy_opt.planning.interfaces import Solver
from frenzy_opt.simulation.view import Policy

SOLVERS: Registry[Solver] = Registry(
    "solver",
    {
        "greedy": "frenzy_opt.solvers.greedy",
        "cpsat": "frenzy_opt.solvers.cpsat",
        "lpbound": "frenzy_opt.solvers.lpbound",
    },
)
_POLICY_MODULES = {
    **dict.fromkeys(("frenzy", "frenzy-oracle", "fifo", "cpsat-offline"), "frenzy_opt.solvers.policies"),
    **dict.fromkeys(("sia", "sia-oracle"), "frenzy_opt.solvers.sia"),
    **dict.fromkeys(("gavel", "gavel-oracle"), "frenzy_opt.solvers.gavel"),
}
POLICIES: Registry[Policy] = Registry("policy", _POLICY_MODULES, section="policies")


def register(name: str) -> Callable[[Callable[..., Solver]], Callable[..., Solver]]:
    return SOLVERS.register(name)


def make_solver(name: str, **options: object) -> Solver:
    """A solver by name; ``ValueError`` lists the registered names."""
    return SOLVERS.make(name, **options)


def solver_names() -> list[str]:
    return SOLVERS.names()


def register_policy(name: str) -> Callable[[Callable[..., Policy]], Callable[..., Policy]]:
    return POLICIES.register(name)


def make_policy(name: str, **settings: object) -> Policy:
    """A fresh policy by name; ``ValueError`` lists the registered names, or names a bad setting."""
    return POLICIES.make(name, **settings)


def policy_names() -> list[str]:
    return POLICIES.names()
