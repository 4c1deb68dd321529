"""The solver protocol and registry: every solver takes the same :class:`SchedulingProblem`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from frenzy_opt.planning.problem import Schedule, SchedulingProblem


class Solver(Protocol):
    name: str

    def solve(self, problem: SchedulingProblem) -> Schedule: ...


_REGISTRY: dict[str, Callable[..., Solver]] = {}


def register(name: str) -> Callable[[Callable[..., Solver]], Callable[..., Solver]]:
    def wrap(factory: Callable[..., Solver]) -> Callable[..., Solver]:
        _REGISTRY[name] = factory
        return factory

    return wrap


def make_solver(name: str, **options: object) -> Solver:
    """A solver by name; ``ValueError`` lists the registered names."""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"solver: unknown name {name!r}; allowed: {', '.join(sorted(_REGISTRY))}")
    return factory(**options)


def solver_names() -> list[str]:
    return sorted(_REGISTRY)
