"""The ``frenzy`` command line (contract 3): JSON keys, memory invariants of ``predict``, plan validity,
exit codes and messages. In-process through ``main(argv)``, plus one run of the installed console script."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from frenzy_opt.cli import main
from frenzy_opt.hardware.gpus import load_gpus, lookup_gpu
from frenzy_opt.models.catalog import load_catalog, parse_model
from frenzy_opt.planning.scenario import load_cluster_ref, load_scenario

GIB = 2**30
ARCH_FIELDS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads", "vocab_size", "mlp",
    "norm", "tied_embeddings", "num_experts", "moe_top_k", "moe_ffn_hidden_size",
)  # fmt: skip
GPU_KEYS = ("name", "memory_bytes", "bf16_tflops", "fp32_tflops", "hbm_gbps", "intra_node_gbps", "source")
TOTALS = ("peak_allocated_bytes", "peak_reserved_bytes", "device_used_bytes")
PREDICT_KEYS = ("gpu_type", "parallel", "fits", "capacity_bytes", *TOTALS, "stages")
PLAN_KEYS = ("gpu_type", "num_gpus", "parallel", "peak_allocated_bytes", "step_time_s", "est_runtime_s")
CUDA_ONLY = {"allocator_reserve", "cuda_context", "nccl_buffers"}
BOUND_ROWS = {"states", "activations", "activation_margin", "library_workspaces", "allocator_reserve", "cuda_context",
              "nccl_buffers", "cached_reserve"}  # fmt: skip

INLINE_MODEL = {
    "num_layers": 8, "hidden_size": 1024, "ffn_hidden_size": 2816, "num_attention_heads": 16, "num_kv_heads": 4,
    "vocab_size": 32000, "mlp": "swiglu", "norm": "rmsnorm", "tied_embeddings": False, "num_experts": 1,
    "moe_top_k": 1, "moe_ffn_hidden_size": None,
}  # fmt: skip


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    payload = json.loads(out)  # exactly one JSON object on stdout
    assert isinstance(payload, dict)
    return payload


def write_yaml(path: Path, data: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return str(path)


def job_file(tmp_path: Path, model: str | dict[str, Any] = "llama3-8b", name: str = "job", **sections: Any) -> str:
    data: dict[str, Any] = {
        "name": name,
        "model": model,
        "training": {"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": 64, "train_steps": 100},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return write_yaml(tmp_path / f"{name}.yaml", data)


# --- catalog ------------------------------------------------------------------------------------------------


def test_catalog_gpus_json(capsys: pytest.CaptureFixture[str]) -> None:
    gpus = run_json(capsys, "catalog", "gpus")["gpus"]
    assert [g["name"] for g in gpus] == list(load_gpus())
    for gpu in gpus:
        for key in GPU_KEYS:
            assert key in gpu, (gpu.get("name"), key)
        assert gpu["memory_bytes"] == lookup_gpu(gpu["name"]).memory_bytes > 0
        assert gpu["source"].startswith("https://")
    by_name = {g["name"]: g for g in gpus}
    assert by_name["V100-SXM2-32GB"]["bf16_tflops"] is None  # Volta: no bf16 tensor cores
    assert by_name["A100-SXM4-80GB"]["bf16_tflops"] == 312


def test_catalog_models_json(capsys: pytest.CaptureFixture[str]) -> None:
    models = run_json(capsys, "catalog", "models")["models"]
    assert sorted(m["name"].lower() for m in models) == sorted(load_catalog())
    for entry in models:
        for key in ("name", "num_params", *ARCH_FIELDS):
            assert key in entry, (entry.get("name"), key)
        # Each entry is itself a valid inline architecture (contract 1) with the same parameter count.
        arch = parse_model({k: v for k, v in entry.items() if k != "num_params"})
        assert arch.num_params == entry["num_params"] == load_catalog()[entry["name"].lower()].num_params


# --- predict ------------------------------------------------------------------------------------------------


def check_prediction(payload: dict[str, Any], gpu: str, pp: int) -> None:
    for key in PREDICT_KEYS:
        assert key in payload, key
    assert payload["gpu_type"] == lookup_gpu(gpu).name
    assert payload["capacity_bytes"] == lookup_gpu(gpu).memory_bytes
    stages = payload["stages"]
    assert len(stages) == pp == payload["parallel"]["pp"]
    assert [s["stage"] for s in stages] == list(range(pp))
    for total in TOTALS:
        assert payload[total] == max(s[total] for s in stages), total
    for stage in stages:
        assert 0 < stage["peak_allocated_bytes"] <= stage["peak_reserved_bytes"] <= stage["device_used_bytes"]
        breakdown = stage["breakdown"]
        assert all(isinstance(v, int) and v >= 0 for v in breakdown.values()), breakdown
        assert set(breakdown) >= CUDA_ONLY
        assert sum(v for k, v in breakdown.items() if k not in CUDA_ONLY) == stage["peak_allocated_bytes"]
        assert sum(breakdown.values()) == stage["device_used_bytes"]
        # The bound of parts: model states exact, every row named, the required part what admission tests.
        bound = stage["bound"]
        assert set(bound) == BOUND_ROWS
        states = ("weights", "grads", "master_weights", "optimizer_states", "weight_cache")
        assert bound["states"] == sum(breakdown[k] for k in states)
        assert bound["states"] + bound["activations"] + bound["library_workspaces"] == stage["peak_allocated_bytes"]
        assert stage["required_upper_bytes"] == sum(v for k, v in bound.items() if k != "cached_reserve")
        assert stage["peak_allocated_upper_bytes"] >= stage["peak_allocated_bytes"]
        assert stage["device_used_upper_bytes"] >= stage["required_upper_bytes"]
    assert payload["fits"] == (payload["device_used_bytes"] <= payload["capacity_bytes"])


def test_predict_catalogue_model_pipeline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = job_file(tmp_path, parallel={"tp": 2, "pp": 4})
    payload = run_json(capsys, "predict", job, "--gpu", "A100-SXM4-80GB")
    check_prediction(payload, "A100-SXM4-80GB", pp=4)
    assert payload["parallel"]["tp"] == 2
    stages = payload["stages"]
    # The first stage holds the embedding and the most in-flight micro-batches, the last the output and loss.
    assert stages[0]["breakdown"] != stages[-1]["breakdown"]
    assert sum(s["num_layers"] for s in stages) == load_catalog()["llama3-8b"].num_layers


def test_predict_inline_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = job_file(tmp_path, model=INLINE_MODEL, parallel={"pp": 2})
    payload = run_json(capsys, "predict", job, "--gpu", "L4")
    check_prediction(payload, "L4", pp=2)
    # Untied, tp = 1: the pipeline stages partition the parameters.
    assert sum(s["num_params"] for s in payload["stages"]) == parse_model(INLINE_MODEL).num_params


def test_predict_fits_flag_on_a_gpu_too_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 70B parameters need at least 140 GB for bf16 weights alone: never on one 16 GiB T4.
    payload = run_json(capsys, "predict", job_file(tmp_path, model="llama3-70b"), "--gpu", "T4")
    check_prediction(payload, "T4", pp=1)
    assert payload["fits"] is False
    assert payload["peak_allocated_bytes"] > 2 * 70e9


@pytest.mark.parametrize("parallel", [{}, {"pp": 2}, {"tp": 2, "dp": 2, "recompute": "selective"}])
def test_larger_micro_batch_never_lowers_peak(
    parallel: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = job_file(tmp_path, parallel=parallel) if parallel else job_file(tmp_path)
    peaks = []
    for mbs in (1, 2, 4, 8):
        payload = run_json(capsys, "predict", job, "--gpu", "H100-SXM5-80GB", "--micro-batch-size", str(mbs))
        peaks.append(payload["peak_allocated_bytes"])
    assert peaks == sorted(peaks)
    assert peaks[-1] > peaks[0]


def test_micro_batch_override_is_validated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        capsys, "predict", job_file(tmp_path), "--gpu", "H100-SXM5-80GB", "--micro-batch-size", "3"
    )
    assert code == 2 and out == ""
    assert "training.global_batch_size" in err


# --- plan ---------------------------------------------------------------------------------------------------


def check_plans(plans: list[dict[str, Any]], cluster_ref: str) -> None:
    cluster = load_cluster_ref(cluster_ref)
    for plan in plans:
        for key in PLAN_KEYS:
            assert key in plan, key
        p = plan["parallel"]
        assert plan["num_gpus"] == p["dp"] * p["tp"] * p["pp"] * p["cp"]
        assert plan["gpu_type"] in {g.name for g in cluster.gpu_types()}
        assert plan["num_gpus"] <= cluster.num_gpus_of(plan["gpu_type"])
        assert p["tp"] <= cluster.gpus_per_node_of(plan["gpu_type"])
        assert plan["capacity_bytes"] == lookup_gpu(plan["gpu_type"]).memory_bytes
        assert plan["peak_allocated_bytes"] <= plan["device_used_bytes"] <= plan["capacity_bytes"]
    if all(plan["step_time_s"] is None for plan in plans):
        # No step-time model yet: fewest GPUs first.
        assert [p["num_gpus"] for p in plans] == sorted(p["num_gpus"] for p in plans)
    else:
        assert [p["step_time_s"] for p in plans] == sorted(p["step_time_s"] for p in plans)


def test_plan_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    payload = run_json(capsys, "plan", job_file(tmp_path), "--cluster", "paper-3type", "--top", "5")
    plans = payload["plans"]
    assert 1 <= len(plans) <= 5
    check_plans(plans, "paper-3type")


def test_plan_shows_the_best_plan_of_each_type_on_a_mixed_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    payload = run_json(capsys, "plan", job_file(tmp_path), "--cluster", "paper-3type", "--top", "2")
    best = payload["best_per_type"]
    types = [p["gpu_type"] for p in best]
    assert len(types) == len(set(types)) == 3  # paper-3type's three types, each once
    every = run_json(capsys, "plan", job_file(tmp_path), "--cluster", "paper-3type", "--top", "100000")["plans"]
    for plan in best:  # each the fastest of its type
        fastest = min((p for p in every if p["gpu_type"] == plan["gpu_type"]), key=lambda p: p["step_time_s"])
        assert plan["step_time_s"] == fastest["step_time_s"]
    two = run_json(capsys, "plan", job_file(tmp_path), "--cluster", "paper-3type", "--per-type", "2")
    assert len(two["best_per_type"]) == 6
    none = run_json(capsys, "plan", job_file(tmp_path), "--cluster", "paper-3type", "--per-type", "0")
    assert none["best_per_type"] == []


def test_plan_keeps_pinned_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pinned = {"tp": 2, "recompute": "selective", "zero_stage": 1, "sequence_parallel": False}
    job = job_file(tmp_path, model=INLINE_MODEL, parallel=pinned)
    plans = run_json(capsys, "plan", job, "--cluster", "paper-3type", "--top", "50")["plans"]
    assert plans
    check_plans(plans, "paper-3type")
    for plan in plans:
        for key, value in pinned.items():
            assert plan["parallel"][key] == value, (key, plan["parallel"])


def test_plan_fits_nowhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write_yaml(
        tmp_path / "tiny.yaml",
        {"name": "tiny", "node_groups": [{"gpu": "T4", "num_nodes": 1, "gpus_per_node": 2, "intra_node": "pcie"}]},
    )
    code, out, err = run_cli(capsys, "plan", job_file(tmp_path, model="llama3.1-405b"), "--cluster", cluster)
    assert code == 2 and out == ""
    assert err.startswith("frenzy: ")
    assert "GiB" in err and re.search(r"\bT4\b", err)
    # The memory needed, in GiB, exceeds the T4's 16 GiB.
    amounts = [float(x.replace(",", "")) for x in re.findall(r"([\d,]+(?:\.\d+)?)\s*GiB", err)]
    assert max(amounts) > lookup_gpu("T4").memory_bytes / GIB


def test_plan_fits_nowhere_names_the_largest_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write_yaml(
        tmp_path / "mixed.yaml",
        {
            "name": "mixed",
            "node_groups": [
                {"gpu": "T4", "num_nodes": 1, "gpus_per_node": 2},
                {"gpu": "L4", "num_nodes": 1, "gpus_per_node": 2},
            ],
        },
    )
    code, _, err = run_cli(capsys, "plan", job_file(tmp_path, model="llama3.1-405b"), "--cluster", cluster)
    assert code == 2
    assert re.search(r"\bL4\b", err), err  # 24 GiB, the larger of the two


# --- errors -------------------------------------------------------------------------------------------------


def test_bad_spec_exits_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = job_file(tmp_path, training={"precision": "int4"})
    for argv in (["predict", job, "--gpu", "A100"], ["plan", job, "--cluster", "paper-3type"]):
        code, out, err = run_cli(capsys, *argv, "--json")
        assert code == 2 and out == ""
        assert err.startswith("frenzy: ")
        assert "training.precision" in err and "bf16" in err


def test_unknown_gpu_exits_2_listing_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "predict", job_file(tmp_path), "--gpu", "Z100")
    assert code == 2 and out == ""
    assert "Z100" in err
    for name in ("T4", "A100-SXM4-80GB", "H100-SXM5-80GB"):
        assert name in err


def test_missing_files_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "missing.yaml")
    for argv in (
        ["predict", missing, "--gpu", "A100"],
        ["plan", missing, "--cluster", "paper-3type"],
        ["plan", job_file(tmp_path), "--cluster", missing],
        ["run", missing],
    ):
        code, out, err = run_cli(capsys, *argv)
        assert code == 2, argv
        assert out == "" and err.startswith("frenzy: ") and "missing.yaml" in err


def test_non_positive_top_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "plan", job_file(tmp_path), "--cluster", "paper-3type", "--top", "0")
    assert code == 2 and "--top" in err


# --- run ----------------------------------------------------------------------------------------------------


def test_run_default_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    scenario = load_scenario()
    payload = run_json(capsys, "run")
    jobs = payload["jobs"]
    assert [j["id"] for j in jobs] == [j.id for j in scenario.jobs]
    for entry in jobs:
        assert isinstance(entry["plans"], list)
        assert 1 <= len(entry["plans"]) <= 3, entry.get("error")
        check_plans(entry["plans"], "paper-3type")


# --- the installed console script ---------------------------------------------------------------------------


def test_console_script(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "frenzy"
    assert script.is_file()
    done = subprocess.run(
        [str(script), "catalog", "gpus", "--json"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert [g["name"] for g in json.loads(done.stdout)["gpus"]] == list(load_gpus())
    failed = subprocess.run(
        [str(script), "predict", "missing.yaml", "--gpu", "A100"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert failed.returncode == 2
    assert failed.stdout == "" and failed.stderr.startswith("frenzy: ")


def test_solve_both_reports_optimum_gap_and_speedup(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    payload = run_json(capsys, "solve", "default", "--solver", "both", "--time-limit", "60", "--plot", str(tmp_path))
    greedy, cpsat = payload["results"]["greedy"], payload["results"]["cpsat"]
    for result in (greedy, cpsat):
        for key in ("status", "solve_time_s", "objective", "avg_jct_s", "makespan_s", "schedule"):
            assert key in result
        jobs = {entry["job"] for entry in result["schedule"]}
        assert jobs == {job.id for job in load_scenario().jobs}
        for entry in result["schedule"]:
            assert set(entry) >= {"job", "gpu_type", "num_gpus", "nodes", "start_s", "end_s", "parallel"}
            assert entry["end_s"] > entry["start_s"]
        # avg_jct_s x num_jobs = objective when every weight is 1; the default scenario has one weight 2.
        assert result["objective"] >= result["avg_jct_s"] * len(result["schedule"])
    assert cpsat["status"] == "OPTIMAL" and cpsat["bound"] == pytest.approx(cpsat["objective"])
    assert cpsat["objective"] <= greedy["objective"]
    assert payload["gap"] == pytest.approx(greedy["avg_jct_s"] / cpsat["avg_jct_s"] - 1)
    assert payload["bound_gap"] == pytest.approx(greedy["objective"] / cpsat["bound"] - 1)
    assert payload["speedup"] == pytest.approx(cpsat["solve_time_s"] / greedy["solve_time_s"])
    assert sorted(Path(p).name for p in payload["plots"]) == ["gantt-cpsat.png", "gantt-greedy.png"]
    assert all(Path(p).stat().st_size > 10_000 for p in payload["plots"])


def test_solve_greedy_only_and_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    payload = run_json(capsys, "solve", "default", "--solver", "greedy")
    assert list(payload["results"]) == ["greedy"] and "gap" not in payload
    code, _, err = run_cli(capsys, "solve", "default", "--time-limit", "0")
    assert code == 2 and "--time-limit" in err
    with pytest.raises(SystemExit):
        main(["solve", "default", "--solver", "gurobi"])


def test_solve_lp_bound_proves_how_far_the_greedy_can_be(capsys: pytest.CaptureFixture[str]) -> None:
    payload = run_json(capsys, "solve", "default", "--solver", "greedy", "--lp-bound", "--lp-columns", "5000")
    greedy = payload["results"]["greedy"]
    lp = payload["lp_bound"]
    assert lp["status"] == "Optimal" and lp["columns"] > 0
    assert 0 < lp["objective"] <= greedy["objective"]
    assert payload["proven_bound"] == lp["objective"]
    assert payload["greedy_proven_gap"] == pytest.approx(greedy["objective"] / lp["objective"] - 1)


def test_solve_lp_bound_with_cpsat_alone_prints_what_it_proves(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        capsys, "solve", "default", "--solver", "cpsat", "--lp-bound", "--lp-columns", "3000", "--time-limit", "20"
    )
    assert code == 0, err
    assert "proven lower bound on the objective" in out and "the greedy at most" not in out
