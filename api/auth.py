"""Tenants, bearer tokens and quotas.

A tokens file (YAML or JSON), given by ``frenzy serve --tokens FILE`` or the ``FRENZY_TOKENS`` environment
variable (a path, or the JSON itself)::

    tokens:
      - {token: "…", tenant: team-a}
      - {token: "…", tenant: ops, admin: true}     # sees and cancels every tenant's jobs
    quotas:                                         # GPUs per type a tenant may hold at once (optional)
      team-a: {A100-SXM4-80GB: 8}

Without a tokens file the service runs single-tenant in local mode: no authentication, every request is the
admin of tenant ``local``.
"""

from __future__ import annotations

import hmac
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frenzy_opt.core.spec import load_mapping

LOCAL_TENANT = "local"


@dataclass(frozen=True, slots=True, kw_only=True)
class Principal:
    tenant: str
    admin: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantConfig:
    tokens: dict[str, Principal] = field(default_factory=dict)
    quotas: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def local(self) -> bool:
        return not self.tokens

    def authenticate(self, header: str | None) -> Principal | None:
        """The principal of an ``Authorization: Bearer …`` header; None if missing or unknown. Local mode:
        always the admin of the local tenant."""
        if self.local:
            return Principal(tenant=LOCAL_TENANT, admin=True)
        if not header or not header.startswith("Bearer "):
            return None
        given = header.removeprefix("Bearer ").strip()
        for token, principal in self.tokens.items():
            if hmac.compare_digest(token, given):  # constant time: no token prefix leaks by timing
                return principal
        return None


def parse_tenants(data: dict[str, Any], known_gpus: list[str]) -> TenantConfig:
    """A :class:`TenantConfig` from a mapping; errors name the field."""
    unknown = sorted(set(data) - {"tokens", "quotas"})
    if unknown:
        raise ValueError(f"tokens file: unknown field(s) {', '.join(unknown)}; allowed: quotas, tokens")
    tokens: dict[str, Principal] = {}
    for i, entry in enumerate(data.get("tokens") or []):
        if not isinstance(entry, dict) or not isinstance(entry.get("token"), str) or not entry.get("tenant"):
            raise ValueError(f"tokens[{i}] must have a string token and a tenant")
        if len(entry["token"]) < 8:
            raise ValueError(f"tokens[{i}].token must be at least 8 characters")
        tokens[entry["token"]] = Principal(tenant=str(entry["tenant"]), admin=bool(entry.get("admin", False)))
    quotas: dict[str, dict[str, int]] = {}
    for tenant, limits in (data.get("quotas") or {}).items():
        if not isinstance(limits, dict):
            raise ValueError(f"quotas.{tenant} must map GPU types to GPU counts")
        for gpu, count in limits.items():
            if gpu not in known_gpus:
                raise ValueError(
                    f"quotas.{tenant}: {gpu!r} is not a GPU type of the cluster; allowed: {', '.join(known_gpus)}"
                )
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise ValueError(f"quotas.{tenant}.{gpu} must be a non-negative integer, got {count!r}")
        quotas[str(tenant)] = {str(g): int(c) for g, c in limits.items()}
    return TenantConfig(tokens=tokens, quotas=quotas)


def load_tenants(path: str | None, known_gpus: list[str]) -> TenantConfig:
    """From ``path``, else from ``FRENZY_TOKENS`` (a path or inline JSON), else local mode."""
    source = path or os.environ.get("FRENZY_TOKENS")
    if not source:
        return TenantConfig()
    if source.lstrip().startswith("{"):
        return parse_tenants(json.loads(source), known_gpus)
    return parse_tenants(load_mapping(Path(source)), known_gpus)
