"""Cluster files (contract 2): node groups of one GPU type each, and the inter-node network."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frenzy_opt.gpus import GpuType, lookup_gpu
from frenzy_opt.spec import load_mapping

INTRA_NODE_KINDS = ("nvlink", "pcie")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeGroup:
    gpu: GpuType
    num_nodes: int
    gpus_per_node: int
    intra_node: str

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    name: str
    node_groups: tuple[NodeGroup, ...]
    inter_node_gbps: float

    @property
    def num_gpus(self) -> int:
        return sum(g.num_gpus for g in self.node_groups)

    def gpu_types(self) -> list[GpuType]:
        """Distinct GPU types, in file order."""
        seen: dict[str, GpuType] = {}
        for group in self.node_groups:
            seen.setdefault(group.gpu.name, group.gpu)
        return list(seen.values())

    def num_gpus_of(self, gpu_name: str) -> int:
        return sum(g.num_gpus for g in self.node_groups if g.gpu.name == gpu_name)

    def gpus_per_node_of(self, gpu_name: str) -> int:
        """The largest node size of that type (tensor-parallel groups must fit in one node)."""
        return max((g.gpus_per_node for g in self.node_groups if g.gpu.name == gpu_name), default=0)


def _positive(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def parse_cluster(data: dict[str, Any]) -> ClusterSpec:
    """A :class:`ClusterSpec` from a contract-2 mapping; errors name the field."""
    groups_raw = data.get("node_groups")
    if not isinstance(groups_raw, list) or not groups_raw:
        raise ValueError("node_groups must be a non-empty list of {gpu, num_nodes, gpus_per_node, intra_node}")
    groups = []
    for i, raw in enumerate(groups_raw):
        where = f"node_groups[{i}]"
        if not isinstance(raw, dict) or "gpu" not in raw:
            raise ValueError(f"{where} must be a mapping with at least a gpu field")
        allowed = {"gpu", "num_nodes", "gpus_per_node", "intra_node"}
        unknown = sorted(set(raw) - allowed)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
        try:
            gpu = lookup_gpu(raw["gpu"])
        except ValueError as err:
            raise ValueError(f"{where}.{err}") from None
        intra = str(raw.get("intra_node", gpu.intra_node)).lower()
        if intra not in INTRA_NODE_KINDS:
            raise ValueError(f"{where}.intra_node must be one of {', '.join(INTRA_NODE_KINDS)}, got {intra!r}")
        groups.append(
            NodeGroup(
                gpu=gpu,
                num_nodes=_positive(f"{where}.num_nodes", raw.get("num_nodes", 1)),
                gpus_per_node=_positive(f"{where}.gpus_per_node", raw.get("gpus_per_node", 8)),
                intra_node=intra,
            )
        )
    network = data.get("network") or {}
    if not isinstance(network, dict):
        raise ValueError("network must be a mapping like {inter_node_gbps: 100}")
    gbps = network.get("inter_node_gbps", 100)
    if not isinstance(gbps, int | float) or isinstance(gbps, bool) or gbps <= 0:
        raise ValueError(f"network.inter_node_gbps must be a positive number, got {gbps!r}")
    return ClusterSpec(name=str(data.get("name") or "cluster"), node_groups=tuple(groups), inter_node_gbps=float(gbps))


def load_cluster(path: str | Path) -> ClusterSpec:
    return parse_cluster(load_mapping(path))
