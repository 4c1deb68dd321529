"""The trace path: the allocation recorder on hand-computable cases, fake vs real execution, and trace_job on
torchtitan (fsdp2) and megatron-core (megatron) for dp/tp/sp/pp/cp/ep layouts of tiny models."""

from __future__ import annotations

import contextlib

import pytest
import runtimes  # tests/ is on sys.path

pytestmark = runtimes.needs_runtimes

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from frenzy_opt.core.spec import JobSpec, ParallelConfig, TrainingConfig  # noqa: E402
from frenzy_opt.models.arch import ModelArch  # noqa: E402
from frenzy_opt.prediction.marp.allocator.replay import MemEvent  # noqa: E402
from frenzy_opt.tracing import AllocationRecorder, Trace, trace_job  # noqa: E402

TINY = ModelArch(num_layers=2, hidden_size=128, ffn_hidden_size=256, num_attention_heads=4, num_kv_heads=2,
                 vocab_size=512)  # fmt: skip
TINY_MOE = ModelArch(num_layers=2, hidden_size=128, ffn_hidden_size=256, num_attention_heads=4, num_kv_heads=2,
                     vocab_size=512, num_experts=4, moe_top_k=2)  # fmt: skip


def _job(runtime: str, arch: ModelArch = TINY, **parallel: object) -> JobSpec:
    zero = parallel.pop("zero_stage", 3 if runtime == "fsdp2" else 0)
    return JobSpec(
        name="tiny",
        model=arch,
        training=TrainingConfig(seq_len=64, micro_batch_size=2, global_batch_size=8, runtime=runtime),
        parallel=ParallelConfig(zero_stage=zero, **parallel),  # type: ignore[arg-type]
    )


def _linear_step(fake: bool) -> Trace:
    mode = FakeTensorMode() if fake else contextlib.nullcontext()
    with mode:
        recorder = AllocationRecorder()
        with recorder:
            lin = torch.nn.Linear(64, 32)
            recorder.mark_setup_end()
            recorder.set_phase("forward")
            x = torch.randn(16, 64)
            loss = lin(x).sum()
            recorder.set_phase("backward")
            loss.backward()
            del x, loss
        return recorder.trace()


@pytest.mark.parametrize("fake", [True, False])
def test_recorder_linear_by_hand(fake: bool) -> None:
    trace = _linear_step(fake)
    weight, bias, x, y, loss = 32 * 64 * 4, 32 * 4, 16 * 64 * 4, 16 * 32 * 4, 4
    assert trace.setup_bytes == weight + bias
    assert trace.phase_peaks["forward"] == weight + bias + x + y + loss
    # y is freed once summed (sum's backward needs no input); backward: the loss's unit gradient, then the
    # weight and bias gradients while x (saved by the linear) is alive
    assert trace.peak_bytes == weight + bias + x + loss + 4 + weight + bias
    assert trace.peak_phase == "backward"
    assert trace.end_bytes == 2 * (weight + bias)  # weights and their .grad
    allocs = [e for e in trace.events if e.action == "alloc"]
    assert [e.size for e in allocs[:2]] == [weight, bias]
    assert all(isinstance(e, MemEvent) and e.stream == 0 for e in trace.events)


def test_recorder_views_resize_and_frees() -> None:
    with FakeTensorMode():
        recorder = AllocationRecorder("forward")
        with recorder:
            a = torch.empty(1000, dtype=torch.float32)
            b = a.view(10, 100)[2:5]  # a view: no allocation
            a.untyped_storage().resize_(0)  # Megatron's deallocate_output_tensor
            del a, b
            c = torch.empty(10, dtype=torch.bfloat16)
            del c
        trace = recorder.trace()
    assert [(e.action, e.size) for e in trace.events] == [("alloc", 4000), ("free", 4000), ("alloc", 20), ("free", 20)]
    assert trace.peak_bytes == 4000 and trace.end_bytes == 0


def test_trace_replay_matches_events() -> None:
    events = [MemEvent("alloc", 0, 100, "setup"), MemEvent("alloc", 1, 50, "forward:0"),
              MemEvent("free", 1, 50, "backward:0"), MemEvent("alloc", 2, 10, "optimizer")]  # fmt: skip
    trace = Trace.from_events(events, setup_end=1)
    assert (trace.peak_bytes, trace.peak_phase, trace.setup_bytes, trace.end_bytes) == (150, "forward:0", 100, 110)
    assert trace.phase_peaks == {"setup": 100, "forward": 150, "backward": 100, "optimizer": 110}


def _real_vs_fake_model_step(fake: bool) -> int:
    torch.manual_seed(0)
    mode = FakeTensorMode() if fake else contextlib.nullcontext()
    with mode:
        recorder = AllocationRecorder()
        with recorder:
            model = torch.nn.Sequential(
                torch.nn.Embedding(256, 64), torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256)
            )
            opt = torch.optim.AdamW(model.parameters(), foreach=False)
            recorder.mark_setup_end()
            for _ in range(2):
                tokens = torch.randint(0, 256, (4, 32))
                logits = model(tokens)
                loss = torch.nn.functional.cross_entropy(logits.view(-1, 256), tokens.view(-1))
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                del tokens, logits, loss
        return recorder.trace().peak_bytes


def test_fake_peak_equals_real_execution() -> None:
    """The recorder sees the same storages whether the step runs for real or under FakeTensorMode."""
    assert _real_vs_fake_model_step(fake=True) == _real_vs_fake_model_step(fake=False)


def test_fsdp2_dp_trace() -> None:
    result = trace_job(_job("fsdp2", dp=2))
    stage = result.stages[0]
    assert stage.peak_allocated_bytes > stage.model_state_bytes > stage.setup_bytes > 0
    # fully sharded fp32 parameters, their fp32 grads and Adam's two moments: ~16 bytes per parameter / dp
    params = TINY.num_params
    assert 0.9 * 16 * params / 2 < stage.model_state_bytes < 1.3 * 16 * params / 2
    assert "events" not in str(result.to_dict())
    assert stage.trace is not None and stage.trace.events


@pytest.mark.slow
@pytest.mark.parametrize(
    "parallel",
    [dict(dp=1), dict(dp=2, tp=2), dict(dp=2, tp=2, sequence_parallel=True), dict(dp=2, pp=2),
     dict(dp=2, recompute="full"), dict(dp=2, recompute="selective")],
)  # fmt: skip
def test_fsdp2_layouts(parallel: dict[str, object]) -> None:
    result = trace_job(_job("fsdp2", **parallel))
    assert all(s.peak_allocated_bytes > s.model_state_bytes > 0 for s in result.stages)
    assert len(result.stages) == (2 if parallel.get("pp") == 2 else 1)


def test_fsdp2_tp_halves_states() -> None:
    one = trace_job(_job("fsdp2", dp=2)).stages[0]
    two = trace_job(_job("fsdp2", dp=2, tp=2)).stages[0]
    assert two.model_state_bytes < 0.7 * one.model_state_bytes


def test_megatron_dp_trace() -> None:
    result = trace_job(_job("megatron", dp=2, zero_stage=1))
    stage = result.stages[0]
    assert stage.peak_allocated_bytes > stage.model_state_bytes > 0
    params = TINY.num_params
    # bf16 weights (2) + fp32 grad buffer (4) + fp32 master, exp_avg, exp_avg_sq sharded over dp=2 (12 / 2)
    assert 0.9 * 12 * params < stage.model_state_bytes < 1.3 * 12 * params


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arch", "parallel"),
    [(TINY, dict(dp=1)), (TINY, dict(dp=2, tp=2, zero_stage=1)), (TINY, dict(tp=2, sequence_parallel=True)),
     (TINY, dict(pp=2, dp=2)), (TINY, dict(cp=2)), (TINY, dict(dp=2, recompute="full")),
     (TINY, dict(dp=2, recompute="selective", attention="eager")), (TINY_MOE, dict(dp=2, ep=2)),
     (TINY_MOE, dict(dp=2, tp=2, ep=2, sequence_parallel=True))],
)  # fmt: skip
def test_megatron_layouts(arch: ModelArch, parallel: dict[str, object]) -> None:
    result = trace_job(_job("megatron", arch, **parallel))
    assert all(s.peak_allocated_bytes > s.model_state_bytes > 0 for s in result.stages)


def test_megatron_full_recompute_saves_memory() -> None:
    none = trace_job(_job("megatron", dp=2)).stages[0]
    full = trace_job(_job("megatron", dp=2, recompute="full")).stages[0]
    # The first Megatron trace of a process also holds one 4-byte int buffer Megatron-core creates once per
    # process and keeps (a later trace finds it made): the model states agree up to such process-level bytes,
    # whichever of the two traces came first in this worker.
    assert abs(full.model_state_bytes - none.model_state_bytes) <= 64
    assert full.peak_allocated_bytes < none.peak_allocated_bytes


@pytest.mark.parametrize(
    ("runtime", "parallel"),
    [("megatron", dict(dp=2, tp=2, zero_stage=1)), ("fsdp2", dict(dp=2, tp=2)),
     pytest.param("megatron", dict(pp=2), marks=pytest.mark.slow),
     pytest.param("fsdp2", dict(pp=2), marks=pytest.mark.slow)],
)  # fmt: skip
def test_runtime_fake_trace_equals_real_execution(runtime: str, parallel: dict[str, object]) -> None:
    """The whole runtime step executed for real on the CPU records the peak the fake trace records (up to a
    few scalars FakeTensorMode keeps differently)."""
    job = _job(runtime, **parallel)
    fake, real = trace_job(job, fake=True), trace_job(job, fake=False)
    for f, r in zip(fake.stages, real.stages, strict=True):
        assert abs(f.peak_allocated_bytes - r.peak_allocated_bytes) <= 64
        assert abs(f.model_state_bytes - r.model_state_bytes) <= 64
        assert f.peak_phase == r.peak_phase


def test_trace_job_rejects_other_runtimes() -> None:
    with pytest.raises(ValueError, match="runtime"):
        trace_job(_job("hf"))


def test_recorder_ignores_meta_tensors() -> None:
    with FakeTensorMode():
        recorder = AllocationRecorder()
        with recorder:
            with torch.device("meta"):
                lin = torch.nn.Linear(256, 256)
            weights = [torch.empty_like(p, device="cpu") for p in lin.parameters()]
            del lin
        trace = recorder.trace()
        del weights
    assert trace.peak_bytes == trace.end_bytes == (256 * 256 + 256) * 4
