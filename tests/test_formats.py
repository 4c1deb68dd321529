"""Importing the formats users have (issue 28 item 1): Hugging Face config.json (as `model:` and through
`frenzy import hf`), torchtitan TOML and Megatron argument lists. Every input below is written here after
each format's public schema (transformers' configuration classes, torchtitan's JobConfig and llama3 train
configs, Megatron-LM's arguments)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from frenzy_opt.cli import main
from frenzy_opt.core.spec import load_job, parse_job
from frenzy_opt.formats import import_spec
from frenzy_opt.formats.torchtitan import llama3_ffn
from frenzy_opt.models.catalog import lookup_model

LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
    "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "rope_type": "llama3"}, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.43.0", "use_cache": True,
    "vocab_size": 128256,
}  # fmt: skip
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "hidden_act": "silu", "hidden_size": 3584,
    "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "qwen2",
    "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_sliding_window": False, "vocab_size": 152064,
}  # fmt: skip
MISTRAL_7B_V01 = {
    "architectures": ["MistralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": False, "vocab_size": 32000,
}  # fmt: skip
MIXTRAL = {
    **MISTRAL_7B_V01, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 8,
    "num_experts_per_tok": 2, "sliding_window": None, "router_aux_loss_coef": 0.02, "output_router_logits": False,
}  # fmt: skip


def _write(tmp: Path, name: str, data: dict[str, Any]) -> Path:
    folder = tmp / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(data))
    return folder / "config.json"


@pytest.mark.parametrize(
    ("config", "catalogue"),
    [(LLAMA31_8B, "llama3.1-8b"), (QWEN25_7B, "qwen2.5-7b"), (MISTRAL_7B_V01, "mistral-7b"), (MIXTRAL, "mixtral-8x7b")],
)
def test_hf_configs_give_the_catalogues_architectures(tmp_path: Path, config: dict[str, Any], catalogue: str) -> None:
    path = _write(tmp_path, catalogue, config)
    job = parse_job({"model": str(path)})
    expected = lookup_model(catalogue)
    assert job.model.num_params == expected.num_params
    assert job.model.num_active_params == expected.num_active_params
    assert job.model.name == catalogue  # the config's folder


def test_a_spec_reads_its_config_beside_it(tmp_path: Path) -> None:
    _write(tmp_path, "Llama-3.1-8B", LLAMA31_8B)
    spec = tmp_path / "job.yaml"
    spec.write_text("model: Llama-3.1-8B/config.json\ntraining: {runtime: fsdp2}\n")
    assert load_job(spec).model.num_params == lookup_model("llama3.1-8b").num_params


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"model_type": "qwen3", "head_dim": 128}, "q/k RMSNorm"),
        ({"model_type": "deepseek_v3"}, "multi-head latent attention"),
        ({"model_type": "gemma"}, "model_type 'gemma' is not modelled"),
        ({"num_hidden_layer": 32}, "num_hidden_layer (nearest known: num_hidden_layers)"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"attention_bias": True}, "attention_bias (q, k, v and o) without the other"),
    ],
)
def test_unmodelled_hf_features_are_refused_naming_them(tmp_path: Path, change: dict[str, Any], words: str) -> None:
    path = _write(tmp_path, "m", {**LLAMA31_8B, **change})
    with pytest.raises(ValueError, match="model: ") as err:
        parse_job({"model": str(path)})
    assert words in str(err.value)


def test_qwen2_moe_is_read_without_shared_experts_and_refused_with_them(tmp_path: Path) -> None:
    moe = {**QWEN25_7B, "model_type": "qwen2_moe", "num_experts": 64, "num_experts_per_tok": 8,
           "moe_intermediate_size": 2560, "shared_expert_intermediate_size": 0}  # fmt: skip
    arch = parse_job({"model": str(_write(tmp_path, "a", moe))}).model
    assert (arch.num_experts, arch.moe_top_k, arch.moe_ffn_hidden_size, arch.qkv_bias) == (64, 8, 2560, True)
    del moe["shared_expert_intermediate_size"]  # Qwen2MoeConfig's default is 5632: a shared expert
    with pytest.raises(ValueError, match="shared experts"):
        parse_job({"model": str(_write(tmp_path, "b", moe))})


def test_contract_one_names_the_nearest_field_of_foreign_keys() -> None:
    with pytest.raises(ValueError) as err:
        parse_job({"model": {"num_hidden_layers": 2, "intermediate_size": 8, "num_key_value_heads": 1,
                             "tie_word_embeddings": True, "hidden_size": 8, "num_attention_heads": 2}})  # fmt: skip
    pairs = [("num_hidden_layers", "num_layers"), ("intermediate_size", "ffn_hidden_size")]
    pairs += [("num_key_value_heads", "num_kv_heads"), ("tie_word_embeddings", "tied_embeddings")]
    for foreign, ours in pairs:
        assert f"{foreign} (nearest known: {ours})" in str(err.value)
    with pytest.raises(ValueError, match=r"micro_batch \(nearest known: micro_batch_size\)"):
        parse_job({"model": "gpt3-125m", "training": {"micro_batch": 2}})


def test_frenzy_import_hf_writes_a_spec_that_plans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "Mistral-7B-v0.1", MISTRAL_7B_V01)
    out = tmp_path / "job.yaml"
    assert main(["import", "hf", str(path), "--runtime", "fsdp2", "--out", str(out)]) == 0
    assert "sliding-window attention (window 4096)" in capsys.readouterr().err
    spec = yaml.safe_load(out.read_text())
    assert spec["training"] == {"runtime": "fsdp2"} and spec["model"]["num_kv_heads"] == 8
    assert main(["plan", str(out), "--cluster", "paper-3type", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_plans"] > 0


TORCHTITAN_TOML = """
[job]
dump_folder = "./outputs"
description = "Llama 3 8B training"

[model]
name = "llama3"
flavor = "8B"
hf_assets_path = "./assets/hf/Llama-3.1-8B"
converters = ["float8"]

[optimizer]
name = "AdamW"
lr = 3e-4

[training]
local_batch_size = 2
seq_len = 8192
steps = 1000
dataset = "c4"

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = 4
fsdp_reshard_after_forward = "always"
tensor_parallel_degree = 2
pipeline_parallel_degree = 1
context_parallel_degree = 1

[activation_checkpoint]
mode = "full"

[quantize.linear.float8]
enable_fsdp_float8_all_gather = true
"""


def test_torchtitan_toml_gives_the_flavour_and_its_parallel_sections(tmp_path: Path) -> None:
    assert llama3_ffn(4096, 1024, 1.3) == 14336 and llama3_ffn(16384, 4096, 1.2) == 53248  # catalogue widths
    path = tmp_path / "llama3_8b.toml"
    path.write_text(TORCHTITAN_TOML)
    result = import_spec("torchtitan", str(path))
    job = parse_job(result.spec)
    assert job.model.num_params == lookup_model("llama3-8b").num_params
    t, p = job.training, job.parallel
    assert (t.runtime, t.precision, t.fp8_param_gather, t.seq_len, t.train_steps) == ("fsdp2", "fp8", True, 8192, 1000)
    assert (t.micro_batch_size, t.global_batch_size, "micro_batch_size" in job.pinned) == (2, 8, True)
    assert (p.dp, p.tp, p.zero_stage, p.recompute, p.sequence_parallel) == (4, 2, 3, "full", True)
    path.write_text(TORCHTITAN_TOML.replace("tensor_parallel_degre", "tensor_paralel_degre"))
    with pytest.raises(ValueError, match=r"tensor_paralel_degree \(nearest known: tensor_parallel_degree\)"):
        import_spec("torchtitan", str(path))
    path.write_text(TORCHTITAN_TOML.replace("data_parallel_shard_degree = 4", "data_parallel_shard_degree = -1"))
    with pytest.raises(ValueError, match="give --global-batch-size"):
        import_spec("torchtitan", str(path))
    assert import_spec("torchtitan", str(path), global_batch_size=64).spec["training"]["global_batch_size"] == 64


MEGATRON_ARGS = """# Llama-2-7B pretraining (Megatron-LM examples)
torchrun --nproc_per_node 8 pretrain_gpt.py \\
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 11008 --num-attention-heads 32 \\
    --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 1024 \\
    --train-iters 500000 --lr 3e-4 --bf16 --swiglu --normalization RMSNorm --disable-bias-linear \\
    --untie-embeddings-and-output-weights --position-embedding-type rope --attention-dropout 0 \\
    --hidden-dropout 0 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel \\
    --use-distributed-optimizer --recompute-activations --vocab-size 32000 --data-path /data/c4 --num-layer 3
"""


def test_megatron_arguments_from_a_file_and_a_string(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "args.sh"
    path.write_text(MEGATRON_ARGS)
    result = import_spec("megatron", str(path))
    job = parse_job(result.spec)
    assert job.model.num_params == lookup_model("llama2-7b").num_params
    p, t = job.parallel, job.training
    assert (p.tp, p.pp, p.sequence_parallel, p.zero_stage, p.recompute) == (2, 2, True, 1, "selective")
    assert (t.precision, t.global_batch_size, t.train_steps, t.runtime) == ("bf16", 1024, 500000, "megatron")
    assert "dp" not in job.pinned and {"tp", "pp", "zero_stage", "micro_batch_size"} <= job.pinned
    assert "--num-layer (nearest read: --num-layers)" in result.notes[0] and "--lr" in result.notes[0]
    one_line = " ".join(MEGATRON_ARGS.replace("\\\n", " ").split("pretrain_gpt.py", 1)[1].split())
    assert main(["import", "megatron", f"--args={one_line}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["spec"] == result.spec
    with pytest.raises(ValueError, match="multi-head latent attention is not modelled"):
        import_spec("megatron", "", text=one_line + " --multi-latent-attention")
    with pytest.raises(ValueError, match="give --vocab-size"):
        import_spec("megatron", "", text=one_line.replace("--vocab-size 32000", ""))


def test_the_api_refuses_a_model_path(tmp_path: Path) -> None:
    from factories import simulated_service
    from fastapi.testclient import TestClient

    from frenzy_opt.api.app import create_app

    config = simulated_service(f"sqlite:///{tmp_path / 'jobs.db'}", 1e9, None, decision_wait_s=5.0)
    with TestClient(create_app(config)) as client:
        answer = client.post("/v1/plans", json={"model": "/etc/config.json"})
        assert answer.status_code == 422 and "read by the CLI" in answer.text
