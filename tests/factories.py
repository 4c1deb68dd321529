"""Test fixtures' builders (tests/ is on sys.path, as for ``pgserver``): synthetic plans and options for scheduler
tests (data-parallel plans that fit their GPU with room to spare, whose step time the test chooses), and the
configuration of a simulated service."""

from __future__ import annotations

from typing import Any

from frenzy_opt.api.app import ServiceConfig
from frenzy_opt.api.auth import parse_tenants
from frenzy_opt.core.spec import ParallelConfig
from frenzy_opt.hardware.cluster import ClusterSpec, parse_cluster
from frenzy_opt.hardware.gpus import lookup_gpu
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.launch.executors.simulated import SimulatedExecutor
from frenzy_opt.planning.plans import Plan
from frenzy_opt.planning.problem import Option
from frenzy_opt.planning.scenario import load_cluster_ref


def cluster_of(*groups: tuple[str, int, int], name: str = "test") -> ClusterSpec:
    """A cluster of (GPU type, nodes, GPUs per node) groups on a 100 Gbit/s network."""
    return parse_cluster(
        {
            "name": name,
            "node_groups": [{"gpu": g, "num_nodes": n, "gpus_per_node": k} for g, n, k in groups],
            "network": {"inter_node_gbps": 100},
        }
    )


def first_per_count(plans: list[Plan]) -> dict[tuple[str, int], Plan]:
    """The first plan of each (GPU type, GPU count) in ``plans`` (ranked: the full search's choice there)."""
    best: dict[tuple[str, int], Plan] = {}
    for plan in plans:
        best.setdefault((plan.gpu_type, plan.num_gpus), plan)
    return best


def synthetic_plan(gpu_type: str, num_gpus: int, step_s: float | None = None) -> Plan:
    """A dp plan on ``num_gpus`` x ``gpu_type`` using half of each GPU's memory; ``step_s`` its step time and
    (one step) estimated run time."""
    gpu = lookup_gpu(gpu_type)
    return Plan(
        gpu_type=gpu_type,
        num_gpus=num_gpus,
        parallel=ParallelConfig(dp=num_gpus),
        micro_batch_size=1,
        precision="bf16",
        peak_allocated_bytes=gpu.memory_bytes // 2,
        peak_reserved_bytes=gpu.memory_bytes // 2,
        device_used_bytes=gpu.memory_bytes // 2,
        capacity_bytes=gpu.memory_bytes,
        step_time_s=step_s,
        est_runtime_s=step_s,
    )


def synthetic_option(topology: Topology, gpu_type: str, num_gpus: int, duration_s: float) -> Option:
    """The option of :func:`synthetic_plan` running ``duration_s``, shaped by the topology's placement rule."""
    return Option(
        gpu_type=gpu_type,
        num_gpus=num_gpus,
        whole_nodes=topology.nodes_needed(gpu_type, num_gpus),
        duration_s=duration_s,
        plan=synthetic_plan(gpu_type, num_gpus, duration_s),
    )


def simulated_service(
    db_url: str, time_scale: float, tenants: dict[str, Any] | None = None, **settings: Any
) -> ServiceConfig:
    """A service on the shipped ``paper-3type`` cluster with the simulated executor, whose clock runs at the
    service's ``time_scale``; ``tenants`` is a tokens file's mapping (None: local mode)."""
    cluster = load_cluster_ref("paper-3type")
    return ServiceConfig(
        cluster=cluster,
        db_url=db_url,
        executor=SimulatedExecutor(time_scale=time_scale),
        tenants=parse_tenants(tenants or {}, [g.name for g in cluster.gpu_types()]),
        time_scale=time_scale,
        **settings,
    )
