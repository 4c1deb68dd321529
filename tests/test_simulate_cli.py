"""``frenzy simulate`` and ``frenzy compare`` (contract 3): JSON keys, plots, the report, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frenzy_opt.cli import main

POLICY_KEYS = (
    "avg_jct_s", "p50_jct_s", "p99_jct_s", "makespan_s", "utilization", "mean_decision_ms", "p99_decision_ms",
    "num_jobs", "num_finished",
)  # fmt: skip


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_simulate_json_has_the_contract_keys_for_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "simulate", "default", "--policy", "frenzy,fifo,sia,gavel,optimal", "--json")
    assert code == 0
    payload = json.loads(out)
    assert set(payload["policies"]) == {"frenzy", "fifo", "sia", "gavel", "optimal"}
    for metrics in payload["policies"].values():
        assert all(key in metrics for key in POLICY_KEYS)
        assert metrics["num_finished"] == metrics["num_jobs"] == 6
        assert metrics["p50_jct_s"] <= metrics["p99_jct_s"] <= metrics["makespan_s"]
    assert payload["policies"]["optimal"]["avg_jct_s"] <= payload["policies"]["frenzy"]["avg_jct_s"] * 1.001
    assert set(payload["versus_frenzy"]) == {"fifo", "sia", "gavel", "optimal"}


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
        (["--policy", "pollux"], "unknown pollux; allowed: fifo, frenzy, gavel, optimal, sia"),
        (["--policy", "frenzy", "--mtbf-h", "-1"], "--mtbf-h must be > 0"),
        (["--policy", "optimal", "--mtbf-h", "5"], "cannot replay failures"),
    ],
)
def test_simulate_bad_input_exits_2_naming_the_problem(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = _run(capsys, "simulate", "default", *argv)
    assert code == 2 and out == ""
    assert message in err


def test_compare_writes_the_report_with_tables_figures_and_the_optimal_gap(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out_path = tmp_path / "report.md"
    code, _, _ = _run(
        capsys, "compare", "default", "--policy", "frenzy,fifo,optimal", "--out", str(out_path), "--no-failures"
    )
    assert code == 0
    text = out_path.read_text(encoding="utf-8")
    assert "| frenzy |" in text and "| fifo |" in text and "| optimal |" in text
    assert "Heuristic vs optimal" in text
    assert "frenzy compare default --policy frenzy,fifo,optimal" in text
    for figure in ("default-jct-cdf.png", "default-utilization.png", "default-gantt-frenzy.png"):
        assert f"(report/{figure})" in text and (tmp_path / "report" / figure).is_file()


def test_compare_rejects_unknown_scenarios_before_simulating(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "compare", "no-such-scenario", "--no-failures")
    assert code == 2 and "shipped:" in err
