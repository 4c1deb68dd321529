"""Per-tenant quotas per GPU type (Kueue's ClusterQueue nominal quotas, without borrowing), enforced inside the
orchestrator's decision as the greedy's admission hook: a job over its tenant's quota waits, with the reason
(:meth:`Quotas.explain`)."""

from __future__ import annotations

from collections.abc import Callable

from frenzy_opt.planning.problem import Option


class Quotas:
    """Per-tenant GPU limits per type; a tenant with no entry for a type is unlimited there."""

    def __init__(self, limits: dict[str, dict[str, int]], tenant_of: Callable[[str], str]) -> None:
        self.limits = limits
        self.tenant_of = tenant_of
        self.used: dict[str, dict[str, int]] = {}
        self.held: dict[str, tuple[str, str, int]] = {}

    def limit(self, tenant: str, gpu_type: str) -> int | None:
        return self.limits.get(tenant, {}).get(gpu_type)

    def allows(self, job: str, option: Option) -> bool:
        tenant = self.tenant_of(job)
        limit = self.limit(tenant, option.gpu_type)
        return limit is None or self.used.get(tenant, {}).get(option.gpu_type, 0) + option.num_gpus <= limit

    def take(self, job: str, option: Option) -> None:
        tenant = self.tenant_of(job)
        per_type = self.used.setdefault(tenant, {})
        per_type[option.gpu_type] = per_type.get(option.gpu_type, 0) + option.num_gpus
        self.held[job] = (tenant, option.gpu_type, option.num_gpus)

    def release(self, job: str) -> None:
        held = self.held.pop(job, None)
        if held is not None:
            tenant, gpu_type, n = held
            self.used[tenant][gpu_type] -= n

    def explain(self, job: str, options: tuple[Option, ...]) -> str:
        tenant = self.tenant_of(job)
        parts = []
        for gpu_type in sorted({o.gpu_type for o in options}):
            limit = self.limit(tenant, gpu_type)
            fewest = min(o.num_gpus for o in options if o.gpu_type == gpu_type)
            used = self.used.get(tenant, {}).get(gpu_type, 0)
            if limit is not None:
                parts.append(f"{gpu_type}: needs {fewest}, quota {limit}, in use {used}")
        return f"over quota for tenant {tenant!r} ({'; '.join(parts)})"
