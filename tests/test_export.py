"""Exports of a placement: the Slurm batch script and the Kubernetes manifest have the structure their
engines need, and the sbatch script really runs on a single-node Slurm cluster the test starts."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from slurm_cluster import available, slurm_cluster  # tests/ is on sys.path (pytest rootdir-less import)

from frenzy_opt.cli import main
from frenzy_opt.core.spec import parse_job
from frenzy_opt.planning.export import load_placement, to_k8s, to_slurm

TINY = {
    "name": "tiny",
    "model": {
        "num_layers": 4, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4, "num_kv_heads": 2,
        "vocab_size": 256, "mlp": "swiglu", "norm": "rmsnorm", "tied_embeddings": False,
    },
    "training": {"seq_len": 32, "micro_batch_size": 2, "global_batch_size": 8, "train_steps": 6, "precision": "fp32"},
}  # fmt: skip


def _placement(gpu: str, nodes: int, per_node: int, parallel: dict[str, Any]) -> dict[str, Any]:
    return {
        "job": TINY,
        "plan": {"gpu_type": gpu, "num_gpus": nodes * per_node, "parallel": parallel, "micro_batch_size": 2},
        "placement": {"nodes": [f"n{i}" for i in range(nodes)], "gpus_per_node": per_node},
    }


def _write(tmp_path: Path, placement: dict[str, Any]) -> Path:
    path = tmp_path / "placement.json"
    path.write_text(json.dumps(placement), encoding="utf-8")
    return path


def test_slurm_script_asks_for_typed_gres_and_runs_torchrun_per_node(tmp_path: Path) -> None:
    placement = load_placement(_write(tmp_path, _placement("A100-SXM4-80GB", 2, 8, {"dp": 4, "tp": 4})))
    script = to_slurm(placement, steps=100, partition="gpu")
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=1" in script
    assert "#SBATCH --gres=gpu:a100-sxm4-80gb:8" in script and "#SBATCH --partition=gpu" in script
    assert "srun --kill-on-bad-exit=1 python -m torch.distributed.run" in script
    assert '--nnodes="$SLURM_NNODES" --node-rank="$SLURM_NODEID" --nproc-per-node=8' in script
    assert "-m frenzy_opt.launch.worker.train --job job.json --plan plan.json" in script and "--steps 100" in script
    job_json = script.split("<<'FRENZY_JOB'\n", 1)[1].split("\nFRENZY_JOB", 1)[0]
    assert parse_job(json.loads(job_json)) == parse_job(TINY)
    plan_json = json.loads(script.split("<<'FRENZY_PLAN'\n", 1)[1].split("\nFRENZY_PLAN", 1)[0])
    assert plan_json == placement["plan"]  # the worker reads the plan as written (plan_layout)
    (tmp_path / "job.sbatch").write_text(script, encoding="utf-8")
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")]).returncode == 0


def test_k8s_manifest_is_a_configmap_and_a_jobset_pinned_to_the_gpu_type(tmp_path: Path) -> None:
    placement = load_placement(_write(tmp_path, _placement("H100-SXM5-80GB", 4, 8, {"dp": 8, "tp": 4})))
    config_map, jobset = list(yaml.safe_load_all(to_k8s(placement, image="registry.local/frenzy:1")))
    assert config_map["kind"] == "ConfigMap" and set(config_map["data"]) == {"job.json", "plan.json"}
    assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and jobset["kind"] == "JobSet"
    job = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["parallelism"] == job["completions"] == 4 and job["completionMode"] == "Indexed"
    pod = job["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    container = pod["containers"][0]
    assert container["image"] == "registry.local/frenzy:1"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert "--nnodes=4 --node-rank=$(JOB_COMPLETION_INDEX) --nproc-per-node=8" in container["command"][2]


def test_export_cli_and_bad_placements(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, _placement("A100-SXM4-80GB", 1, 4, {"dp": 4}))
    assert main(["export", str(path), "--to", "slurm", "--out", str(tmp_path / "x.sbatch")]) == 0
    assert (tmp_path / "x.sbatch").read_text().startswith("#!/bin/bash")
    capsys.readouterr()
    bad = _placement("A100-SXM4-80GB", 2, 4, {"dp": 4})
    bad["plan"]["num_gpus"] = 4
    assert main(["export", str(_write(tmp_path, bad)), "--to", "k8s"]) == 2
    assert "2 nodes x 4 GPUs != plan.num_gpus 4" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(available() is not None, reason=str(available()))
def test_the_generated_sbatch_really_runs_on_a_slurm_cluster(tmp_path: Path) -> None:
    placement = load_placement(_write(tmp_path, _placement("CPU-SLOT", 1, 2, {"dp": 2})))
    script = tmp_path / "job.sbatch"
    script.write_text(to_slurm(placement, python=sys.executable, worker_args="--cpu"), encoding="utf-8")
    with slurm_cluster(tmp_path / "slurm", "cpu-slot", 2) as env:
        submitted = subprocess.run(
            ["sbatch", "--parsable", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
        )
        job_id = submitted.stdout.strip().split(";")[0]
        deadline = time.monotonic() + 180
        while True:
            info = subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True, text=True).stdout
            state = next((w.split("=", 1)[1] for w in info.split() if w.startswith("JobState=")), "")
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert "Gres=gpu:cpu-slot:2" in info or "gpu:cpu-slot:2" in info
    logs = "".join(p.read_text(errors="replace") for p in tmp_path.glob("tiny-*.out"))
    assert state == "COMPLETED", logs[-3000:]
    report = next(tmp_path.glob(f"tiny-{job_id}/report.jsonl"))
    records = [json.loads(line) for line in report.read_text().splitlines()]
    steps = [r for r in records if r["event"] == "step"]
    assert len(steps) == 6 and steps[-1]["loss"] < steps[0]["loss"]
    assert records[0]["world"] == 2


def _plan_export(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    """``frenzy plan job-llama3-8b --cluster paper-3type --export ... --json``: the payload's export."""
    capsys.readouterr()
    assert main(["plan", "job-llama3-8b", "--cluster", "paper-3type", "--top", "1", "--json", *args]) == 0
    export: dict[str, Any] = json.loads(capsys.readouterr().out)["export"]
    return export


def test_plan_export_is_the_schedulers_choice_written_as_frenzy_export_writes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from frenzy_opt.core.spec import load_job
    from frenzy_opt.hardware.topology import Topology
    from frenzy_opt.launch.executors.common import plan_supported
    from frenzy_opt.planning.export import gres_type
    from frenzy_opt.planning.problem import OptionCache
    from frenzy_opt.planning.scenario import load_cluster_ref, resolve

    export = _plan_export(capsys, "--export", "slurm")
    placement, script = export["placement"], export["text"]
    plan, nodes, per_node = placement["plan"], placement["placement"]["nodes"], placement["placement"]["gpus_per_node"]
    cluster = load_cluster_ref("paper-3type")
    assert plan["gpu_type"] in {g.name for g in cluster.gpu_types()} and len(nodes) * per_node == plan["num_gpus"]
    # One job on an empty cluster, nobody queued behind it: the HAS takes its fastest option (module docstring
    # of frenzy_opt.solvers.greedy) among those the worker runs.
    cache = OptionCache(cluster, Topology(cluster), plan_filter=lambda p, s: plan_supported(p, s.model))
    options = cache.options(load_job(resolve("job-llama3-8b")))
    assert plan["est_runtime_s"] == min(o.plan.est_runtime_s or 0.0 for o in options)
    assert f"#SBATCH --gres=gpu:{gres_type(plan['gpu_type'])}:{per_node}\n" in script
    assert f"#SBATCH --nodes={len(nodes)}\n" in script
    # The same text as `frenzy export` of that placement, and as the plain command prints or --out writes.
    path = _write(tmp_path, placement)
    capsys.readouterr()
    assert main(["export", str(path), "--to", "slurm"]) == 0
    assert capsys.readouterr().out == script
    assert main(["plan", "job-llama3-8b", "--cluster", "paper-3type", "--export", "slurm"]) == 0
    assert capsys.readouterr().out == script
    out = tmp_path / "job.sbatch"
    assert main(["plan", "job-llama3-8b", "--cluster", "paper-3type", "--export", "slurm", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == script and f"wrote {out}" in capsys.readouterr().out
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0

    k8s = _plan_export(capsys, "--export", "k8s")
    assert k8s["placement"] == placement
    _, jobset = list(yaml.safe_load_all(k8s["text"]))
    job = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["parallelism"] == job["completions"] == len(nodes)
    assert job["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == per_node
    assert main(["export", str(path), "--to", "k8s"]) == 0
    assert capsys.readouterr().out == k8s["text"]


def test_plan_export_refusals_name_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["plan", "job-inline-moe", "--cluster", "paper-3type", "--export", "slurm"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "model.num_experts" in out.err and out.err.count("\n") == 1
    assert main(["plan", "job-tiny", "--cluster", "paper-3type", "--export", "k8s", "--headroom", "0.2"]) == 2
    assert "training.memory_headroom" in capsys.readouterr().err
    assert main(["plan", "job-tiny", "--cluster", "paper-3type", "--out", "x.sbatch"]) == 2
    assert "--export" in capsys.readouterr().err
