"""``frenzy launch JOB``: plan one job on a cluster, place it, run it for real through an executor and
compare what it measured with what MARP and the step-time model predicted for the same plan.

The plan is the fastest memory-feasible one the executor can run (``executor.supports``) among those whose
placement the cluster admits; the placement is the shared rule's (best fit inside a node, whole nodes
beyond). With the local executor, a plan on a GPU type this machine lacks is refused before anything
starts (:func:`frenzy_opt.launch.executors.local.device_problem`): it never runs on the CPU in the GPU's name.
The run is one attempt (no retry): ``state`` is ``succeeded`` or ``failed`` with the cause.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

from frenzy_opt.core.spec import JobSpec
from frenzy_opt.hardware.cluster import ClusterSpec
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.launch.executors import ExitInfo, Launch, make_executor
from frenzy_opt.launch.executors.local import LocalExecutor, device_problem
from frenzy_opt.planning.problem import OptionCache


def launch_job(
    spec: JobSpec,
    cluster: ClusterSpec,
    *,
    executor_name: str = "local",
    steps: int | None = None,
    workdir: str | Path = "frenzy-runs",
    job_id: str | None = None,
    timeout_s: float = 3600.0,
) -> dict[str, Any]:
    """Run ``spec`` once (module docstring); the contract-3 payload of ``frenzy launch``. Each launch gets
    its own run folder (``job_id``, default a fresh one), so nothing resumes from an earlier launch."""
    job_id = job_id or f"launch-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    executor = make_executor(executor_name, workdir=str(workdir), max_steps=steps)
    topology = Topology(cluster)
    supports = getattr(executor, "supports", None)
    cache = OptionCache(
        cluster,
        topology,
        plan_filter=None if supports is None else (lambda plan, s: bool(supports(plan, s.model))),
    )
    options = sorted(cache.options(spec), key=lambda o: (o.plan.step_time_s or o.duration_s, o.num_gpus))
    if not options:
        raise ValueError(
            f"job {spec.name}: no plan the {executor_name} executor can run fits cluster {cluster.name} "
            "(see `frenzy plan` for every memory-feasible plan)"
        )
    option = options[0]
    if isinstance(executor, LocalExecutor):
        problem = device_problem(option.gpu_type, option.gpus_per_node, executor.cpu)
        if problem is not None:
            raise ValueError(f"launch of job {spec.name} on cluster {cluster.name}: {problem}")
    free = {n.index: n.num_gpus for n in topology.nodes}
    nodes = topology.best_nodes(
        option.gpu_type, option.num_gpus, {i: free[i] for i in topology.nodes_of(option.gpu_type)}
    )
    assert nodes is not None  # an empty cluster holds every option the placement rule admits
    names = tuple(topology.nodes[i].name for i in nodes)
    done = threading.Event()
    result: dict[str, ExitInfo] = {}

    def on_exit(_: str, __: int, info: ExitInfo) -> None:
        result["info"] = info
        done.set()

    executor.launch(
        Launch(
            job_id=job_id,
            attempt=1,
            spec=spec,
            option=option,
            nodes=names,
            gpus_per_node=option.gpus_per_node,
            duration_s=option.duration_s,
        ),
        on_exit,
    )
    if not done.wait(timeout_s):
        executor.cancel(job_id)
        raise RuntimeError(f"launch: the run did not end within {timeout_s:.0f} s")
    info = result["info"]
    measured = dict(info.measured)
    plan = option.plan
    return {
        "job": spec.to_mapping(),
        "state": "succeeded" if info.ok else "failed",
        "cause": info.cause,
        "plan": plan.to_dict(),
        "placement": {"nodes": list(names), "gpus_per_node": option.gpus_per_node},
        "steps_run": measured.get("steps_run", 0),
        "loss_first": measured.get("loss_first"),
        "loss_last": measured.get("loss_last"),
        "measured": {
            "peak_memory_bytes": measured.get("peak_memory_bytes"),
            "memory_source": measured.get("memory_source"),
            "step_time_s": measured.get("step_time_s"),
            "tokens_per_s": measured.get("tokens_per_s"),
        },
        "predicted": {
            "peak_allocated_bytes": plan.peak_allocated_bytes,
            "device_used_bytes": plan.device_used_bytes,
            "step_time_s": plan.step_time_s,
        },
        "workdir": str(Path(workdir) / job_id),
    }
