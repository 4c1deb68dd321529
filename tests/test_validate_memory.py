"""`frenzy validate memory` and `frenzy calibrate` on a calibration-format file of this project's own
measurements (``tests/data/memory-own.csv``: the CPU harness's MemTracker peaks of tiny reference-decoder
runs, six rows from two sources, made with ``frenzy_opt.validation.harness.measure``), so the tests need no
``../shared``. The published-runs figures come from the same command on ``../shared/calibration``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from frenzy_opt.cli import main
from frenzy_opt.prediction.marp.fit import MemoryFit, load_fit
from frenzy_opt.validation.memory_fit import cross_validate, fit
from frenzy_opt.validation.memory_runs import parse_row, read_measurements, usable
from frenzy_opt.validation.memory_scores import score_run, summarise
from frenzy_opt.validation.memory_validation import calibrate, validate

OWN = Path(__file__).parent / "data" / "memory-own.csv"


def test_rows_parse_into_jobs_with_their_metric_and_rank() -> None:
    runs = read_measurements(OWN)
    assert len(runs) == 6 and all(r.job is not None and r.metric == "max_allocated" for r in runs)
    assert runs[1].job is not None and runs[1].job.parallel.tp == 2
    assert all(r.last_rank for r in runs)


def test_messy_published_fields_are_read() -> None:
    row = {c: "" for c in read_measurements.__globals__["REQUIRED_COLUMNS"]}
    row.update(row_id="x", source="s", framework="torchtitan (FSDP2)", gpu="H100 96GB HBM2e", num_layers="32",
               hidden="4096", ffn_hidden="14336", mlp_type="SwiGLU", num_heads="32", num_kv_heads="8",
               vocab="131073 (NullTokenizer; padded 131584)", seq_len="8192 (packed)", micro_batch="2 (assumed)",
               global_batch="64", dp="32 (FSDP shard)", tp="1", pp="1", precision="bf16; float8 linear",
               optimizer="AdamW", optimizer_sharding="FSDP2 full shard", recompute="selective (op-level SAC)",
               measured_gib="47.5", metric="max_reserved (reserved_bytes.all.peak)")  # fmt: skip
    run = parse_row(row)
    assert run.job is not None and run.metric == "max_reserved" and run.gpu_family == "hopper"
    assert run.job.model.vocab_size == 131584 and run.job.parallel.dp == 32 and run.job.parallel.zero_stage == 3
    assert run.job.training.precision == "fp8" and run.job.parallel.recompute == "selective"


def test_empty_measurements_and_unmodelled_runs_are_skipped_with_a_reason() -> None:
    row = {c: "" for c in read_measurements.__globals__["REQUIRED_COLUMNS"]}
    row.update(row_id="y", source="s", framework="Megatron", gpu="A100", precision="pure bf16", metric="nvidia-smi")
    assert parse_row(row).skip_reason is not None and parse_row(row).job is None


def test_a_file_missing_columns_names_them(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("row_id,source\n1,x\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"missing column\(s\) framework"):
        read_measurements(bad)
    assert main(["validate", "memory", str(bad)]) == 2


def test_leave_one_source_out_fits_without_the_held_out_source(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = read_measurements(OWN)
    seen: list[set[str]] = []
    original = fit

    def spy(rows: list, base: MemoryFit | None = None) -> MemoryFit:  # type: ignore[type-arg]
        seen.append({r.source for r in rows})
        return original(rows, base)

    monkeypatch.setattr("frenzy_opt.validation.memory_fit.fit", spy)
    scores = cross_validate(runs)
    sources = {r.source for r in runs}
    assert len(scores) == len(runs) and len(seen) == len(sources)
    assert all(len(s) == len(sources) - 1 for s in seen)


def test_the_fitted_bound_covers_every_fitted_row() -> None:
    runs = read_measurements(OWN)
    fitted = fit(runs)
    in_sample = [s for s in validate(OWN, fitted).in_sample]
    assert summarise(in_sample).upper_coverage == 1.0
    # The margin sits on the activations only: a fit with the margin at 0 under-bounds some row.
    bare = replace(fitted, activation_margin={}, default_activation_margin=0.0, cached_fraction=0.0)
    assert summarise([score_run(r, bare) for r in usable(runs)]).upper_coverage < 1.0


def test_validate_cli_reports_rows_sources_and_cross_validated_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.md"
    assert main(["validate", "memory", str(OWN), "--json", "--out", str(out)]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert {"rows", "by_source", "overall", "cross_validated"} <= set(payload)
    assert len(payload["rows"]) == 6 and len(payload["by_source"]) == 2
    row = payload["rows"][0]
    assert {"id", "source", "predicted", "measured", "metric", "accuracy", "cross_validated"} <= set(row)
    assert 0.5 < payload["overall"]["mean_accuracy"] <= 1.0
    assert "leave one source out" in out.read_text(encoding="utf-8")


def test_calibrate_writes_a_fit_that_loads_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "fit.json"
    assert main(["calibrate", str(OWN), "--name", "memory", "--out", str(target), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert {"name", "parameters", "error_before", "error_after"} <= set(payload)
    loaded = load_fit(target)
    fitted, _ = calibrate(OWN)
    assert loaded == fitted and loaded.rows == 6


@pytest.mark.slow
def test_predict_trace_prints_both_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torchtitan", reason="the trace path needs the validate extra (torchtitan)")
    job = tmp_path / "job.json"
    job.write_text(json.dumps({
        "name": "trace-small",
        "model": {"num_layers": 2, "hidden_size": 256, "ffn_hidden_size": 704, "num_attention_heads": 4,
                  "num_kv_heads": 2, "vocab_size": 2048},
        "training": {"seq_len": 256, "micro_batch_size": 2, "global_batch_size": 4, "runtime": "fsdp2"},
        "parallel": {"dp": 2, "zero_stage": 3},
    }), encoding="utf-8")  # fmt: skip
    assert main(["predict", str(job), "--gpu", "H100-SXM5-80GB", "--trace", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    traced = payload["trace"]["stages"][0]
    assert payload["trace"]["runtime"] == "fsdp2" and traced["peak_allocated_bytes"] > 0
    # The allocator model never reserves less than the allocated peak it replays.
    assert traced["replayed_peak_reserved_bytes"] >= traced["replayed_peak_allocated_bytes"] > 0
    assert payload["peak_allocated_upper_bytes"] >= payload["peak_allocated_bytes"] > 0
