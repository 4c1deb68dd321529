"""`frenzy validate steptime` and `frenzy calibrate`: reading the calibration format, fitting, honest
cross-validation, calibration profiles and the plan band. Runs on files of its own (no ../shared)."""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from frenzy_opt.cli import main
from frenzy_opt.hardware.gpus import lookup_gpu
from frenzy_opt.prediction.calibrations import CalibrationStore, check_name
from frenzy_opt.prediction.steptime import StepTimeModel, shipped_model
from frenzy_opt.validation.steptime_fit import cross_validate, fit, predict_s, score
from frenzy_opt.validation.steptime_hardware import links_of
from frenzy_opt.validation.steptime_runs import REQUIRED_COLUMNS, parse_row, read_runs, runs_from_reports
from frenzy_opt.validation.steptime_validation import refused, summarise

COLUMNS = (*REQUIRED_COLUMNS, "model", "notes", "metric")
# Made-up runs in the calibration format (no published figures): three "sources", two GPU types.
BASE: dict[str, str] = {
    "framework": "Megatron-Core (test)", "gpu_class": "A100", "gpu": "A100-SXM4-80GB", "num_gpus": "8",
    "gpus_per_node": "8", "interconnect": "NVLink/NVSwitch, single node", "num_layers": "24", "hidden": "2048",
    "ffn_hidden": "8192", "mlp_type": "GeLU", "num_heads": "16", "num_kv_heads": "16", "vocab": "50257",
    "seq_len": "2048", "micro_batch": "2", "global_batch": "64", "dp": "8", "tp": "1", "pp": "1", "vpp": "1",
    "sp": "no", "cp": "1", "ep": "1", "zero_fsdp": "distributed optimizer", "recompute": "none",
    "precision": "bf16", "measured_value": "", "measured_unit": "s/iteration", "iteration_time_s": "",
    "model": "test-1.3b", "notes": "", "metric": "iteration time",
}  # fmt: skip
VARIANTS: list[dict[str, str]] = [
    {"source_name": "lab A", "dp": "8", "micro_batch": "2"},
    {"source_name": "lab A", "dp": "4", "tp": "2", "micro_batch": "4", "sp": "yes"},
    {"source_name": "lab A", "dp": "2", "pp": "4", "micro_batch": "1", "global_batch": "32"},
    {"source_name": "lab B", "gpu_class": "H100", "gpu": "H100-SXM5-80GB", "dp": "8", "micro_batch": "1"},
    {"source_name": "lab B", "gpu_class": "H100", "gpu": "H100-SXM5-80GB", "dp": "2", "tp": "4", "sp": "yes"},
    {"source_name": "lab B", "gpu_class": "H100", "gpu": "H100-SXM5-80GB", "num_gpus": "16", "dp": "16",
     "interconnect": "NVLink intra-node; InfiniBand NDR 8x400 Gb/s per node", "global_batch": "128"},
    {"source_name": "lab C", "hidden": "4096", "num_heads": "32", "ffn_hidden": "16384", "dp": "4", "tp": "2",
     "sp": "yes", "recompute": "full"},
    {"source_name": "lab C", "gpu_class": "H100", "gpu": "H100-SXM5-80GB", "hidden": "4096", "num_heads": "32",
     "ffn_hidden": "16384", "dp": "2", "tp": "4", "sp": "yes"},
]  # fmt: skip


def _rows(truth: StepTimeModel) -> list[dict[str, str]]:
    """The made-up runs with iteration times that ``truth`` predicts (so a fit can recover it)."""
    rows = []
    for i, variant in enumerate(VARIANTS, start=1):
        row = {**BASE, **variant, "row_id": str(i), "iteration_time_s": "1"}
        run = parse_row(row)
        assert run.skip_reason is None, run.skip_reason
        row["iteration_time_s"] = f"{predict_s(run, truth):.9g}"
        rows.append(row)
    return rows


def _write(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["row_id", "source_name", *COLUMNS[2:]], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


TRUTH = replace(
    StepTimeModel(),
    gemm_efficiency={"megatron": 0.7},
    elementwise_passes={"megatron": 9.0},
    layer_overhead_s={"megatron": 3e-4},
)


def test_fit_recovers_the_parameters_that_made_the_times(tmp_path: Path) -> None:
    """The runtime's share of the measured kernel rates is what a fit learns (no efficiency per GPU: the GPU
    types differ by their measured tables)."""
    runs = read_runs(_write(tmp_path / "runs.csv", _rows(TRUTH)))
    fitted = fit(runs, StepTimeModel())
    assert summarise(score(runs, fitted)).max_abs_error < 0.02
    assert fitted.gemm_efficiency["megatron"] == pytest.approx(0.7, rel=0.1)
    assert not fitted.efficiency
    assert summarise(score(runs, StepTimeModel())).mean_abs_error > 0.05  # the starting point was off


def test_cross_validation_never_sees_the_rows_it_predicts(tmp_path: Path) -> None:
    rows = _rows(TRUTH)
    runs = read_runs(_write(tmp_path / "a.csv", rows))
    held = {s.row_id: s.predicted_s for s in cross_validate(runs, by="source")}
    # Doubling lab B's measurements changes the in-sample fit but not lab B's held-out predictions.
    doubled = [{**r, "iteration_time_s": str(2 * float(r["iteration_time_s"]))} if r["source_name"] == "lab B" else r
               for r in rows]  # fmt: skip
    runs2 = read_runs(_write(tmp_path / "b.csv", doubled))
    held2 = {s.row_id: s.predicted_s for s in cross_validate(runs2, by="source")}
    lab_b = [r["row_id"] for r in rows if r["source_name"] == "lab B"]
    assert all(held2[i] == pytest.approx(held[i], rel=1e-9) for i in lab_b)
    assert any(held2[i] != pytest.approx(held[i], rel=1e-3) for i in held if i not in lab_b)
    by_gpu = cross_validate(runs, by="gpu")
    assert {s.row_id for s in by_gpu} == {s.row_id for s in score(runs, TRUTH)}


def test_rows_that_cannot_be_modelled_say_why() -> None:
    mismatch = parse_row({**BASE, "row_id": "9", "source_name": "x", "num_gpus": "16", "iteration_time_s": "1"})
    assert mismatch.skip_reason and "num_gpus" in mismatch.skip_reason
    unknown = parse_row({**BASE, "row_id": "10", "source_name": "x", "gpu": "Z9000", "gpu_class": "Z9000"})
    assert unknown.skip_reason and "not a known type" in unknown.skip_reason
    flops = parse_row({**BASE, "row_id": "11", "source_name": "x", "measured_value": "150",
                       "measured_unit": "TFLOP/s/GPU"})  # fmt: skip
    assert flops.skip_reason is None and flops.measured_s and flops.measured_s > 0
    assert any("TFLOP/s" in a for a in flops.assumptions)
    mixed = parse_row({**BASE, "row_id": "12", "source_name": "x", "gpu": "stage0: RTX-3090x4 | stage1: TITAN-RTXx4",
                       "gpu_class": "mixed", "iteration_time_s": "3", "precision": "not stated"})  # fmt: skip
    assert mixed.heterogeneous and mixed.gpu is not None and mixed.gpu.name == "TITAN-RTX"
    assert mixed.job is not None and mixed.job.training.precision == "fp32"
    pinned = parse_row({**BASE, "row_id": "13", "source_name": "x", "iteration_time_s": "2"})
    assert refused(pinned) is None


def test_a_rows_own_link_figures_override_the_catalogues() -> None:
    # The DGX A800 rows' words: NVLink capped at 400 GB/s (bidirectional), one 200 Gbit/s NIC per GPU; on an
    # A100 (600 GB/s NVLink in the catalogue) the row's figure wins.
    a100 = lookup_gpu("A100-SXM4-80GB")
    links, notes = links_of("NVLink 400 GB/s; InfiniBand 200 Gb/s", a100, 8, a100.intra_node)
    assert (links.intra_node_gbyte_s, links.nic_gbyte_s, links.gpus_per_node) == (200.0, 8 * 200 / 8, 8)
    assert any("one NIC per GPU" in n for n in notes)
    plain, _ = links_of("NVLink; InfiniBand 200 Gb/s", a100, 8, a100.intra_node)
    assert plain.intra_node_gbyte_s == a100.intra_node_gbyte_s / 2 == 300.0


def test_launcher_reports_are_measured_runs(tmp_path: Path) -> None:
    from frenzy_opt.core.spec import parse_job
    from frenzy_opt.hardware.cluster import parse_cluster
    from frenzy_opt.planning.plans import enumerate_plans

    job = parse_job({"name": "tiny", "model": "gpt3-125m", "training": {"seq_len": 512, "global_batch_size": 8}})
    cluster = parse_cluster({"node_groups": [{"gpu": "A100-SXM4-80GB", "num_nodes": 1}]})
    plan = enumerate_plans(job, cluster).plans[0]
    report = {"job": job.to_mapping(), "state": "succeeded", "plan": plan.to_dict(),
              "placement": {"nodes": ["n0"], "gpus_per_node": 8}, "measured": {"step_time_s": 0.25}}  # fmt: skip
    path = tmp_path / "run1.json"
    path.write_text(json.dumps(report), encoding="utf-8")
    [run] = runs_from_reports([path])
    assert run.measured_s == 0.25 and run.job is not None and run.job.parallel == plan.parallel
    path.write_text(json.dumps({**report, "state": "failed"}), encoding="utf-8")
    assert runs_from_reports([path])[0].skip_reason


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main([*argv, "--json"]) == 0
    return dict(json.loads(capsys.readouterr().out))


def test_validate_steptime_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path / "runs.csv", _rows(TRUTH))
    out = tmp_path / "report.md"
    payload = _cli(capsys, "validate", "steptime", str(path), "--out", str(out))
    assert {"rows", "by_source", "overall", "cross_validated", "refused"} <= set(payload)
    cv = payload["cross_validated"]
    assert set(cv) == {"leave_one_source_out", "leave_one_gpu_type_out"}
    assert set(cv["leave_one_source_out"]["by_source"]) == {"lab A", "lab B", "lab C"}
    assert payload["overall"]["rows"] == len(VARIANTS)
    text = out.read_text(encoding="utf-8")
    assert "## Targets" in text and "lab B" in text


def test_calibration_profiles_drive_plans(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FRENZY_CALIBRATIONS", str(tmp_path / "profiles"))
    slow = replace(TRUTH, efficiency={"ampere": 0.2, "hopper": 0.2})
    path = _write(tmp_path / "mine.csv", _rows(slow))
    payload = _cli(capsys, "calibrate", str(path), "--name", "my-lab")
    assert {"name", "parameters", "error_before", "error_after"} <= set(payload)
    assert payload["error_after"]["mean_abs_error"] < payload["error_before"]["mean_abs_error"]
    assert CalibrationStore().names() == ["my-lab"]
    a100 = lookup_gpu("A100-SXM4-80GB")
    assert CalibrationStore().load("my-lab").efficiency_of(a100, "bf16") < shipped_model().efficiency_of(a100, "bf16")
    job = {"name": "j", "model": "gpt3-350m", "training": {"seq_len": 1024, "global_batch_size": 16}}
    (tmp_path / "job.json").write_text(json.dumps(job), encoding="utf-8")
    cluster = {"name": "c", "node_groups": [{"gpu": "A100-SXM4-80GB", "num_nodes": 1}]}
    (tmp_path / "c.json").write_text(json.dumps(cluster), encoding="utf-8")
    shipped = _cli(capsys, "plan", str(tmp_path / "job.json"), "--cluster", str(tmp_path / "c.json"))
    mine = _cli(
        capsys, "plan", str(tmp_path / "job.json"), "--cluster", str(tmp_path / "c.json"), "--calibration", "my-lab"
    )
    assert mine["plans"][0]["step_time_s"] > shipped["plans"][0]["step_time_s"]
    for plan in shipped["plans"]:
        assert plan["step_time_p10_s"] <= plan["step_time_s"] <= plan["step_time_p90_s"]
    # The same profile drives the simulator's and the solver's plans (slower A100s: longer jobs).
    sims = [
        _cli(capsys, "simulate", "default", "--policy", "frenzy", *extra) for extra in ([], ["--calibration", "my-lab"])
    ]
    assert sims[1]["calibration"] == "my-lab"
    assert sims[1]["policies"]["frenzy"]["avg_jct_s"] != sims[0]["policies"]["frenzy"]["avg_jct_s"]
    solved = _cli(capsys, "solve", "default", "--solver", "greedy", "--calibration", "my-lab")
    assert solved["results"]["greedy"]["avg_jct_s"] > 0
    assert (
        main(["plan", str(tmp_path / "job.json"), "--cluster", str(tmp_path / "c.json"), "--calibration", "nope"]) == 2
    )
    assert re.search(r"no profile 'nope'.*known: my-lab", capsys.readouterr().err)


def test_profile_names_and_writes_are_safe(tmp_path: Path) -> None:
    for bad in ("", "../x", "a/b", "memory", "steptime", "x" * 65):
        with pytest.raises(ValueError, match="calibration name"):
            check_name(bad)
    store = CalibrationStore(tmp_path)
    store.save("a", StepTimeModel(efficiency={"ampere": 0.5}), rows=3)
    (tmp_path / "broken.json").write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match="not a valid calibration profile"):
        store.load("broken")
    learned = store.learn("a", StepTimeModel(efficiency={"ampere": 0.4}), {"A100@bf16": {"samples": 1}})
    doc = json.loads(learned.read_text(encoding="utf-8"))
    assert doc["rows"] == 3 and doc["closed_loop"] == {"A100@bf16": {"samples": 1}}
    assert math.isclose(store.load("a").efficiency["ampere"], 0.4)
    assert not list(tmp_path.glob(".*.tmp"))
