"""Specs and catalogues: exact parameter counting against published totals, the reference decoder, job-spec
validation (contract 1), the GPU catalogue, cluster and scenario files (contract 2)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from frenzy_opt.core.spec import (
    ATTENTIONS,
    OPTIMIZERS,
    PARALLEL_FIELDS,
    PRECISIONS,
    RECOMPUTES,
    RUNTIMES,
    SPLIT_FIELDS,
    default_zero_stage,
    load_job,
    load_mapping,
    parse_job,
)
from frenzy_opt.hardware.cluster import parse_cluster
from frenzy_opt.hardware.gpus import load_gpus, lookup_gpu
from frenzy_opt.models.arch import shard_param_counts
from frenzy_opt.models.catalog import catalog_names, load_catalog, lookup_model, parse_model, published_params
from frenzy_opt.models.reference import ReferenceDecoder, ShardSpec, _RMSNormFunction
from frenzy_opt.planning.scenario import load_cluster_ref, load_scenario, parse_scenario, resolve, shipped_names

CATALOGUE = sorted(load_catalog())


# --- 1. exact parameter counting vs published totals -------------------------------------------------------


def _published_texts() -> dict[str, str]:
    """``published_params`` of each catalogue entry exactly as written in catalog.yaml, so that the number of
    significant digits the publication gives survives (a parsed float loses trailing zeros)."""
    text = resources.files("frenzy_opt.models").joinpath("catalog.yaml").read_text(encoding="utf-8")
    pairs = re.findall(r"name:\s*([^,\s]+),\s*published_params:\s*([0-9.eE+-]+)", text)
    return {name.lower(): value for name, value in pairs}


def _significant_digits(number_text: str) -> int:
    mantissa = re.split(r"[eE]", number_text)[0].replace(".", "").lstrip("0")
    return len(mantissa)


def _round_significant(value: int, digits: int) -> float:
    return float(f"{value:.{digits - 1}e}")


def test_every_catalogue_entry_has_a_published_total() -> None:
    texts = _published_texts()
    assert set(texts) == set(CATALOGUE)
    for name in CATALOGUE:
        assert published_params(name) == float(texts[name])


@pytest.mark.parametrize("name", CATALOGUE)
def test_num_params_matches_published_total(name: str) -> None:
    count = load_catalog()[name].num_params
    published = published_params(name)
    if name.startswith("gpt3-"):
        # Brown et al. 2020, Table 2.1 gives nominal sizes ("125M", "2.7B", "175B").
        assert abs(count - published) <= 0.02 * published
    else:
        digits = _significant_digits(_published_texts()[name])
        assert _round_significant(count, digits) == pytest.approx(published, rel=1e-12, abs=0)


def test_qwen25_7b_matches_the_released_checkpoint() -> None:
    count = lookup_model("qwen2.5-7b").num_params
    # The released checkpoint (config.json: 28 layers, h 3584, ffn 18944, 28 heads, 4 kv heads, vocab 152064,
    # q/k/v bias, untied); its hub page lists 7.62B (the model card truncates it to 7.61B).
    assert count == 7_615_616_512


def test_llama2_7b_exact_checkpoint_count() -> None:
    # The released Llama-2-7b checkpoint: 6,738,415,616 parameters (Touvron et al. 2023: 6.74B).
    assert lookup_model("llama2-7b").num_params == 6_738_415_616


def test_llama3_8b_exact_checkpoint_count() -> None:
    # The released Meta-Llama-3-8B checkpoint: 8,030,261,248 parameters.
    assert lookup_model("llama3-8b").num_params == 8_030_261_248
    assert lookup_model("llama3.1-8b").num_params == 8_030_261_248


def test_gpt3_175b_total() -> None:
    assert 174e9 <= lookup_model("gpt3-175b").num_params <= 176e9


def test_mixtral_active_params() -> None:
    # Jiang et al. 2024, "Mixtral of Experts": 46.7B total, 12.9B active per token (top-2 of 8 experts).
    mixtral = lookup_model("mixtral-8x7b")
    assert mixtral.num_active_params == pytest.approx(12.9e9, rel=0.01)
    assert mixtral.num_active_params < mixtral.num_params


def test_dense_models_have_all_params_active() -> None:
    for arch in load_catalog().values():
        if not arch.is_moe:
            assert arch.num_active_params == arch.num_params


def test_lookup_model_is_case_insensitive() -> None:
    assert lookup_model("LLaMA3-8B") == lookup_model("llama3-8b")


# --- 2. the reference decoder has exactly num_params parameters -------------------------------------------

_BASE = {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 8, "vocab_size": 256}

INLINE_ARCHS: dict[str, dict[str, Any]] = {
    "gqa-swiglu-rmsnorm-untied": {**_BASE, "num_kv_heads": 2},
    "gelu-layernorm-bias-learned-tied": {
        **_BASE,
        "mlp": "gelu",
        "norm": "layernorm",
        "linear_bias": True,
        "position_embedding": "learned",
        "max_position_embeddings": 32,
        "tied_embeddings": True,
    },
    "gelu-layernorm-bias-learned-untied": {
        **_BASE,
        "mlp": "gelu",
        "norm": "layernorm",
        "linear_bias": True,
        "position_embedding": "learned",
        "max_position_embeddings": 32,
    },
    "qkv-bias-tied": {**_BASE, "num_kv_heads": 4, "qkv_bias": True, "tied_embeddings": True},
    "swiglu-linear-bias": {**_BASE, "num_kv_heads": 4, "linear_bias": True},
    "explicit-head-dim": {**_BASE, "hidden_size": 96, "num_attention_heads": 5, "num_kv_heads": 1, "head_dim": 32},
    "moe": {**_BASE, "num_kv_heads": 4, "num_experts": 4, "moe_top_k": 2, "moe_ffn_hidden_size": 96},
    "moe-gelu-bias": {
        **_BASE,
        "mlp": "gelu",
        "norm": "layernorm",
        "linear_bias": True,
        "num_experts": 4,
        "moe_top_k": 1,
    },
}


def _module_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())  # parameters() yields a tied weight once


@pytest.mark.parametrize("name", CATALOGUE)
def test_reference_decoder_matches_num_params_catalogue(name: str) -> None:
    arch = load_catalog()[name]
    with torch.device("meta"):
        model = ReferenceDecoder(arch)
    assert _module_params(model) == arch.num_params


@pytest.mark.parametrize("name", sorted(INLINE_ARCHS))
def test_reference_decoder_matches_num_params_inline(name: str) -> None:
    arch = parse_model(INLINE_ARCHS[name])
    with torch.device("meta"):
        model = ReferenceDecoder(arch)
    assert _module_params(model) == arch.num_params


@pytest.mark.parametrize(
    ("arch_source", "ep"),
    [
        ("gqa-swiglu-rmsnorm-untied", 1),
        ("gelu-layernorm-bias-learned-tied", 1),
        ("moe", 2),
        ("llama2-7b", 1),
        ("mixtral-8x7b", 2),
    ],
)
def test_tensor_parallel_shard_matches_shard_param_counts(arch_source: str, ep: int) -> None:
    arch = parse_model(INLINE_ARCHS.get(arch_source, arch_source))
    tp = 2
    assert arch.num_attention_heads % tp == 0 and arch.num_kv_heads % tp == 0
    assert arch.ffn_hidden_size % tp == 0 and arch.vocab_size % tp == 0 and arch.num_experts % ep == 0
    counts = shard_param_counts(arch, tp=tp, ep=ep)
    expected = counts.embedding + arch.num_layers * counts.per_layer + counts.final_norm + counts.output
    with torch.device("meta"):
        model = ReferenceDecoder(arch, ShardSpec(tp=tp, ep=ep))
    assert _module_params(model) == expected
    # Only replicated tensors (norms, routers, position embeddings) are not split, so a rank holds at least
    # its share and well under the whole model.
    assert arch.num_params / (tp * ep) <= expected < arch.num_params


# --- 3. a tiny real model trains on CPU; the custom RMSNorm backward is right ---------------------------


@pytest.fixture
def seeded() -> Iterator[None]:
    """Fixed module initialisation without leaking a global seed into other tests; one intra-op thread, since
    tiny ops on a busy machine spend far longer in OpenMP hand-offs than in arithmetic."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            yield
    finally:
        torch.set_num_threads(threads)


TINY = {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4, "vocab_size": 128}
TINY_ARCHS = {
    "llama-like": ({**TINY, "num_kv_heads": 2}, "flash"),
    "gpt-like-eager": (
        {
            **TINY,
            "mlp": "gelu",
            "norm": "layernorm",
            "linear_bias": True,
            "position_embedding": "learned",
            "max_position_embeddings": 16,
            "tied_embeddings": True,
        },
        "eager",
    ),
    "moe": ({**TINY, "num_kv_heads": 2, "num_experts": 4, "moe_top_k": 2}, "flash"),
}


def _batch(vocab: int, batch: int = 4, seq: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


@pytest.mark.parametrize("name", sorted(TINY_ARCHS))
def test_tiny_model_loss_and_training(name: str, seeded: None) -> None:
    raw, attention = TINY_ARCHS[name]
    arch = parse_model(raw)
    model = ReferenceDecoder(arch, attention=attention, max_seq_len=16)
    inputs, targets = _batch(arch.vocab_size)
    loss = model(inputs, targets)
    assert loss.dim() == 0
    assert torch.isfinite(loss) and loss.item() > 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = loss.item()
    for _ in range(8):
        optimizer.zero_grad()
        loss = model(inputs, targets)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        last = model(inputs, targets).item()
    assert last < first - 0.1


def test_loss_accepts_shifted_token_slices(seeded: None) -> None:
    arch = parse_model({**TINY, "num_kv_heads": 2})
    model = ReferenceDecoder(arch, max_seq_len=16)
    tokens = torch.randint(0, arch.vocab_size, (4, 17), generator=torch.Generator().manual_seed(1))
    loss = model(tokens[:, :-1], tokens[:, 1:])
    torch.testing.assert_close(loss, model(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))


@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recompute_does_not_change_loss_or_gradients(recompute: str, seeded: None) -> None:
    arch = parse_model({**TINY, "num_kv_heads": 2})
    plain = ReferenceDecoder(arch, max_seq_len=16)
    other = ReferenceDecoder(arch, recompute=recompute, max_seq_len=16)
    other.load_state_dict(plain.state_dict())
    inputs, targets = _batch(arch.vocab_size)
    loss_a, loss_b = plain(inputs, targets), other(inputs, targets)
    loss_a.backward()
    loss_b.backward()
    torch.testing.assert_close(loss_a, loss_b)
    for (name, pa), pb in zip(plain.named_parameters(), other.parameters(), strict=True):
        assert pa.grad is not None and pb.grad is not None, name
        torch.testing.assert_close(pa.grad, pb.grad, msg=name)


def test_rmsnorm_forward_matches_definition(seeded: None) -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 5, 8, generator=gen, dtype=torch.float64)
    weight = torch.randn(8, generator=gen, dtype=torch.float64)
    out = _RMSNormFunction.apply(x, weight, 1e-5)
    # Zhang & Sennrich 2019, Eq. 4: x / RMS(x) * g.
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight
    torch.testing.assert_close(out, expected)


def test_rmsnorm_backward_gradcheck(seeded: None) -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(8, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, w: _RMSNormFunction.apply(a, w, 1e-5), (x, weight))


# --- 4. job spec parsing (contract 1) ---------------------------------------------------------------------


def _job(**overrides: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "name": "j",
        "model": "llama3-8b",
        "training": {"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": 64},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(job.get(key), dict):
            job[key] = {**job[key], **value}
        else:
            job[key] = value
    return job


def test_parse_job_accepts_the_contract_example() -> None:
    spec = parse_job(
        {
            "name": "llama3-8b-pretrain",
            "model": "llama3-8b",
            "training": {"seq_len": 8192, "micro_batch_size": 1, "global_batch_size": 512, "train_steps": 1000,
                         "precision": "bf16", "optimizer": "adamw", "runtime": "megatron"},
            "parallel": {"dp": 8, "tp": 1, "pp": 1, "vpp": 1, "sequence_parallel": False, "cp": 1, "ep": 1,
                         "zero_stage": 1, "recompute": "none", "attention": "flash"},
        }
    )  # fmt: skip
    assert spec.name == "llama3-8b-pretrain"
    assert spec.model == lookup_model("llama3-8b")
    assert spec.training.seq_len == 8192 and spec.training.global_batch_size == 512
    assert spec.parallel.dp == 8 and spec.parallel.zero_stage == 1
    assert spec.parallel.num_gpus == 8
    # The contract's example pins the whole layout; the split refinements (Megatron's uneven end stages) stay free.
    assert spec.pinned == frozenset(PARALLEL_FIELDS) - frozenset(SPLIT_FIELDS)


@pytest.mark.parametrize(
    ("job", "field", "allowed"),
    [
        (_job(budget=3), "budget", ["name", "model", "training", "parallel"]),
        (_job(training={"lr": 1e-4}), "lr", ["seq_len", "micro_batch_size", "precision", "runtime"]),
        (_job(parallel={"fsdp": 2}), "fsdp", list(PARALLEL_FIELDS)),
        (_job(model={**TINY, "rope_theta": 1e4}), "rope_theta", ["hidden_size", "num_kv_heads", "mlp"]),
    ],
)
def test_unknown_field_is_named_with_allowed_fields(job: dict[str, Any], field: str, allowed: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        parse_job(job)
    message = str(info.value)
    assert field in message
    for name in allowed:
        assert name in message


@pytest.mark.parametrize(
    ("section", "key", "value", "allowed"),
    [
        ("training", "precision", "int4", PRECISIONS),
        ("training", "runtime", "jax", RUNTIMES),
        ("training", "optimizer", "lion", OPTIMIZERS),
        ("parallel", "recompute", "some", RECOMPUTES),
        ("parallel", "attention", "xformers", ATTENTIONS),
    ],
)
def test_bad_enum_value_names_field_and_allowed_values(
    section: str, key: str, value: str, allowed: tuple[str, ...]
) -> None:
    with pytest.raises(ValueError) as info:
        parse_job(_job(**{section: {key: value}}))
    message = str(info.value)
    assert f"{section}.{key}" in message
    assert value in message
    for choice in allowed:
        assert choice in message


def test_contract_enumerations() -> None:
    assert set(PRECISIONS) == {"bf16", "fp16", "fp32", "fp8"}
    assert set(OPTIMIZERS) == {"adamw", "adam", "sgd", "adafactor"}
    assert set(RUNTIMES) == {"megatron", "fsdp2", "deepspeed", "hf"}
    assert set(RECOMPUTES) == {"none", "selective", "full"}
    assert set(ATTENTIONS) == {"flash", "eager"}


def test_enum_values_are_case_insensitive() -> None:
    spec = parse_job(_job(training={"precision": "BF16", "runtime": "FSDP2"}, parallel={"recompute": "Full"}))
    assert spec.training.precision == "bf16" and spec.training.runtime == "fsdp2"
    assert spec.parallel.recompute == "full"


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("training", "seq_len", 0),
        ("training", "micro_batch_size", -1),
        ("training", "global_batch_size", 0),
        ("training", "train_steps", 2.5),
        ("training", "seq_len", True),
        ("parallel", "dp", 0),
        ("parallel", "tp", -2),
        ("parallel", "pp", 0),
        ("parallel", "cp", "2"),
        ("parallel", "ep", 0),
    ],
)
def test_non_positive_int_is_rejected(section: str, key: str, value: object) -> None:
    with pytest.raises(ValueError, match=re.escape(f"{section}.{key}")):
        parse_job(_job(**{section: {key: value}}))


def test_null_dp_is_a_value_error_naming_the_field() -> None:
    with pytest.raises(ValueError, match=re.escape("parallel.dp")):
        parse_job(_job(parallel={"dp": None}))


def test_non_numeric_dp_names_the_field() -> None:
    with pytest.raises(ValueError, match=re.escape("parallel.dp")):
        parse_job(_job(parallel={"dp": "two"}))


def test_global_batch_must_be_a_multiple_of_micro_batch() -> None:
    with pytest.raises(ValueError) as info:
        parse_job(_job(training={"micro_batch_size": 3, "global_batch_size": 64}))
    assert "training.global_batch_size" in str(info.value)
    assert "training.micro_batch_size" in str(info.value)


@pytest.mark.parametrize("stage", [5, -1, True])
def test_zero_stage_out_of_range(stage: object) -> None:
    with pytest.raises(ValueError, match=re.escape("parallel.zero_stage")):
        parse_job(_job(parallel={"zero_stage": stage}))


def test_inline_model_missing_hidden_size() -> None:
    raw = {k: v for k, v in TINY.items() if k != "hidden_size"}
    with pytest.raises(ValueError, match="hidden_size"):
        parse_job(_job(model=raw))


def test_unknown_catalogue_name_lists_valid_names() -> None:
    with pytest.raises(ValueError) as info:
        parse_job(_job(model="llama9-1t"))
    message = str(info.value)
    assert "llama9-1t" in message
    for name in catalog_names():
        assert name in message


def test_num_kv_heads_must_divide_heads() -> None:
    with pytest.raises(ValueError, match="num_kv_heads"):
        parse_job(_job(model={**TINY, "num_kv_heads": 3}))


def test_inline_model_defaults_kv_heads_to_heads() -> None:
    spec = parse_job(_job(model=dict(TINY)))
    assert spec.model.num_kv_heads == TINY["num_attention_heads"]


@pytest.mark.parametrize(
    "parallel",
    [{}, {"tp": 2}, {"dp": 4, "zero_stage": 1}, {"pp": 2, "vpp": 2, "recompute": "full"}, {"sequence_parallel": True}],
)
def test_pinned_records_exactly_the_given_parallel_keys(parallel: dict[str, Any]) -> None:
    spec = parse_job(_job(parallel=parallel) if parallel else _job())
    assert spec.pinned == frozenset(parallel)
    for key, value in parallel.items():
        assert getattr(spec.parallel, key) == value


def test_default_zero_stage_rules() -> None:
    for dp in (1, 2, 8):
        assert default_zero_stage("fsdp2", dp) == 3
        assert default_zero_stage("hf", dp) == 0
    for runtime in ("megatron", "deepspeed"):
        assert default_zero_stage(runtime, 1) == 0
        assert default_zero_stage(runtime, 8) == 1


def test_fsdp2_gets_zero3_unless_pinned() -> None:
    assert parse_job(_job(training={"runtime": "fsdp2"})).parallel.zero_stage == 3
    assert parse_job(_job(training={"runtime": "fsdp2"}, parallel={"dp": 4})).parallel.zero_stage == 3
    pinned = parse_job(_job(training={"runtime": "fsdp2"}, parallel={"zero_stage": 2}))
    assert pinned.parallel.zero_stage == 2 and "zero_stage" in pinned.pinned
    assert "zero_stage" not in parse_job(_job(training={"runtime": "fsdp2"})).pinned


def test_megatron_distributed_optimizer_default_follows_dp() -> None:
    assert parse_job(_job(parallel={"dp": 8})).parallel.zero_stage == 1
    assert parse_job(_job()).parallel.zero_stage == 0


def test_vpp_needs_pipeline_and_ep_divides_dp() -> None:
    with pytest.raises(ValueError, match=re.escape("parallel.vpp")):
        parse_job(_job(parallel={"vpp": 2}))
    with pytest.raises(ValueError, match=re.escape("parallel.ep")):
        parse_job(_job(parallel={"dp": 4, "ep": 3}))


def test_load_job_yaml_and_json_agree(tmp_path: Path) -> None:
    job = _job(model=dict(TINY), parallel={"tp": 2})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job), encoding="utf-8")
    (tmp_path / "job.json").write_text(json.dumps(job), encoding="utf-8")
    assert load_job(tmp_path / "job.yaml") == load_job(tmp_path / "job.json") == parse_job(job)


def test_load_job_errors_are_value_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        load_job(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n", encoding="utf-8")
    with pytest.raises(ValueError, match="YAML"):
        load_job(bad)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n", encoding="utf-8")
    with pytest.raises(ValueError, match="mapping"):
        load_job(listed)


# --- 5. GPU catalogue -------------------------------------------------------------------------------------

REQUIRED_GPUS = (
    "T4", "V100-PCIE-16GB", "V100-SXM2-16GB", "V100-SXM2-32GB", "RTX-2080Ti", "RTX-3090", "RTX-4090", "RTX-A6000",
    "A10G", "L4", "L40S", "A100-PCIE-40GB", "A100-SXM4-40GB", "A100-PCIE-80GB", "A100-SXM4-80GB", "H100-PCIE-80GB",
    "H100-SXM5-80GB", "H200-SXM-141GB", "B200-SXM-180GB",
)  # fmt: skip
GIB = 2**30


def test_all_required_gpus_present_with_source_and_memory() -> None:
    gpus = load_gpus()
    assert set(REQUIRED_GPUS) <= set(gpus)
    for name in REQUIRED_GPUS:
        gpu = gpus[name]
        assert gpu.source.startswith("https://"), name
        assert isinstance(gpu.memory_bytes, int) and gpu.memory_bytes > 0, name
        assert gpu.fp32_tflops > 0 and gpu.fp16_tflops > 0 and gpu.hbm_gbyte_s > 0, name


def test_published_gpu_facts() -> None:
    # NVIDIA A100 datasheet: BF16 tensor core 312 TFLOPS dense (624 with sparsity).
    for name in ("A100-PCIE-40GB", "A100-SXM4-40GB", "A100-PCIE-80GB", "A100-SXM4-80GB"):
        assert lookup_gpu(name).bf16_tflops == 312
    # NVIDIA H100 SXM datasheet: 1,979 TFLOPS BF16 with sparsity, so ~989 dense.
    assert lookup_gpu("H100-SXM5-80GB").bf16_tflops == pytest.approx(989, rel=0.01)
    # Volta tensor cores have no bf16; Hopper adds fp8.
    for name in ("V100-PCIE-16GB", "V100-SXM2-16GB", "V100-SXM2-32GB"):
        assert not lookup_gpu(name).supports("bf16")
        assert lookup_gpu(name).supports("fp16")
    assert lookup_gpu("H100-SXM5-80GB").supports("fp8")
    assert lookup_gpu("H100-SXM5-80GB").supports("bf16")
    assert not lookup_gpu("A100-SXM4-80GB").supports("fp8")
    assert lookup_gpu("A100-SXM4-80GB").memory_bytes == 80 * GIB


def test_gpu_aliases_resolve_case_insensitively() -> None:
    assert lookup_gpu("h100-sxm").name == "H100-SXM5-80GB"
    assert lookup_gpu("NVIDIA A100-SXM4-80GB").name == "A100-SXM4-80GB"  # nvidia-smi's name
    assert lookup_gpu("rtx 2080").name == "RTX-2080"  # an exact alias wins over the 2080 Ti it is a prefix of
    for name in REQUIRED_GPUS:
        assert lookup_gpu(name.lower()).name == name
        assert lookup_gpu(f"  {name.upper()} ").name == name


def test_gpu_names_and_aliases_are_unambiguous() -> None:
    keys = []
    for gpu in load_gpus().values():
        keys += [gpu.name.lower(), *(a.lower() for a in gpu.aliases)]
    assert len(keys) == len(set(keys))


def test_intra_node_bandwidth_convention() -> None:
    # gpus.yaml: intra_node_gbps is nvlink_gbps for SXM parts, pcie_gbps for every PCIe card.
    for gpu in load_gpus().values():
        if gpu.form_factor == "sxm":
            assert gpu.intra_node == "nvlink" and gpu.intra_node_gbyte_s == gpu.nvlink_gbyte_s, gpu.name
        else:
            assert gpu.intra_node == "pcie" and gpu.intra_node_gbyte_s == gpu.pcie_gbyte_s, gpu.name


def test_unknown_gpu_lists_names() -> None:
    with pytest.raises(ValueError) as info:
        lookup_gpu("Z100")
    message = str(info.value)
    assert "Z100" in message
    for name in REQUIRED_GPUS:
        assert name in message


# --- 6. cluster and scenario files (contract 2) -----------------------------------------------------------


def test_paper_3type_cluster() -> None:
    cluster = load_cluster_ref("paper-3type")
    assert cluster.num_gpus == 48
    assert len(cluster.gpu_types()) == 3
    assert {g.name for g in cluster.gpu_types()} == {"A100-SXM4-80GB", "V100-SXM2-32GB", "RTX-3090"}
    assert cluster.num_gpus_of("RTX-3090") == 16 and cluster.gpus_per_node_of("RTX-3090") == 4
    assert cluster.inter_node_gbit_s == 100


def test_resolve_shipped_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no local file of that name shadows the shipped one
    assert {"paper-3type", "default"} <= set(shipped_names())
    assert resolve("paper-3type") == resolve("paper-3type.yaml")
    assert resolve("paper-3type").is_file()
    local = tmp_path / "mine.yaml"
    local.write_text("name: x\n", encoding="utf-8")
    assert resolve("mine.yaml") == Path("mine.yaml")
    with pytest.raises(ValueError) as info:
        resolve("no-such-cluster")
    assert "paper-3type" in str(info.value)


def _cluster(**group: Any) -> dict[str, Any]:
    return {"name": "c", "node_groups": [{"gpu": "A100-SXM4-80GB", "num_nodes": 1, "gpus_per_node": 8, **group}]}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (_cluster(gpu="Z100"), "node_groups[0].gpu"),
        (_cluster(num_nodes=0), "node_groups[0].num_nodes"),
        (_cluster(gpus_per_node=-8), "node_groups[0].gpus_per_node"),
        (_cluster(intra_node="infiniband"), "node_groups[0].intra_node"),
        (_cluster(rack=3), "rack"),
        ({**_cluster(), "network": {"inter_node_gbps": -100}}, "network.inter_node_gbps"),
        ({**_cluster(), "network": {"inter_node_gbps": "fast"}}, "network.inter_node_gbps"),
        ({"name": "c", "node_groups": []}, "node_groups"),
        ({**_cluster(), "nodes": 4}, "cluster: unknown field(s) nodes; allowed: name, network, node_groups"),
    ],
)
def test_cluster_errors_name_the_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=re.escape(field)):
        parse_cluster(data)


def test_cluster_intra_node_error_lists_kinds() -> None:
    with pytest.raises(ValueError) as info:
        parse_cluster(_cluster(intra_node="infiniband"))
    assert "nvlink" in str(info.value) and "pcie" in str(info.value)


def test_default_scenario() -> None:
    scenario = load_scenario()
    assert len(scenario.jobs) >= 5
    ids = [job.id for job in scenario.jobs]
    assert all(ids) and len(set(ids)) == len(ids)
    for job in scenario.jobs:
        assert isinstance(job.arrival_s, float) and job.arrival_s >= 0
        assert job.weight > 0
    assert scenario.cluster.num_gpus > 0


def test_scenario_job_errors_name_the_job() -> None:
    data = {"cluster": "paper-3type", "jobs": [_job(id="a"), _job(id="b", training={"precision": "int4"})]}
    with pytest.raises(ValueError) as info:
        parse_scenario(data)
    assert "jobs[1]" in str(info.value) and "training.precision" in str(info.value)
    with pytest.raises(ValueError, match=re.escape("jobs[0].arrival_s")):
        parse_scenario({"cluster": "paper-3type", "jobs": [_job(arrival_s=-1)]})


def test_yaml_files_read_with_the_c_loader_give_what_safe_load_gives() -> None:
    from frenzy_opt.yamlload import FAST_LOADER, load_yaml

    assert FAST_LOADER is getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for name in shipped_names():
        text = resolve(name).read_text(encoding="utf-8")
        assert load_yaml(text) == yaml.safe_load(text), name


def test_a_malformed_yaml_file_is_refused_with_the_line_at_fault_quoted(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nnode_groups:\n  gpu: A100\n bad: 3\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not valid YAML") as err:
        load_mapping(path)
    # The pure-Python loader's message (the C parser's gives the line number but not the line itself).
    assert "line 4, column 2" in str(err.value) and "bad: 3" in str(err.value)
