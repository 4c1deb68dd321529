"""``frenzy compare``'s protocol (frenzy_opt.research.compare, frenzy_opt.research.report): Sia's traces as samples
on the invented fixture of tests/data/sia_replay, restarts per job and the per-model breakdown against the
simulator's own results, the paired interval on a hand example, the sensitivity variants."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from frenzy_opt.cli import main
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.planning.scenario import Scenario, load_cluster_ref
from frenzy_opt.research.compare import (
    DEFAULT_ROUND_S,
    Variant,
    per_model_jct,
    restart_stats,
    restarts_per_job,
    run_sensitivity,
    run_sia_workloads,
    run_variant,
    scaled_restarts,
    sensitivity_variants,
    sia_workload_files,
    variant_key,
)
from frenzy_opt.research.experiment import Experiment, SeededRuns, paired, run_policies
from frenzy_opt.research.report import Section, parse_sections
from frenzy_opt.research.report_tables import sensitivity_section
from frenzy_opt.research.stats import paired_ci95, relative_reductions
from frenzy_opt.simulation.siareplay import RESCALE_S, load_sia_replay
from frenzy_opt.simulation.throughputs import read_sia_profiles
from frenzy_opt.simulation.truth import TruthSpec
from frenzy_opt.solvers.base import make_policy

DATA = Path(__file__).parent / "data" / "sia_replay"
TRACES = DATA / "traces"


def _workloads(root: Path) -> Path:
    """Two tiny workload files of set ``toy``: the fixture's, and the same jobs arriving closer together."""
    folder = root / "toy"
    folder.mkdir(parents=True)
    shutil.copy(DATA / "workload.csv", folder / "workload-1.csv")
    rows = (DATA / "workload.csv").read_text(encoding="utf-8").splitlines()
    shifted = [rows[0]] + [
        ",".join([*r.split(",")[:1], str(int(r.split(",")[1]) // 4), *r.split(",")[2:]]) for r in rows[1:]
    ]
    (folder / "workload-10.csv").write_text("\n".join(shifted) + "\n", encoding="utf-8")
    return root


def test_paired_interval_on_a_hand_example() -> None:
    # Differences 2, 3, 1: mean 2, s = 1, t(0.975, 2) = 4.302653 (Student-t table), half-width 4.302653 / sqrt 3.
    d = paired_ci95([3.0, 5.0, 4.0], [1.0, 2.0, 3.0])
    assert d.n == 3 and d.mean == pytest.approx(2.0)
    assert d.half_width == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert not d.excludes_zero  # 2 < 2.484
    tight = paired_ci95([3.0, 3.1, 2.9], [1.0, 1.0, 1.0])  # s = 0.1: 2 ± 0.248
    assert tight.excludes_zero
    assert paired_ci95([1.0], [0.0]).half_width is None
    assert relative_reductions([1.0, 3.0], [2.0, 4.0]) == pytest.approx([0.5, 0.25])
    with pytest.raises(ValueError, match="equal"):
        paired_ci95([1.0], [1.0, 2.0])


def test_sia_trace_files_are_samples_with_restarts_and_models_consistent(tmp_path: Path) -> None:
    files = sia_workload_files("toy", _workloads(tmp_path))
    assert [f.stem for f in files] == ["workload-1", "workload-10"]  # numeric order
    runs = run_sia_workloads(
        files, ["frenzy", "fifo", "sia"], cluster=load_cluster_ref(str(DATA / "cluster.yaml")), traces_root=TRACES,
        label="toy",
    )  # fmt: skip
    assert runs.labels == ["workload-1", "workload-10"] and runs.policies() == ["frenzy", "fifo", "sia"]
    total_restarts = 0
    for experiment in runs.experiments:
        result = experiment.results["sia"]
        per_job = restarts_per_job(result)
        assert sum(per_job.values()) == result.metrics()["restarts"]
        for job_id, state in result.jobs.items():
            assert per_job[job_id] == len(state.segments) - 1  # every start after the first is a segment
        total_restarts += sum(per_job.values())
    stats = restart_stats(runs, "sia")
    assert stats.mean == pytest.approx(total_restarts / 6)  # 3 jobs per file
    table = per_model_jct(runs, ["frenzy", "sia"])
    assert list(table) == ["bert"]
    for policy in ("frenzy", "sia"):
        mean_s, count = table["bert"][policy]
        assert count == 6
        avgs = [float(e.results[policy].metrics()["avg_jct_s"]) for e in runs.experiments]
        assert mean_s == pytest.approx(sum(avgs) / 2)  # one model, same job count per file
    c = paired(runs, "frenzy", "sia")
    assert c.avg_reduction.n == 2 and 0 <= c.wins <= 2


def _toy_experiment() -> Experiment:
    cluster = load_cluster_ref(str(DATA / "cluster.yaml"))
    topology = Topology(cluster)
    jobs, truth = load_sia_replay(DATA / "workload.csv", read_sia_profiles(TRACES), TRACES, topology)
    scenario = Scenario(name="toy", cluster=cluster, jobs=())
    return Experiment(scenario=scenario, topology=topology, jobs=jobs, truth=truth)


def test_per_model_breakdown_adds_up_to_the_average_with_two_models() -> None:
    experiment = _toy_experiment()
    experiment.jobs = [replace(j, model="other") if j.id == "bert-1" else j for j in experiment.jobs]
    run_policies(experiment, ["sia", "fifo"])
    runs = SeededRuns(seeds=[0], experiments=[experiment], truth=TruthSpec())
    table = per_model_jct(runs, ["sia", "fifo"])
    assert sorted(table) == ["bert", "other"] and table["other"]["sia"][1] == 1
    for policy in ("sia", "fifo"):
        result = experiment.results[policy]
        assert table["other"][policy][0] == pytest.approx(result.jobs["bert-1"].end_s - 30.0)  # arrives at 30 s
        pooled = sum(by[policy][0] * by[policy][1] for by in table.values())
        assert pooled / 3 == pytest.approx(float(result.metrics()["avg_jct_s"]))


def test_sensitivity_variants_change_sia_rounds_and_restart_costs() -> None:
    from frenzy_opt.hardware.topology import Topology
    from frenzy_opt.planning.scenario import Scenario
    from frenzy_opt.research.experiment import Experiment
    from frenzy_opt.simulation.siareplay import load_sia_replay
    from frenzy_opt.simulation.throughputs import read_sia_profiles

    cluster = load_cluster_ref(str(DATA / "cluster.yaml"))
    topology = Topology(cluster)
    jobs, truth = load_sia_replay(DATA / "workload.csv", read_sia_profiles(TRACES), TRACES, topology)
    experiment = Experiment(
        scenario=Scenario(name="toy", cluster=cluster, jobs=()), topology=topology, jobs=jobs, truth=truth
    )
    variants = sensitivity_variants((30.0, 120.0), (2.0,))
    assert [v.label for v in variants] == ["defaults", "rounds 30 s", "rounds 120 s", "restarts x2"]
    for name, round_s in DEFAULT_ROUND_S.items():  # the defaults variant is the policies' own defaults
        assert make_policy(name).round_s == round_s  # type: ignore[attr-defined]
    short, long = (run_variant(experiment, "sia", v) for v in variants[1:3])
    assert short.metrics()["num_decisions"] > long.metrics()["num_decisions"]
    assert variant_key("sia", variants[1]) in experiment.results
    doubled = scaled_restarts(jobs, 2.0)
    assert [j.restart_s for j in doubled] == [2 * RESCALE_S["bert"]] * len(jobs)
    result = run_variant(experiment, "sia", variants[3])
    first_stalls = [state.segments[0].restart_s for state in result.jobs.values()]
    assert max(first_stalls) == pytest.approx(2 * RESCALE_S["bert"])
    with pytest.raises(ValueError, match="round"):
        sensitivity_variants((0.0,), ())
    assert Variant(label="x").restart_scale == 1.0


def test_compare_sia_traces_section_on_the_fixture(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    code = main([
        "compare", "--sections", "sia-traces", "--policy", "frenzy,fifo,sia", "--sia-sets", "toy",
        "--sia-workloads", str(_workloads(tmp_path / "w")), "--sia-tables", str(TRACES),
        "--sia-cluster", str(DATA / "cluster.yaml"), "--out", str(out),
    ])  # fmt: skip
    capsys.readouterr()
    assert code == 0
    text = out.read_text(encoding="utf-8")
    assert "## toy — Sia's traces (profiled truth) — 3 jobs on sia-toy" in text
    assert "2 workload files (workload-1, workload-10)" in text
    assert "## Summary: frenzy against sia" in text and "| Sia's toy traces | 2 |" in text
    assert "| bert | 6 |" in text  # per model: 3 jobs x 2 files
    assert "| workload-10 |" in text  # per sample
    assert "restarts per job (mean, max)" in text and "avg JCT reduction, paired" in text
    assert "Wall time per section: `sia-traces`" in text
    assert "--sections sia-traces" in text


def test_sections_parse_and_absent_traces_are_skipped_with_the_reason(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert parse_sections("sensitivity,llm") == (Section.LLM, Section.SENSITIVITY)  # report order
    with pytest.raises(ValueError, match="allowed: llm"):
        parse_sections("llm,nope")
    out = tmp_path / "report.md"
    code = main(["compare", "--sections", "sia-traces", "--sia-workloads", str(tmp_path / "none"), "--out", str(out)])
    capsys.readouterr()
    assert code == 0
    assert "## Section `sia-traces` skipped" in out.read_text(encoding="utf-8")
    code = main(["compare", "--sections", "bogus", "--out", str(out)])
    assert code == 2 and "allowed: llm" in capsys.readouterr().err


TINY = {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4, "num_kv_heads": 2,
        "vocab_size": 256, "mlp": "swiglu", "norm": "rmsnorm", "tied_embeddings": False}  # fmt: skip


def test_sensitivity_reuses_identical_runs_and_reports_every_variant(tmp_path: Path) -> None:
    jobs = [
        {"id": f"tiny-{i}", "arrival_s": 60 * i, "model": TINY,
         "training": {"seq_len": 64, "global_batch_size": 8, "train_steps": 20000 * (i + 1), "precision": "fp32"}}
        for i in range(4)
    ]  # fmt: skip
    path = tmp_path / "tiny.yaml"
    path.write_text(json.dumps({"name": "tiny", "cluster": str(DATA / "cluster.yaml"), "jobs": jobs}), "utf-8")
    variants = sensitivity_variants((60.0, 120.0), (2.0,))
    runs = run_sensitivity(str(path), variants, policies=("frenzy", "sia"), seeds=2, truth=TruthSpec())
    for experiment in runs.experiments:
        results = experiment.results
        assert len(results) == 2 * len(variants)
        # sia's default round is 60 s and frenzy has no round: the same replay, reused.
        assert results["sia [rounds 60 s]"] is results["sia [defaults]"]
        assert results["frenzy [rounds 120 s]"] is results["frenzy [defaults]"]
        assert results["sia [rounds 120 s]"] is not results["sia [defaults]"]
    text = "\n".join(sensitivity_section(runs, variants, ("frenzy", "sia")))
    assert "| rounds 120 s |" in text and "| restarts x2 |" in text and "frenzy vs sia, paired" in text


@pytest.mark.parametrize(("short", "factor"), [("sia64-llm", 1 / 0.3), ("paper3type-llm", 10.0)])
def test_the_hours_scenarios_are_the_shortened_ones_stretched_in_time(short: str, factor: float) -> None:
    from frenzy_opt.planning.scenario import load_scenario
    from frenzy_opt.planning.workload import synthetic_trace

    spec, hours = load_scenario(short).workload, load_scenario(f"{short}-hours").workload
    assert spec is not None and hours is not None and hours.duration_scale == 1.0
    for a, b in zip(synthetic_trace(spec), synthetic_trace(hours), strict=True):
        assert a.num_gpus == b.num_gpus
        assert b.submit_s == pytest.approx(a.submit_s * factor, rel=2e-5, abs=1e-2)  # submit_s rounded to 1 ms
        assert b.duration_s == pytest.approx(a.duration_s * factor, rel=1e-9)
