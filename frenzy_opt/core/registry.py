"""One small registry for everything found by name: solvers, simulator policies and executors.

A name is either registered by the decorator where its class lives, or declared with the module that
registers it, which is imported the first time the name is asked for (or all names are listed): so the
service, which needs only the greedy, does not load OR-Tools, PuLP or the simulator's baselines.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, modules: Mapping[str, str] | None = None, section: str | None = None) -> None:
        """``kind`` names the thing in errors ("solver"); ``modules``: name -> module that registers it;
        ``section``: where its options are written (a scenario's ``policies:``), for the errors."""
        self.kind = kind
        self.section = section or kind
        self.modules = dict(modules or {})
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        def wrap(factory: Callable[..., T]) -> Callable[..., T]:
            self._factories[name] = factory
            return factory

        return wrap

    def names(self) -> list[str]:
        return sorted(set(self._factories) | set(self.modules))

    def factory(self, name: str) -> Callable[..., T]:
        """The factory of ``name``; ``ValueError`` lists the allowed names."""
        if name not in self._factories and name in self.modules:
            importlib.import_module(self.modules[name])
        found = self._factories.get(name)
        if found is None:
            raise ValueError(f"{self.kind}: unknown name {name!r}; allowed: {', '.join(self.names())}")
        return found

    def make(self, name: str, **options: object) -> T:
        """A new one by name; a bad option is a ``ValueError`` naming the thing and the option."""
        factory = self.factory(name)
        try:
            inspect.signature(factory).bind(**options)
        except TypeError as err:
            raise ValueError(f"{self.section}.{name}: {err}") from None
        return factory(**options)
