"""Cluster files (contract 2): node groups of one GPU type each, and the inter-node network.

The network is described per node: ``network.nics_per_node`` NICs of ``network.nic_gbps`` Gbit/s each (a
DGX H100 has eight 400 Gbit/s ConnectX-7 compute NICs, NVIDIA DGX H100 user guide; a DGX A100 eight 200 Gbit/s
HDR ones, DGX A100 user guide). The older ``network.inter_node_gbps`` (Gbit/s per node, all NICs together) is
still accepted and means one NIC of that speed. A node group may override both, and may state
``nvlink_domain``: how many GPUs share one NVLink fabric (default: one node; 72 for a GB200 NVL72 rack, NVIDIA
GB200 NVL72 product page), so collectives inside the domain never touch the NICs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frenzy_opt.core.spec import load_mapping
from frenzy_opt.hardware.gpus import GpuType, resolve_gpu

INTRA_NODE_KINDS = ("nvlink", "pcie")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeGroup:
    """Nodes of one GPU type and one shape (a ``node_groups`` entry of a cluster file)."""

    gpu: GpuType
    """The GPU type of every GPU in the group (a catalogue name or alias in the file)."""
    num_nodes: int
    """Nodes in the group."""
    gpus_per_node: int
    """GPUs in each node (a tensor-parallel group never spans nodes)."""
    intra_node: str
    """How GPUs inside a node talk: nvlink or pcie (the file's default: the GPU type's ``intra_node``)."""
    nics_per_node: int = 1
    """Network cards per node for traffic between nodes."""
    nic_gbit_s: float = 100.0
    """Gbit/s per NIC, per direction."""
    nvlink_domain: int = 0
    """GPUs of one NVLink fabric (0: one node's GPUs); in the file a multiple of ``gpus_per_node``, above it
    only with ``intra_node: nvlink`` (72 for a GB200 NVL72 rack)."""

    @property
    def inter_node_gbit_s(self) -> float:
        """All NICs of one node together, Gbit/s per direction (the file's older ``inter_node_gbps`` gives it
        as one NIC of that speed, instead of ``nics_per_node`` and ``nic_gbps``)."""
        return self.nics_per_node * self.nic_gbit_s

    @property
    def domain_gpus(self) -> int:
        return max(self.nvlink_domain, self.gpus_per_node)

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


# Checkpoint storage a node reaches, each way, when no cluster file says: a design default, not a measurement of
# any one cluster -- 40 % of one 100 Gbit/s storage NIC (12.5 GB/s). Clusters differ by an order of magnitude:
# NVIDIA's DGX SuperPOD reference architecture (DGX H100) expects a GPUDirect Storage client to read "at over
# 40 GBps" per node, while a cloud file system gives what was provisioned (Amazon FSx for Lustre PERSISTENT_2:
# 125-1,000 MB/s per TiB stored). Give the cluster's own figures in its file's ``storage`` section.
DEFAULT_STORAGE_GBYTE_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Storage:
    """Where checkpoints go (a cluster file's ``storage`` section): GB/s each node reads and writes, and the
    file system's total (None: no limit beyond the nodes')."""

    read_gbyte_s_per_node: float = DEFAULT_STORAGE_GBYTE_S
    """GB/s one node reads checkpoints at (a design default where the file gives none: set your cluster's)."""
    write_gbyte_s_per_node: float = DEFAULT_STORAGE_GBYTE_S
    """GB/s one node writes checkpoints at."""
    read_gbyte_s_total: float | None = None
    """GB/s the file system serves to all nodes together (null: the nodes' sum)."""
    write_gbyte_s_total: float | None = None
    """GB/s the file system absorbs from all nodes together (null: the nodes' sum)."""

    def read_gbyte_s(self, nodes: int) -> float:
        """What ``nodes`` nodes read together."""
        per_node = nodes * self.read_gbyte_s_per_node
        return per_node if self.read_gbyte_s_total is None else min(per_node, self.read_gbyte_s_total)

    def write_gbyte_s(self, nodes: int) -> float:
        """What ``nodes`` nodes write together."""
        per_node = nodes * self.write_gbyte_s_per_node
        return per_node if self.write_gbyte_s_total is None else min(per_node, self.write_gbyte_s_total)


STORAGE_FIELDS = ("read_gbyte_s_per_node", "write_gbyte_s_per_node", "read_gbyte_s_total", "write_gbyte_s_total")


def _storage(raw: object) -> Storage:
    if raw is None:
        return Storage()
    if not isinstance(raw, dict):
        raise ValueError(f"storage must be a mapping of {', '.join(STORAGE_FIELDS)}, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(STORAGE_FIELDS))
    if unknown:
        allowed = ", ".join(STORAGE_FIELDS)
        raise ValueError(f"storage: unknown field(s) {', '.join(map(str, unknown))}; allowed: {allowed}")
    return Storage(**{k: _positive_number(f"storage.{k}", v) for k, v in raw.items()})


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """A cluster file (contract 2)."""

    name: str
    """The cluster's name (in tables and messages)."""
    node_groups: tuple[NodeGroup, ...]
    """The node groups, each of one GPU type; several groups may share a type."""
    inter_node_gbit_s: float
    """The inter-node network (the file's ``network`` section): NICs per node times Gbit/s per NIC, the
    default of every node group."""
    storage: Storage = Storage()
    """Checkpoint storage (the file's ``storage`` section): what a job's moves cost to save and load."""

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


def _positive_number(name: str, value: object) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0 or value == float("inf"):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


NETWORK_FIELDS = ("inter_node_gbps", "nics_per_node", "nic_gbps")
"""The keys of a cluster file's ``network`` section, which a node group may also give for itself."""
NODE_GROUP_FIELDS = ("gpu", "num_nodes", "gpus_per_node", "intra_node", "nvlink_domain", *NETWORK_FIELDS)
"""The keys of a ``node_groups`` entry."""
FIELD_OF_KEY = {"nic_gbps": "nic_gbit_s", "inter_node_gbps": "inter_node_gbit_s"}
"""The :class:`NodeGroup` attribute a file key sets, where the names differ (the file says ``gbps`` for
Gbit/s; the attributes say their unit)."""
DEFAULT_NETWORK = (1, 100.0)
"""NICs per node and Gbit/s per NIC of a cluster file whose ``network`` section states neither."""
DEFAULT_NUM_NODES = 1
DEFAULT_GPUS_PER_NODE = 8
DEFAULT_NAME = "cluster"


def _network(raw: dict[str, Any], where: str, default: tuple[int, float]) -> tuple[int, float]:
    """(NICs per node, Gbit/s per NIC) from a mapping with ``nics_per_node``/``nic_gbps`` or the older
    ``inter_node_gbps`` (one NIC of that speed); ``default`` when it states neither."""
    if "inter_node_gbps" in raw and ("nic_gbps" in raw or "nics_per_node" in raw):
        raise ValueError(f"{where}: give either inter_node_gbps or nics_per_node and nic_gbps, not both")
    if "inter_node_gbps" in raw:
        return 1, _positive_number(f"{where}.inter_node_gbps", raw["inter_node_gbps"])
    nics = _positive(f"{where}.nics_per_node", raw.get("nics_per_node", default[0]))
    gbps = _positive_number(f"{where}.nic_gbps", raw.get("nic_gbps", default[1]))
    return nics, gbps


CLUSTER_FIELDS = ("name", "network", "node_groups", "storage")
"""The top-level keys of a cluster file (contract 2)."""


def parse_cluster(data: dict[str, Any]) -> ClusterSpec:
    """A :class:`ClusterSpec` from a contract-2 mapping; errors name the field."""
    if not isinstance(data, dict):
        raise ValueError(f"a cluster must be a mapping of {', '.join(CLUSTER_FIELDS)}, got {type(data).__name__}")
    unknown = sorted(set(data) - set(CLUSTER_FIELDS))
    if unknown:
        raise ValueError(
            f"cluster: unknown field(s) {', '.join(map(str, unknown))}; allowed: {', '.join(CLUSTER_FIELDS)}"
        )
    network = data.get("network") or {}
    if not isinstance(network, dict):
        raise ValueError("network must be a mapping like {nics_per_node: 8, nic_gbps: 400} or {inter_node_gbps: 100}")
    unknown = sorted(set(network) - set(NETWORK_FIELDS))
    if unknown:
        raise ValueError(f"network: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(NETWORK_FIELDS)}")
    default_network = _network(network, "network", DEFAULT_NETWORK)
    groups_raw = data.get("node_groups")
    if not isinstance(groups_raw, list) or not groups_raw:
        raise ValueError("node_groups must be a non-empty list of {gpu, num_nodes, gpus_per_node, intra_node}")
    groups = []
    for i, raw in enumerate(groups_raw):
        where = f"node_groups[{i}]"
        if not isinstance(raw, dict) or "gpu" not in raw:
            raise ValueError(f"{where} must be a mapping with at least a gpu field")
        allowed = set(NODE_GROUP_FIELDS)
        unknown = sorted(set(raw) - allowed)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
        try:
            gpu = resolve_gpu(raw["gpu"])
        except ValueError as err:
            raise ValueError(f"{where}.{err}") from None
        intra = str(raw.get("intra_node", gpu.intra_node)).lower()
        if intra not in INTRA_NODE_KINDS:
            raise ValueError(f"{where}.intra_node must be one of {', '.join(INTRA_NODE_KINDS)}, got {intra!r}")
        nics, nic_gbit_s = _network(raw, where, default_network) if set(raw) & set(NETWORK_FIELDS) else default_network
        per_node = _positive(f"{where}.gpus_per_node", raw.get("gpus_per_node", DEFAULT_GPUS_PER_NODE))
        domain = _positive(f"{where}.nvlink_domain", raw.get("nvlink_domain", per_node))
        if domain % per_node:
            raise ValueError(f"{where}.nvlink_domain ({domain}) must be a multiple of gpus_per_node ({per_node})")
        if domain > per_node and intra != "nvlink":
            raise ValueError(f"{where}.nvlink_domain above one node needs intra_node nvlink, got {intra!r}")
        groups.append(
            NodeGroup(
                gpu=gpu,
                num_nodes=_positive(f"{where}.num_nodes", raw.get("num_nodes", DEFAULT_NUM_NODES)),
                gpus_per_node=per_node,
                intra_node=intra,
                nics_per_node=nics,
                nic_gbit_s=nic_gbit_s,
                nvlink_domain=domain,
            )
        )
    nics, nic_gbit_s = default_network
    return ClusterSpec(
        name=str(data.get("name") or DEFAULT_NAME),
        node_groups=tuple(groups),
        inter_node_gbit_s=nics * nic_gbit_s,
        storage=_storage(data.get("storage")),
    )


def load_cluster(path: str | Path) -> ClusterSpec:
    return parse_cluster(load_mapping(path))
