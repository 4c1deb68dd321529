"""Exports of a placement for clusters run by other engines: a Slurm batch script or a Kubernetes manifest.

A *placement file* (JSON or YAML) names the job spec, the plan and the placement — what ``frenzy launch
--json`` and ``GET /v1/jobs/{id}`` print::

    {"job": {...contract-1 spec...} | "path/to/job.yaml",
     "plan": {"gpu_type": "A100-SXM4-80GB", "num_gpus": 16, "parallel": {...}, "micro_batch_size": 1},
     "placement": {"nodes": ["…", "…"], "gpus_per_node": 8}}

* **Slurm** (``--to slurm``): an sbatch script asking for ``--nodes`` x ``--ntasks-per-node=1`` with typed
  GRES ``--gres=gpu:<type>:<gpus per node>`` (the lower-cased GPU type is the GRES type name the site's
  ``gres.conf`` must define), writing the spec and plan next to it, then ``srun torchrun`` with c10d
  rendezvous on the first node of the allocation (``--nnodes $SLURM_NNODES --node-rank $SLURM_NODEID``).
* **Kubernetes** (``--to k8s``): a JobSet (``jobset.x-k8s.io/v1alpha2``) of one replicated job with one pod
  per node, a node selector on the GPU type (``nvidia.com/gpu.product``, the label NVIDIA's GPU feature
  discovery sets), ``nvidia.com/gpu`` limits, the spec and plan in a ConfigMap, and torchrun rendezvous on
  the JobSet's headless service (pod 0).

Both run the same worker (``python -m frenzy_opt.launch.worker.train``) the local executor runs.

``frenzy plan JOB --cluster C --export slurm|k8s`` exports the placement the service's decision gives the
job alone (:func:`frenzy_opt.service.launcher.decided_placement`).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from frenzy_opt.core.spec import load_mapping, parse_job, plan_layout

TARGETS = ("slurm", "k8s")


def load_placement(path: str | Path) -> dict[str, Any]:
    """A placement file, its job resolved and checked; ``ValueError`` names the missing field."""
    data = load_mapping(Path(path))
    for field in ("job", "plan", "placement"):
        if field not in data:
            raise ValueError(f"placement file: {field} is required (job spec, plan and placement)")
    job = data["job"]
    if isinstance(job, str):
        job = load_mapping((Path(path).parent / job) if not Path(job).is_absolute() else Path(job))
    parse_job(job)  # the spec must be valid
    plan, placement = data["plan"], data["placement"]
    for field in ("gpu_type", "num_gpus"):
        if field not in plan:
            raise ValueError(f"placement file: plan.{field} is required")
    try:
        plan_layout(plan)
    except ValueError as err:
        raise ValueError(f"placement file: {err}") from None
    nodes = placement.get("nodes")
    per_node = placement.get("gpus_per_node")
    if not isinstance(nodes, list) or not nodes or not isinstance(per_node, int) or per_node < 1:
        raise ValueError("placement file: placement needs nodes (a non-empty list) and gpus_per_node (>= 1)")
    if len(nodes) * per_node != plan["num_gpus"]:
        raise ValueError(f"placement file: {len(nodes)} nodes x {per_node} GPUs != plan.num_gpus {plan['num_gpus']}")
    return {"job": job, "plan": plan, "placement": placement}


def _name(placement: dict[str, Any]) -> str:
    raw = str(placement["job"].get("name") or "frenzy-job").lower()
    return re.sub(r"[^a-z0-9-]+", "-", raw).strip("-")[:50] or "frenzy-job"


def gres_type(gpu_type: str) -> str:
    """The Slurm GRES type name of a GPU type (lower case, only letters, digits, ``-`` and ``_``)."""
    return re.sub(r"[^a-z0-9_-]+", "-", gpu_type.lower())


def to_slurm(
    placement: dict[str, Any],
    *,
    steps: int | None = None,
    partition: str | None = None,
    python: str = "python",
    worker_args: str = "",
) -> str:
    """The sbatch script of a placement (module docstring); ``python`` is the interpreter with frenzy-opt
    installed on the nodes, ``worker_args`` extra flags for the worker (e.g. ``--cpu``)."""
    name = _name(placement)
    nodes = len(placement["placement"]["nodes"])
    per_node = int(placement["placement"]["gpus_per_node"])
    gpu = placement["plan"]["gpu_type"]
    job_json = json.dumps(placement["job"], sort_keys=True)
    plan_json = json.dumps(placement["plan"], sort_keys=True)
    steps_arg = f" --steps {steps}" if steps else ""
    lines = [
        "#!/bin/bash",
        f"# frenzy-opt export: {placement['plan']['num_gpus']} x {gpu} on {nodes} node(s)",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gres=gpu:{gres_type(gpu)}:{per_node}",
        f"#SBATCH --output={name}-%j.out",
    ]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    lines += [
        "set -euo pipefail",
        'RUN_DIR="${SLURM_SUBMIT_DIR:-$PWD}/' + name + '-${SLURM_JOB_ID}"',
        'mkdir -p "$RUN_DIR"',
        f"cat > \"$RUN_DIR/job.json\" <<'FRENZY_JOB'\n{job_json}\nFRENZY_JOB",
        f"cat > \"$RUN_DIR/plan.json\" <<'FRENZY_PLAN'\n{plan_json}\nFRENZY_PLAN",
        'HEAD_NODE="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        "export FRENZY_RDZV_PORT=${FRENZY_RDZV_PORT:-29500}",
        'cd "$RUN_DIR"',
        "srun --kill-on-bad-exit=1 "
        + shlex.join([python, "-m", "torch.distributed.run"])
        + f' --nnodes="$SLURM_NNODES" --node-rank="$SLURM_NODEID" --nproc-per-node={per_node}'
        + ' --rdzv-backend=c10d --rdzv-endpoint="$HEAD_NODE:$FRENZY_RDZV_PORT" --rdzv-id="$SLURM_JOB_ID"'
        + " -m frenzy_opt.launch.worker.train --job job.json --plan plan.json --checkpoint-dir checkpoints"
        + f" --report report.jsonl{steps_arg}"
        + (f" {worker_args}" if worker_args else ""),
    ]
    return "\n".join(lines) + "\n"


# NVIDIA GPU feature discovery's product label values for the catalogue's GPU types.
K8S_PRODUCTS = {
    "A100-SXM4-80GB": "NVIDIA-A100-SXM4-80GB",
    "A100-SXM4-40GB": "NVIDIA-A100-SXM4-40GB",
    "A100-PCIE-80GB": "NVIDIA-A100-PCIE-80GB",
    "A100-PCIE-40GB": "NVIDIA-A100-PCIE-40GB",
    "H100-SXM5-80GB": "NVIDIA-H100-80GB-HBM3",
    "H100-PCIE-80GB": "NVIDIA-H100-PCIe",
    "H200-SXM-141GB": "NVIDIA-H200",
    "V100-SXM2-32GB": "Tesla-V100-SXM2-32GB",
    "V100-SXM2-16GB": "Tesla-V100-SXM2-16GB",
    "V100-PCIE-16GB": "Tesla-V100-PCIE-16GB",
    "T4": "Tesla-T4",
    "L4": "NVIDIA-L4",
    "L40S": "NVIDIA-L40S",
    "A10G": "NVIDIA-A10G",
}


def to_k8s(placement: dict[str, Any], *, steps: int | None = None, image: str = "frenzy-opt:latest") -> str:
    """The Kubernetes manifest of a placement (module docstring): a ConfigMap and a JobSet."""
    name = _name(placement)
    nodes = len(placement["placement"]["nodes"])
    per_node = int(placement["placement"]["gpus_per_node"])
    gpu = placement["plan"]["gpu_type"]
    product = K8S_PRODUCTS.get(gpu, gpu)
    command = (
        f"python -m torch.distributed.run --nnodes={nodes} --node-rank=$(JOB_COMPLETION_INDEX)"
        f" --nproc-per-node={per_node} --rdzv-backend=c10d"
        f" --rdzv-endpoint={name}-workers-0-0.{name}:29500 --rdzv-id={name}"
        " -m frenzy_opt.launch.worker.train --job /etc/frenzy/job.json --plan /etc/frenzy/plan.json"
        " --checkpoint-dir /checkpoints --report /checkpoints/report.jsonl" + (f" --steps {steps}" if steps else "")
    )
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-spec"},
        "data": {
            "job.json": json.dumps(placement["job"], sort_keys=True),
            "plan.json": json.dumps(placement["plan"], sort_keys=True),
        },
    }
    container = {
        "name": "trainer",
        "image": image,
        "command": ["bash", "-c", command],
        "resources": {"limits": {"nvidia.com/gpu": per_node}},
        "volumeMounts": [
            {"name": "spec", "mountPath": "/etc/frenzy"},
            {"name": "checkpoints", "mountPath": "/checkpoints"},
        ],
    }
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "frenzy-opt"}},
        "spec": {
            "network": {"enableDNSHostnames": True, "subdomain": name},
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "parallelism": nodes,
                            "completions": nodes,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "nodeSelector": {"nvidia.com/gpu.product": product},
                                    "containers": [container],
                                    "volumes": [
                                        {"name": "spec", "configMap": {"name": f"{name}-spec"}},
                                        {"name": "checkpoints", "emptyDir": {}},
                                    ],
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    return yaml.safe_dump_all([config_map, jobset], sort_keys=False)
