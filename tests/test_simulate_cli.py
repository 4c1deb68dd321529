"""``frenzy simulate`` and ``frenzy compare`` (contract 3): JSON keys, plots, the report, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from frenzy_opt.cli import main
from frenzy_opt.prediction import steptime

POLICY_KEYS = (
    "avg_jct_s", "p50_jct_s", "p99_jct_s", "makespan_s", "utilization", "mean_decision_ms", "p99_decision_ms",
    "num_jobs", "num_finished",
)  # fmt: skip


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow  # about a minute: every policy, CP-SAT's offline schedule among them
def test_simulate_json_has_the_contract_keys_for_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "simulate", "default", "--policy", "frenzy,fifo,sia,gavel,cpsat-offline", "--json")
    assert code == 0
    payload = json.loads(out)
    assert set(payload["policies"]) == {"frenzy", "fifo", "sia", "gavel", "cpsat-offline"}
    for metrics in payload["policies"].values():
        assert all(key in metrics for key in POLICY_KEYS)
        assert metrics["num_finished"] == metrics["num_jobs"] == 6
        assert metrics["p50_jct_s"] <= metrics["p99_jct_s"] <= metrics["makespan_s"]
    # (cpsat-offline against the non-preemptive HAS: tests/test_simulator.py; frenzy here preempts, so may beat it)
    assert set(payload["versus_frenzy"]) == {"fifo", "sia", "gavel", "cpsat-offline"}


def test_simulate_writes_the_three_figures(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = _run(capsys, "simulate", "default", "--policy", "frenzy,fifo", "--plot", str(tmp_path), "--json")
    assert code == 0
    plots = [Path(p) for p in json.loads(out)["plots"]]
    assert {p.name for p in plots} == {"default-jct-cdf.png", "default-utilization.png", "default-gantt-frenzy.png"}
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in plots)


def test_simulate_with_failures_reports_them(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "simulate", "default", "--policy", "frenzy", "--mtbf-h", "2", "--json")
    assert code == 0
    metrics = json.loads(out)["policies"]["frenzy"]
    assert metrics["num_finished"] == 6 and metrics["failures"] > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--policy", "pollux"],
            "unknown pollux; allowed: cpsat-offline, fifo, frenzy, frenzy-oracle, gavel, gavel-oracle, sia, sia-oracle",
        ),
        (["--policy", "frenzy", "--seeds", "0"], "--seeds must be >= 1"),
        (["--truth", "profiled", "--profiles", "no/such/folder"], "neither sia, gavel"),
        (["--policy", "frenzy", "--mtbf-h", "-1"], "--mtbf-h must be > 0"),
        (["--policy", "cpsat-offline", "--mtbf-h", "5"], "cannot replay failures"),
    ],
)
def test_simulate_bad_input_exits_2_naming_the_problem(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = _run(capsys, "simulate", "default", *argv)
    assert code == 2 and out == ""
    assert message in err


def test_compare_writes_the_report_with_tables_figures_and_the_bound(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out_path = tmp_path / "report.md"
    code, _, err = _run(
        capsys, "compare", "default", "--policy", "frenzy,fifo,cpsat-offline", "--out", str(out_path), "--no-failures",
        "--truth", "model", "--seeds", "1", "--no-profiled",
    )  # fmt: skip
    assert code == 0
    assert "compare: section llm (1 of 1, 3 simulations) starts after" in err  # progress, not silence
    text = out_path.read_text(encoding="utf-8")
    assert "| frenzy |" in text and "| fifo |" in text and "| cpsat-offline |" in text
    # The proven lower bound, and every policy's distance above it.
    assert "Lower bound on the average JCT of any policy" in text and "| fifo | +" in text
    assert "frenzy compare default --policy frenzy,fifo,cpsat-offline" in text and "--overwrite" in text
    # the jobs' origin and what fifo was given are said
    title = next(line for line in text.splitlines() if line.startswith("## default"))
    assert "the scenario's own jobs" in title and "Philly-mapped" not in title
    assert "fifo and gavel run each job's request (6 none given" in text
    # run again onto the same path: refused unless asked
    again = ["compare", "default", "--policy", "frenzy", "--out", str(out_path), "--no-failures", "--truth", "model",
             "--seeds", "1", "--no-profiled"]  # fmt: skip
    code, _, err = _run(capsys, *again)
    assert code == 2 and "--overwrite" in err and out_path.read_text(encoding="utf-8") == text
    for figure in ("default-jct-cdf.png", "default-utilization.png", "default-gantt-frenzy.png"):
        assert f"(report/{figure})" in text and (tmp_path / "report" / figure).is_file()


def test_compare_rejects_unknown_scenarios_before_simulating(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "compare", "no-such-scenario", "--no-failures")
    assert code == 2 and "shipped:" in err


# --- truths and seeds ------------------------------------------------------------------------------------

PROFILES = Path(__file__).parent / "data" / "profiles"


def _small_scenario(tmp_path: Path) -> str:
    """Ten GPT-3 125M jobs on T4s and A100-40GBs (the GPU types of tests/data/profiles/sia) and an L4 node
    (no profile there)."""
    scenario = {
        "name": "small-profiled",
        "cluster": {
            "name": "small",
            "node_groups": [
                {"gpu": "T4", "num_nodes": 2, "gpus_per_node": 4},
                {"gpu": "A100-SXM4-40GB", "num_nodes": 1, "gpus_per_node": 8},
                {"gpu": "L4", "num_nodes": 1, "gpus_per_node": 4},
            ],
        },
        "workload": {"seed": 5, "num_jobs": 10, "jobs_per_hour": 30, "duration_scale": 0.05,
                     "model_mix": {"*": ["gpt3-125m"]}},
    }  # fmt: skip
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(scenario), encoding="utf-8")
    return str(path)


def test_simulate_seeds_give_means_and_confidence_intervals(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(steptime, "cv_log_residuals", lambda: (-0.3, 0.0, 0.1, 0.5), raising=False)
    scenario = _small_scenario(tmp_path)
    argv = ("simulate", scenario, "--policy", "frenzy,sia", "--truth", "noisy", "--json")
    code, out, _ = _run(capsys, *argv, "--seeds", "3")
    assert code == 0
    payload = json.loads(out)
    assert payload["seeds"] == 3 and payload["truth"]["kind"] == "noisy" and payload["truth"]["num_residuals"] == 4
    for metrics in payload["policies"].values():
        assert all(key in metrics for key in POLICY_KEYS)
        per_seed = metrics["per_seed"]
        assert [p["seed"] for p in per_seed] == [0, 1, 2]
        assert metrics["avg_jct_s"] == pytest.approx(sum(p["avg_jct_s"] for p in per_seed) / 3)
        assert metrics["avg_jct_ci95_s"] > 0 and metrics["p99_jct_ci95_s"] > 0  # workloads and draws differ
    assert set(payload["versus_frenzy"]) == {"sia"}
    code, out, _ = _run(capsys, *argv)  # one run, no --seeds: seed 0 itself, and no interval keys
    single = json.loads(out)
    assert "seeds" not in single and "avg_jct_ci95_s" not in single["policies"]["frenzy"]
    assert single["policies"]["frenzy"]["avg_jct_s"] == payload["policies"]["frenzy"]["per_seed"][0]["avg_jct_s"]


def test_simulate_profiled_truth_names_its_tables_and_counts_fallbacks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = _run(
        capsys, "simulate", _small_scenario(tmp_path), "--policy", "frenzy,fifo,gavel", "--truth", "profiled",
        "--profiles", str(PROFILES / "sia"), "--json",
    )  # fmt: skip
    assert code == 0
    payload = json.loads(out)
    assert payload["truth"]["application"] == "toyapp" and payload["truth"]["batch_size"] == 64
    for metrics in payload["policies"].values():
        assert metrics["num_finished"] == 10
        assert metrics["truth_fallback_runs"] >= 0 and 0 <= metrics["truth_fallback_gpu_share"] <= 1


def test_simulate_noisy_truth_without_residuals_exits_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(steptime, "cv_log_residuals", raising=False)
    code, out, err = _run(capsys, "simulate", "default", "--truth", "noisy")
    assert code == 2 and out == "" and "cv_log_residuals" in err


def test_compare_with_seeds_reports_means_and_intervals(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_path = tmp_path / "report.md"
    code, _, _ = _run(
        capsys, "compare", "default", "--policy", "frenzy,fifo", "--truth", "model", "--seeds", "2",
        "--out", str(out_path), "--no-failures", "--no-profiled",
    )  # fmt: skip
    assert code == 0
    text = out_path.read_text(encoding="utf-8")
    assert "frenzy compare default --policy frenzy,fifo --truth model --seeds 2 --out" in text
    assert "2 seeds (0…1)" in text and "truth `model`" in text
    assert " ± 0.00 |" in text  # explicit jobs and the model truth: every seed is the same run
    assert "| fifo |" in text and "| 2/2 |" not in text.split("| vs |")[0]
