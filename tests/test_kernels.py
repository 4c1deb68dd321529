"""The kernel model and the measured throughput tables it reads."""

from __future__ import annotations

import math

import pytest

from frenzy_opt.hardware.gpus import load_gpus, lookup_gpu
from frenzy_opt.hardware.throughput import FORMATS, achievable
from frenzy_opt.prediction import kernels

GPUS = [gpu for gpu in load_gpus().values() if gpu.architecture != "cpu"]


def _peak(gpu: object, fmt: str) -> float | None:
    return getattr(gpu, f"{fmt}_tflops")  # type: ignore[no-any-return]


@pytest.mark.parametrize("gpu", GPUS, ids=[g.name for g in GPUS])
def test_every_gpu_type_has_achievable_rates_below_its_peak(gpu: object) -> None:
    """Every format with tensor cores has a rate, measured or derived; none is above its spec peak by more
    than GeForce boost clocks give (the tables note 4-9 %), none below a fifth of it."""
    rates = achievable(gpu)  # type: ignore[arg-type]
    assert rates.hbm_gbyte_s > 0 and gpu.sm_count  # type: ignore[attr-defined]
    for fmt in FORMATS:
        peak = _peak(gpu, fmt)
        if peak:
            assert fmt in rates.matmul_tflops, fmt
            assert 0.2 * peak <= rates.matmul_tflops[fmt] <= 1.12 * peak, (fmt, rates.matmul_tflops[fmt], peak)


def test_measured_and_derived_figures_are_told_apart() -> None:
    h100 = achievable(lookup_gpu("H100-SXM5-80GB"))
    assert not h100.derived and h100.matmul("bf16") < 0.9 * 989.4  # measured, well under the dense peak
    a30 = achievable(lookup_gpu("A30"))
    assert {"hbm_gbyte_s", "matmul_tflops.bf16"} <= a30.derived  # no public measurement: from a sibling
    b200 = achievable(lookup_gpu("B200-SXM-180GB"))
    assert "hbm_gbyte_s" in b200.derived and "matmul_tflops.bf16" not in b200.derived
    # fp32 training runs on tf32 tensor cores where they exist, else on the CUDA cores.
    a100, t4 = achievable(lookup_gpu("A100-SXM4-80GB")), achievable(lookup_gpu("T4"))
    assert a100.matmul("fp32") == a100.matmul_tflops["tf32"]
    assert t4.matmul("fp32") == t4.matmul_tflops["fp32"]


def _gemm(m: float, n: float, k: float, gpu_name: str = "H100-SXM5-80GB", fmt: str = "bf16") -> float:
    gpu = lookup_gpu(gpu_name)
    rates = achievable(gpu)
    return kernels.gemm_s(m, n, k, tflops=rates.matmul(fmt), hbm_gbyte_s=rates.hbm_gbyte_s, gpu=gpu,
                          operand_bytes=2, out_bytes=2)  # fmt: skip


def test_a_large_well_shaped_gemm_runs_at_the_measured_rate() -> None:
    gpu = lookup_gpu("H100-SXM5-80GB")
    # 132 SMs x 128 x 256 tiles: 8 waves exactly.
    m, n, k = 128 * 132, 256 * 8, 8192
    seconds = _gemm(m, n, k)
    ideal = 2 * m * n * k / (achievable(gpu).matmul("bf16") * 1e12)
    assert seconds == pytest.approx(ideal + kernels.LAUNCH_S, rel=1e-9)


def test_tile_and_wave_quantization() -> None:
    """Four full waves of 128 x 256 tiles on 132 SMs; four more tiles cost a fifth wave; a partial tile costs
    a whole one."""
    full = _gemm(128 * 132, 256 * 4, 4096)
    one_more = _gemm(128 * 133, 256 * 4, 4096)
    assert one_more - kernels.LAUNCH_S == pytest.approx(5 / 4 * (full - kernels.LAUNCH_S), rel=1e-9)
    assert _gemm(128 * 132 - 64, 256 * 4, 4096) == pytest.approx(full, rel=1e-9)


def test_few_tiles_split_k_and_small_gemms_are_memory_or_launch_bound() -> None:
    gpu = lookup_gpu("H100-SXM5-80GB")
    rates = achievable(gpu)
    # One output tile, a long k: split over the idle SMs, far faster than one SM alone.
    one_sm = 2 * 128 * 256 * 65536 / (rates.matmul("bf16") * 1e12 / gpu.sm_count)  # type: ignore[operator]
    assert _gemm(128, 256, 65536) < one_sm / 20
    # A thin GEMM (a token's worth of rows over a large weight) moves its weight from memory.
    m, n, k = 8, 8192, 8192
    assert _gemm(m, n, k) == pytest.approx((m * k + k * n + m * n) * 2 / (rates.hbm_gbyte_s * 1e9) + kernels.LAUNCH_S)
    # A tiny GEMM costs at least a launch.
    assert _gemm(16, 16, 16) >= kernels.LAUNCH_S
    assert kernels.gemm_s(0, 5, 5, tflops=1, hbm_gbyte_s=1, gpu=gpu, operand_bytes=2, out_bytes=2) == 0.0


def test_same_gemm_on_an_older_gpu_is_slower_by_its_measured_rates() -> None:
    big = (8192, 8192, 8192)
    ratio = _gemm(*big, gpu_name="A100-SXM4-80GB") / _gemm(*big)
    h100, a100 = achievable(lookup_gpu("H100-SXM5-80GB")), achievable(lookup_gpu("A100-SXM4-80GB"))
    measured = h100.matmul("bf16") / a100.matmul("bf16")
    assert math.isclose(ratio, measured, rel_tol=0.05)


def test_flash_attention_rates_per_runtime_kernel_and_reference() -> None:
    h100 = lookup_gpu("H100-SXM5-80GB")
    # Megatron (Transformer Engine) runs cuDNN's kernel on Hopper: its forward rate times FA2's fwd+bwd/fwd.
    cudnn = kernels.flash_tflops(h100, "megatron", 128, 4096, "bf16")
    fa2 = kernels.flash_tflops(h100, "fsdp2", 128, 4096, "bf16")
    assert cudnn == pytest.approx(518.0 * kernels.FWD_BWD_OVER_FWD)  # causal, head dim 128, seq 4k
    assert fa2 == pytest.approx(294.0)  # measured forward + backward, causal, head dim 128, seq 4k
    assert kernels.flash_tflops(h100, "fsdp2", 128, 32768, "bf16") == pytest.approx(328.0)  # the 16k point
    # A40 has no table: its matmul rate times A100's FA2 / matmul ratio.
    a40, a100 = lookup_gpu("A40"), lookup_gpu("A100-SXM4-80GB")
    expected = achievable(a40).matmul("bf16") * 173.0 / achievable(a100).matmul("bf16")
    assert kernels.flash_tflops(a40, "fsdp2", 128, 4096, "bf16") == pytest.approx(expected)


def test_geforce_boards_stage_intra_node_collectives_through_the_host() -> None:
    """Without peer-to-peer (GeForce boards) an intra-node all-reduce reaches the measured host-staged share of
    the PCIe link; a P2P board on the same PCIe generation reaches its own class's measured share instead."""
    from frenzy_opt.hardware.topology import HOST_STAGED_FRACTION, Links
    from frenzy_opt.prediction.comms import collective_s

    staged = Links.for_gpu(lookup_gpu("RTX-3090"), gpus_per_node=4, intra_node="pcie")
    direct = Links.for_gpu(lookup_gpu("RTX-A6000"), gpus_per_node=4, intra_node="pcie")
    assert staged.host_staged and not direct.host_staged
    assert staged.intra_node_gbyte_s == direct.intra_node_gbyte_s  # both PCIe Gen4 x16
    assert staged.intra_node_share == HOST_STAGED_FRACTION < direct.intra_node_share
    ratio = collective_s(staged, 1e9, 4, 1, 1.0) / collective_s(direct, 1e9, 4, 1, 1.0)
    assert ratio == pytest.approx(direct.intra_node_share / HOST_STAGED_FRACTION)
    # An NVLink bridge stated for the server lifts the staging.
    bridged = Links.for_gpu(lookup_gpu("RTX-3090"), intra_node="pcie", intra_node_spec_gbyte_s=112.5)
    assert not bridged.host_staged


def test_small_collectives_are_not_free() -> None:
    """Every tensor-parallel all-reduce and pipeline send pays the measured small-message latency of its link:
    NVLink inside an H100 node, PCIe on a PCIe board, the network across nodes."""
    from frenzy_opt.core.spec import parse_job
    from frenzy_opt.hardware.topology import NETWORK_LATENCY_S, NVLINK_LATENCY_S, PCIE_LATENCY_S, Links
    from frenzy_opt.prediction.comms import latency_s
    from frenzy_opt.prediction.stepterms import step_terms
    from frenzy_opt.prediction.steptime import shipped_model

    tiny = {"num_layers": 4, "hidden_size": 64, "ffn_hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1024}
    job = parse_job({"model": tiny, "training": {"seq_len": 128, "global_batch_size": 8, "micro_batch_size": 1},
                     "parallel": {"tp": 2, "pp": 2, "dp": 1}})  # fmt: skip
    terms = step_terms(job)
    tp_calls, _, _, sends = terms.collective_calls
    assert tp_calls == 2 * 4  # 2 layers per stage x 4 all-reduces (two forward, two backward)
    assert sends == 2
    h100 = lookup_gpu("H100-SXM5-80GB")
    step = terms.evaluate(h100, Links.for_gpu(h100), shipped_model())
    slots = terms.microbatches + 1
    assert step.intra_node_comm_s >= slots * tp_calls * NVLINK_LATENCY_S
    assert step.pipeline_p2p_s >= slots * sends * NVLINK_LATENCY_S
    # The link decides: a PCIe board (its default intra-node link, no override) and a group across nodes.
    l4 = Links.for_gpu(lookup_gpu("L4"), inter_node_gbit_s=100, gpus_per_node=4)
    assert l4.pcie and not l4.host_staged and latency_s(l4, 4, 1) == PCIE_LATENCY_S
    assert Links.for_gpu(lookup_gpu("RTX-4090"), gpus_per_node=4).host_staged
    assert latency_s(l4, 8, 1) == NETWORK_LATENCY_S and latency_s(l4, 1, 1) == 0.0


def test_an_moe_layers_experts_are_one_gemm_shape_with_a_count() -> None:
    """Alike experts are priced once with their count, so 4,096 experts cost no more to price than 8 (the API
    fuzzer's 4,096-expert spec timed a plan search out when every expert was a GEMM of its own)."""
    from frenzy_opt.core.spec import parse_job
    from frenzy_opt.prediction.stepterms import step_terms

    def terms(experts: int) -> object:
        model = {"num_layers": 2, "hidden_size": 256, "ffn_hidden_size": 512, "num_attention_heads": 4,
                 "vocab_size": 1024, "num_experts": experts, "moe_top_k": 2, "moe_ffn_hidden_size": 128}  # fmt: skip
        return step_terms(parse_job({"model": model, "training": {"seq_len": 256, "global_batch_size": 8}}))

    few, many = terms(8), terms(4096)
    assert len(few.linear_gemms) == len(many.linear_gemms) == 3 * 5  # type: ignore[attr-defined]
    # Each expert's forward GEMM: tokens x top_k / experts rows, counted once per local expert and layer.
    m, _, _, count = many.linear_gemms[6]  # type: ignore[attr-defined]
    assert count == 2 * 4096 and m == pytest.approx(256 * 2 / 4096)
