"""Layer profiles: the format, interpolation over micro-batches, the step-time model pricing a profiled job
from its measured times, the profiler's measurement (on the CPU here), the CLI's refusal without CUDA, the
calibration store's merge and Sailor's import."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from frenzy_opt.cli import main
from frenzy_opt.core.spec import parse_job
from frenzy_opt.hardware.gpus import lookup_gpu
from frenzy_opt.hardware.topology import Links
from frenzy_opt.planning.candidates import MICRO_BATCH_CHOICES
from frenzy_opt.prediction import profiler
from frenzy_opt.prediction.calibrations import CalibrationStore, add_profiles, resolve_model
from frenzy_opt.prediction.profiles import LayerProfile, LayerShape, ProfileIndex, ProfilePoint
from frenzy_opt.prediction.sailor import import_profiles
from frenzy_opt.prediction.stepeval import profiled_point
from frenzy_opt.prediction.stepterms import step_terms
from frenzy_opt.prediction.steptime import StepTimeModel, shipped_model

A100 = lookup_gpu("A100-SXM4-80GB")
JOB_DICT = {
        "model": {"num_layers": 4, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4,
                  "num_kv_heads": 2, "vocab_size": 256},
        "training": {"seq_len": 32, "micro_batch_size": 2, "global_batch_size": 8, "precision": "fp32",
                     "runtime": "fsdp2"},
        "parallel": {"dp": 1, "tp": 1, "pp": 1},
}  # fmt: skip
JOB = parse_job(JOB_DICT)
SHAPE = LayerShape.of(JOB.model, 32, "fp32")


def _point(mbs: int, tp: int = 1, scale: float = 1.0) -> ProfilePoint:
    return ProfilePoint(
        micro_batch_size=mbs, tp=tp, layer_fwd_s=1e-3 * mbs * scale, layer_bwd_s=2e-3 * mbs * scale,
        embedding_fwd_s=1e-4, embedding_bwd_s=1e-4, output_fwd_s=5e-4, output_bwd_s=5e-4, update_s=3e-4,
    )  # fmt: skip


def _profile(points: tuple[ProfilePoint, ...], gpu: str = "A100-SXM4-80GB") -> LayerProfile:
    return LayerProfile(gpu=gpu, runtime="fsdp2", shape=SHAPE, points=points, source="test")


def test_a_profile_survives_its_json_form_and_bad_fields_are_named() -> None:
    profile = _profile((_point(1), _point(4)))
    again = LayerProfile.from_dict(json.loads(json.dumps(profile.to_dict())))
    assert again.key == profile.key and set(again.points) == set(profile.points)
    with pytest.raises(ValueError, match=r"unknown field.*colour"):
        LayerProfile.from_dict({**profile.to_dict(), "colour": "red"})
    with pytest.raises(ValueError, match="layer_fwd_s"):
        ProfilePoint(micro_batch_size=1, tp=1, layer_fwd_s=0.0, layer_bwd_s=1.0)
    with pytest.raises(ValueError, match="appears twice"):
        _profile((_point(1), _point(1)))


def test_micro_batches_between_points_interpolate_and_outside_scale() -> None:
    index = ProfileIndex((_profile((_point(1), _point(4, scale=0.5))),))
    exact = index.point("A100-SXM4-80GB", "fsdp2", SHAPE, 1, 4)
    assert exact is not None and exact.layer_fwd_s == pytest.approx(2e-3)
    between = index.point("A100-SXM4-80GB", "fsdp2", SHAPE, 1, 2)
    assert between is not None and between.layer_fwd_s == pytest.approx(1e-3 + (2e-3 - 1e-3) / 3)
    beyond = index.point("A100-SXM4-80GB", "fsdp2", SHAPE, 1, 8)
    assert beyond is not None and beyond.layer_bwd_s == pytest.approx(2 * 4e-3)
    assert index.point("A100-SXM4-80GB", "fsdp2", SHAPE, 2, 4) is None  # no point at tp 2
    assert index.point("H100-SXM5-80GB", "fsdp2", SHAPE, 1, 4) is None


def test_a_profiled_job_is_priced_from_its_measured_layers() -> None:
    model = replace(shipped_model(), layer_profiles=(_profile((_point(2),)),))
    terms = step_terms(JOB)
    assert profiled_point(terms, A100, model) is not None
    links = Links.for_gpu(A100)
    step = terms.evaluate(A100, links, model)
    layer = 1e-3 * 2 + 2e-3 * 2
    per_microbatch = 4 * layer + 1e-3 + 2e-4  # four layers, the output layer, the embedding (pp 1)
    assert step.compute_s == pytest.approx(terms.microbatches * per_microbatch)
    assert step.optimizer_s == pytest.approx(4 * 3e-4)
    # Another GPU type, or the same job without the profile, keeps the kernel model.
    h100 = lookup_gpu("H100-SXM5-80GB")
    h100_links = Links.for_gpu(h100)
    assert terms.evaluate(h100, h100_links, model) == terms.evaluate(h100, h100_links, shipped_model())
    assert step != terms.evaluate(A100, links, shipped_model())
    # The profile travels with the parameters' JSON (a calibration profile's form).
    again = StepTimeModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert terms.evaluate(A100, links, again) == step


def test_the_profiler_measures_every_point_on_any_torch_device() -> None:
    profile, notes = profiler.measure(
        JOB, gpu="A100-SXM4-80GB", micro_batches=[1, 2], tps=[1, 2], device="cpu", warmup=0, iters=1
    )
    assert notes == []
    assert {(p.micro_batch_size, p.tp) for p in profile.points} == {(1, 1), (2, 1), (1, 2), (2, 2)}
    assert all(min(p.layer_fwd_s, p.layer_bwd_s, p.output_fwd_s, p.update_s) > 0 for p in profile.points)
    assert profile.shape == SHAPE and profile.runtime == "fsdp2" and not profile.includes_tp_comm
    model = replace(shipped_model(), layer_profiles=(profile,))
    assert profiled_point(step_terms(JOB), A100, model) is not None
    with pytest.raises(ValueError, match=r"training\.precision 'fp8'"):
        fp8 = parse_job({**JOB_DICT, "training": {**JOB_DICT["training"], "precision": "fp8"}})
        profiler.measure(fp8, gpu="H100-SXM5-80GB", micro_batches=[1], tps=[1], device="cpu")


def test_the_planner_choices_are_what_gets_measured() -> None:
    assert profiler.micro_batch_sizes(JOB, MICRO_BATCH_CHOICES) == [1, 2, 4, 8]
    assert profiler.tp_degrees(JOB) == [1, 2]  # two key/value heads: tp 4 would split one


@pytest.mark.skipif(profiler.cuda_refusal() is None, reason="this machine has CUDA: the refusal does not apply")
def test_profile_refuses_without_cuda_and_stores_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.json"
    job.write_text(json.dumps(JOB_DICT))
    assert main(["profile", str(job), "--name", "mine", "--dir", str(tmp_path / "cal")]) == 2
    assert "CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "cal").exists()


def test_added_profiles_merge_into_a_calibration_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRENZY_CALIBRATIONS", str(tmp_path))
    store = CalibrationStore()
    add_profiles(store, "site", [_profile((_point(1), _point(2)))], "first")
    add_profiles(store, "site", [_profile((_point(2, scale=3.0), _point(4)))], "second")
    model = resolve_model("site")
    (profile,) = model.layer_profiles
    points = {p.micro_batch_size: p for p in profile.points}
    assert sorted(points) == [1, 2, 4] and points[2].layer_fwd_s == pytest.approx(6e-3)
    assert store.read("site")["profile_sources"] == ["first", "second"]
    # The other parameters are the shipped ones.
    assert model.gemm_efficiency == shipped_model().gemm_efficiency


def _sailor_folder(root: Path) -> Path:
    """A small folder in the layout of Sailor's artefact: a 4-layer GPT with h 64, seq 32, vocab 128."""
    h, seq, vocab = 64, 32, 128
    root.mkdir(parents=True, exist_ok=True)
    layer = {"params_floats": 12 * h * h + 13 * h, "act_output_floats": seq * h}
    info = {"OPT-350": {"1": {"0": {"params_floats": (vocab + seq) * h}, **{str(i): layer for i in range(1, 5)},
                              "5": {"params_floats": 2 * h}}}}  # fmt: skip
    (root / "llm_info.json").write_text(json.dumps(info))
    good = {str(i): [0.002, 0.005, 0.001] for i in range(1, 5)} | {"0": [1e-4, 0.0, 0.001], "5": [3e-4, 4e-4, 0.001]}
    wrong = {str(i): [0.1, 0.1, 0.1] for i in range(3)}
    for gpu, data in (("A100-40", {"1": {"1": good}, "2": {"1": good, "2": wrong}}), ("Titan-RTX", {"1": {"1": good}})):
        (root / "profiles" / "OPT-350" / gpu).mkdir(parents=True)
        (root / "profiles" / "OPT-350" / gpu / "profile.json").write_text(json.dumps(data))
    return root


def test_sailor_profiles_import_with_their_shapes_and_skip_what_is_another_models(tmp_path: Path) -> None:
    profiles, notes = import_profiles(_sailor_folder(tmp_path))
    by_gpu = {p.gpu: p for p in profiles}
    assert set(by_gpu) == {"A100-SXM4-40GB", "TITAN-RTX"}
    a100 = by_gpu["A100-SXM4-40GB"]
    assert (a100.shape.hidden_size, a100.shape.seq_len, a100.shape.vocab_size) == (64, 32, 128)
    assert a100.shape.ffn_hidden_size == 256 and a100.shape.precision == "fp32" and a100.includes_tp_comm
    assert {(p.micro_batch_size, p.tp) for p in a100.points} == {(1, 1), (2, 1)}
    (point,) = [p for p in a100.points if p.micro_batch_size == 1]
    assert (point.layer_fwd_s, point.layer_bwd_s, point.output_bwd_s) == (0.002, 0.005, 4e-4)
    assert len(notes) == 1 and "3 layers where OPT-350 has 6" in notes[0]
    with pytest.raises(ValueError, match="not a Sailor profile folder"):
        import_profiles(tmp_path / "profiles")


def test_profile_from_sailor_writes_a_profile_plan_uses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _sailor_folder(tmp_path / "sailor")
    code = main(["profile", "--from-sailor", str(folder), "--name", "sailor", "--dir", str(tmp_path / "cal"), "--json"])
    assert code == 0
    payload = json.loads(capsys.readouterr().out)
    assert len(payload["profiles"]) == 2 and len(payload["skipped"]) == 1
    stored = CalibrationStore(tmp_path / "cal").load("sailor")
    assert len(stored.layer_profiles) == 2


def test_plan_with_a_calibration_prices_the_profiled_gpu_type_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FRENZY_CALIBRATIONS", str(tmp_path / "cal"))
    slow = tuple(_point(mbs, tp, scale=1000.0) for mbs in (1, 2, 4, 8) for tp in (1, 2))
    add_profiles(CalibrationStore(), "site", [_profile(slow)], "test")
    job = tmp_path / "job.json"
    job.write_text(json.dumps({k: v for k, v in JOB_DICT.items() if k != "parallel"}))

    def best_per_type(*extra: str) -> dict[str, float]:
        assert main(["plan", str(job), "--cluster", "paper-3type", "--top", "100000", "--json", *extra]) == 0
        plans = json.loads(capsys.readouterr().out)["plans"]
        out: dict[str, float] = {}
        for p in plans:
            out[p["gpu_type"]] = min(out.get(p["gpu_type"], float("inf")), p["step_time_s"])
        return out

    shipped, profiled = best_per_type(), best_per_type("--calibration", "site")
    # Each A100 layer now takes seconds per micro-batch; the other types keep the kernel model's times.
    assert profiled["A100-SXM4-80GB"] > 1.0 > shipped["A100-SXM4-80GB"]
    assert profiled["RTX-3090"] == pytest.approx(shipped["RTX-3090"])


def test_validate_layers_scores_the_kernel_model_on_measured_layers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _sailor_folder(tmp_path / "sailor")
    out = tmp_path / "layers.md"
    assert main(["validate", "layers", str(folder), "--out", str(out), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert len(payload["points"]) == 3 and len(payload["skipped"]) == 1
    point = payload["points"][0]
    assert point["measured_layer_ms"] == pytest.approx(7.0)  # 2 ms forward + 5 ms backward
    assert point["predicted_layer_ms"] > 0 and point["kernel_layer_ms"] > 0
    assert payload["summary"]["by_gpu"].keys() == {"A100-SXM4-40GB", "TITAN-RTX"}
    assert "| A100-SXM4-40GB | 2 |" in out.read_text(encoding="utf-8")
