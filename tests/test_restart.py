"""What a move costs (planning/restart.py): the checkpoint sized by the model, its save and load over the
cluster's storage (per node and in total), start-up and warm-up; the cluster file's storage section."""

from __future__ import annotations

import pytest

from frenzy_opt.core.spec import parse_job
from frenzy_opt.hardware.cluster import Storage, parse_cluster
from frenzy_opt.planning.restart import STARTUP_S, WARMUP_STEPS, checkpoint_bytes, restart_s

LLAMA_70B = parse_job({"model": "llama3-70b", "training": {"precision": "bf16", "optimizer": "adamw"}})
SMALL = parse_job({"model": "gpt3-125m", "training": {"precision": "bf16"}})


def test_a_checkpoint_holds_weights_master_copy_and_adam_moments() -> None:
    params = LLAMA_70B.model.num_params
    assert checkpoint_bytes(LLAMA_70B) == pytest.approx(params * (2 + 4 + 8))
    assert 0.95e12 < checkpoint_bytes(LLAMA_70B) < 1.0e12  # "about 1 TB for 70B with Adam"
    fp32 = parse_job({"model": "gpt3-125m", "training": {"precision": "fp32", "optimizer": "sgd"}})
    assert checkpoint_bytes(fp32) == pytest.approx(fp32.model.num_params * (4 + 0 + 4))


def test_a_move_costs_save_load_startup_and_warmup_with_no_cap() -> None:
    storage = Storage(read_gbyte_s_per_node=5.0, write_gbyte_s_per_node=2.5)
    size_gb = checkpoint_bytes(LLAMA_70B) / 1e9
    one_node = restart_s(LLAMA_70B, storage, 1, step_s=10.0)
    assert one_node == pytest.approx(STARTUP_S + size_gb / 2.5 + size_gb / 5.0 + WARMUP_STEPS * 10.0)
    assert one_node > 500  # no 250 s cap: a terabyte over one node's storage link takes minutes
    # More nodes share the I/O, until the file system's total limits them.
    assert restart_s(LLAMA_70B, storage, 8, step_s=10.0) < one_node / 4
    capped = Storage(read_gbyte_s_per_node=5.0, write_gbyte_s_per_node=2.5, read_gbyte_s_total=10.0,
                     write_gbyte_s_total=10.0)  # fmt: skip
    assert restart_s(LLAMA_70B, capped, 64, 10.0) == pytest.approx(STARTUP_S + 2 * size_gb / 10.0 + 30.0)
    # A small model's restart is mostly start-up.
    assert restart_s(SMALL, Storage(), 1, 0.1) < STARTUP_S + 2


def test_the_cluster_file_states_its_storage_and_bad_values_name_the_field() -> None:
    base = {"node_groups": [{"gpu": "A100-SXM4-80GB", "num_nodes": 2}]}
    assert parse_cluster(base).storage == Storage()
    given = parse_cluster({**base, "storage": {"read_gbyte_s_per_node": 40, "write_gbyte_s_total": 100}}).storage
    assert given.read_gbyte_s(4) == 160 and given.write_gbyte_s(4) == 20.0 and given.write_gbyte_s(100) == 100
    with pytest.raises(ValueError, match=r"storage\.read_gbyte_s_per_node must be a positive number"):
        parse_cluster({**base, "storage": {"read_gbyte_s_per_node": 0}})
    with pytest.raises(ValueError, match="storage: unknown field"):
        parse_cluster({**base, "storage": {"iops": 5}})


def test_preemptible_and_max_moves_are_checked_spec_fields() -> None:
    spec = parse_job({"model": "gpt3-125m", "scheduling": {"preemptible": False, "max_moves": 2}})
    assert spec.scheduling.preemptible is False and spec.scheduling.max_moves == 2
    assert parse_job(spec.to_mapping()) == spec
    for bad, field in (({"preemptible": "no"}, "scheduling.preemptible"), ({"max_moves": -1}, "scheduling.max_moves")):
        with pytest.raises(ValueError, match=field):
            parse_job({"model": "gpt3-125m", "scheduling": bad})
