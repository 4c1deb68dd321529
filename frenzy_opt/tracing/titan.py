"""The fsdp2 runtime traced on torchtitan 0.3.0: its Llama3 model, parallelize function, AC, optimizer, loss
and ``Trainer.train_step``.

The rank is built as ``Trainer.__init__`` builds it (meta-device model from a ``Llama3Model.Config`` made from
the job's architecture, ``parallelize_llama`` = TP/SP plan, activation checkpointing, ``fully_shard`` with
``MixedPrecisionPolicy(bf16, fp32)``; ``to_empty`` + ``init_weights``; ``OptimizersContainer`` AdamW;
``ChunkedLossWrapper(CrossEntropyLoss)`` as in the llama3 registry configs), then torchtitan's own
``Trainer.train_step`` runs on a trainer object that carries only the attributes that method reads (data
loader, checkpointer, metrics and LR logging are not built). Pipeline stages are the rank's slice of the
model cut with torchtitan's own ``_generate_llm_fqn_per_model_part`` / ``_split_module``, run in 1F1B order
by :func:`frenzy_opt.tracing.common.one_f_one_b` (torch.distributed.pipelining's stage needs shape
metadata from its peers, which the fake backend cannot deliver); see docs/trace-path.md.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from frenzy_opt.core.enums import Precision
from frenzy_opt.core.spec import JobSpec
from frenzy_opt.tracing import common
from frenzy_opt.tracing.recorder import AllocationRecorder

RECOMPUTE_MODES = ("none", "selective", "selective_layer", "full")
"""``selective`` = torchtitan's op-level SAC (``SelectiveAC``: save matmul outputs every second mm,
attention and reduce-scatter outputs); ``selective_layer`` = full AC of every ``ac_layer_freq``-th block
(torchtitan < 0.3's ``selective_ac_option=<int>``, assembled from 0.3.0's ``FullAC`` wrapper)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TitanOptions:
    recompute: str | None = None
    """One of :data:`RECOMPUTE_MODES`; None = the job's ``parallel.recompute``."""
    ac_layer_freq: int = 2
    chunked_loss: bool = True
    """torchtitan's llama3 configs wrap the loss in ``ChunkedLossWrapper`` (8 chunks of lm_head + CE);
    False = plain ``CrossEntropyLoss`` on full logits."""
    reshard_after_forward: str = "default"
    spmd_backend: str = "partial_dtensor"
    """torchtitan 0.3.0's default "spmd_types" (plain local tensors with SPMD type annotations) fails in
    torch 2.13's ``fully_shard`` for dp > 1 ("When dp_mesh_dims is provided, all parameters must be DTensors
    on the full SPMD mesh", _fsdp_param.py); "full_dtensor" runs dp and tp but not sequence parallelism
    ("Expected param's DTensor mesh to be the same mesh passed to fully_shard"); "partial_dtensor" (DTensor
    on the model-parallel axes, ``fully_shard`` on the dp mesh: the FSDP2 + TP composition of torchtitan
    before 0.3) runs every layout traced here."""


def _stub_triton_kernels() -> None:
    """``torchtitan.distributed.minimal_async_ep.kernels`` imports triton at module level (it holds the
    Triton kernels of the async expert-parallel dispatcher, not used here): without triton a stub module
    stands in, whose kernels raise if called."""
    name = "torchtitan.distributed.minimal_async_ep.kernels"
    if name in sys.modules or importlib.util.find_spec("triton") is not None:
        return
    stub = types.ModuleType(name)

    def __getattr__(attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)

        def kernel(*_: Any, **__: Any) -> Any:
            raise RuntimeError(f"{name}.{attr}: a Triton kernel, unavailable on the CPU")

        return kernel

    stub.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules[name] = stub


_IMPORTED: dict[str, Any] = {}


def import_torchtitan() -> dict[str, Any]:
    """Import the torchtitan modules used, with torchtitan's device chosen as the CPU.

    ``torchtitan.tools.utils`` picks its device at import (``_get_available_device_type() or "cuda"``):
    on a CPU-only machine that would be "cuda", so the lookup answers "cpu" while torchtitan is imported.
    """
    if _IMPORTED:
        return _IMPORTED
    import torch._utils as tutils

    _stub_triton_kernels()
    original = tutils._get_available_device_type
    tutils._get_available_device_type = lambda: "cpu"
    try:
        import torchtitan.components.loss as loss
        import torchtitan.components.optimizer as optimizer
        import torchtitan.distributed.activation_checkpoint as ac
        import torchtitan.distributed.pipeline_parallel as pipeline
        import torchtitan.distributed.utils as dist_utils
        import torchtitan.models.llama3 as llama3
        import torchtitan.trainer as trainer
        from torchtitan.config import ParallelismConfig, TrainingConfig
        from torchtitan.distributed import ParallelDims
        from torchtitan.models.common import attention
        from torchtitan.models.common import config_utils as cu
    finally:
        tutils._get_available_device_type = original
    _IMPORTED.update(
        loss=loss, optimizer=optimizer, ac=ac, pipeline=pipeline, dist_utils=dist_utils, llama3=llama3,
        trainer=trainer, ParallelismConfig=ParallelismConfig, TrainingConfig=TrainingConfig,
        ParallelDims=ParallelDims, attention=attention, config_utils=cu,
    )  # fmt: skip
    return _IMPORTED


def check_supported(job: JobSpec) -> None:
    arch, p, t = job.model, job.parallel, job.training
    problems = []
    if arch.mlp != "swiglu" or arch.norm != "rmsnorm" or arch.position_embedding != "rope":
        problems.append("torchtitan's Llama3 is SwiGLU + RMSNorm + RoPE")
    if arch.qkv_bias or arch.linear_bias:
        problems.append("torchtitan's Llama3 has no biases")
    if arch.is_moe:
        problems.append("MoE is traced on megatron (torchtitan's MoE models are deepseek_v3/qwen3)")
    if t.optimizer not in ("adamw", "adam"):
        problems.append("optimizer must be adamw/adam")
    if t.precision not in ("bf16", "fp32"):
        problems.append("precision must be bf16 or fp32")
    if p.vpp != 1:
        problems.append("vpp must be 1")
    if p.ep != 1:
        problems.append("ep must be 1 (dense model)")
    if p.cp > 1:
        # torchtitan's CP wraps SDPA in DTensor ring attention, which has no sharding strategy for the CPU
        # flash kernel (NotImplementedError: aten._scaled_dot_product_flash_attention_for_cpu.default does
        # not have a sharding strategy registered; torch/distributed/tensor/_sharding_prop.py).
        problems.append("cp > 1 is not traced on torchtitan (ring attention has no CPU flash kernel)")
    if p.sequence_parallel and p.tp == 1:
        problems.append("sequence_parallel needs tp > 1")
    if problems:
        raise ValueError(f"fsdp2 trace of {job.name}: " + "; ".join(problems))


def model_config(job: JobSpec) -> Any:
    """A ``Llama3Model.Config`` of the job's architecture (as the llama3 registry builds its flavors), with
    torchtitan's ``ScaledDotProductAttention`` as the inner attention (see docs/trace-path.md)."""
    tt = import_torchtitan()
    llama3, attention = tt["llama3"], tt["attention"]
    common_mod = importlib.import_module("torchtitan.models.common")
    arch = job.model
    dim, heads = arch.hidden_size, arch.num_attention_heads
    layers = llama3._build_llama3_layers(
        fuse_qkv=True,
        n_layers=arch.num_layers,
        dim=dim,
        n_heads=heads,
        n_kv_heads=arch.num_kv_heads,
        hidden_dim=arch.ffn_hidden_size,
        rope=common_mod.ComplexRoPE.Config(
            # torchtitan's trainer resizes every RoPE cache to ``training.seq_len``
            # (``Decoder.Config.update_from_config`` with a ``Trainer.Config``); the tracer hands that method
            # a plain namespace, so it sizes them here.
            dim=arch.kv_channels,
            max_seq_len=job.training.seq_len,
            theta=500000,
            scaling="none",
        ),
        attn_backend="flex",
    )
    for layer in layers:
        layer.attention.inner_attention = attention.ScaledDotProductAttention.Config()
        if arch.head_dim is not None and arch.head_dim != dim // heads:
            raise ValueError("torchtitan llama3 uses head_dim = dim / n_heads")
    vocab = arch.vocab_size
    return llama3.Llama3Model.Config(
        dim=dim,
        vocab_size=vocab,
        enable_weight_tying=arch.tied_embeddings,
        tok_embeddings=common_mod.Embedding.Config(
            num_embeddings=vocab, embedding_dim=dim, param_init=llama3._EMBEDDING_INIT
        ),
        norm=common_mod.RMSNorm.Config(normalized_shape=dim, param_init=llama3._NORM_INIT),
        lm_head=common_mod.Linear.Config(
            in_features=dim, out_features=vocab, param_init=llama3._output_linear_init(dim)
        ),
        layers=layers,
    )


def _ac_config(tt: dict[str, Any], mode: str) -> Any:
    ac = tt["ac"]
    if mode == "none":
        return None
    if mode == "full":
        return ac.FullAC.Config()
    if mode == "selective":
        return ac.SelectiveAC.Config()
    raise ValueError(mode)


def _apply_layer_ac(tt: dict[str, Any], model: torch.nn.Module, freq: int) -> None:
    """Full AC on every ``freq``-th block, with torchtitan's ``FullAC`` block wrapper."""
    policy = tt["ac"].FullAC(tt["ac"].FullAC.Config())
    layers = model.get_submodule("layers")
    for index, (name, block) in enumerate(list(layers.named_children())):
        if index % freq == 0:
            layers.register_module(name, policy._wrap_block(block, base_fqn=f"layers.{name}"))


def _configs(job: JobSpec, opts: TitanOptions, microbatches: int) -> tuple[Any, Any]:
    tt = import_torchtitan()
    t, p = job.training, job.parallel
    training = tt["TrainingConfig"](
        local_batch_size=t.micro_batch_size,
        global_batch_size=t.micro_batch_size * p.dp * microbatches,
        seq_len=t.seq_len,
        dtype="float32",
        mixed_precision_param="bfloat16" if t.precision == Precision.BF16 else "float32",
        disable_cuda_graphs=True,
    )
    parallelism = tt["ParallelismConfig"](
        data_parallel_shard_degree=p.dp,
        tensor_parallel_degree=p.tp,
        enable_sequence_parallel=p.sequence_parallel,
        pipeline_parallel_degree=p.pp,
        context_parallel_degree=p.cp,
        fsdp_reshard_after_forward=opts.reshard_after_forward,
        spmd_backend=opts.spmd_backend,
    )
    return training, parallelism


class _Metrics:
    def should_log(self, step: int) -> bool:
        return False


class _NoCheckpoint:
    def maybe_wait_for_staging(self) -> None:
        pass


def _rank_of_stage(tt: dict[str, Any], job: JobSpec, stage: int) -> int:
    p = job.parallel
    world = p.dp * p.tp * p.pp * p.cp
    return stage * (world // p.pp)


def trace_stage(
    job: JobSpec,
    stage: int,
    *,
    steps: int = 2,
    opts: TitanOptions | None = None,
    max_microbatches: int | None = None,
    fake: bool = True,
) -> common.StageTrace:
    """Build pipeline stage ``stage``'s rank (all other coordinates 0) on torchtitan and record ``steps``
    training steps under ``FakeTensorMode``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    check_supported(job)
    opts = opts or TitanOptions()
    tt = import_torchtitan()
    p = job.parallel
    mode = opts.recompute or p.recompute
    if mode not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {mode!r}")
    total_mb, run_mb = common.step_microbatches(job, max_microbatches)
    world = p.dp * p.tp * p.pp * p.cp
    rank = _rank_of_stage(tt, job, stage)
    training, parallelism = _configs(job, opts, run_mb if p.pp == 1 else 1)
    notes: list[str] = []
    with contextlib.ExitStack() as stack:
        # As torchtitan's init_distributed (restored afterwards).
        stack.enter_context(torch.autograd.set_multithreading_enabled(False))
        stack.enter_context(common.fake_process_group(rank, world))
        # The device mesh is built from real tensors (its rank layout), before fake mode.
        parallel_dims = tt["ParallelDims"].from_config(parallelism, world)
        parallel_dims.build_mesh()
        if p.pp > 1:
            assert parallel_dims.get_mesh("pp").get_local_rank() == stage
        stack.enter_context(common.real_device_meshes())
        stack.enter_context(common.fused_rms_norm())
        if fake:  # fake=False executes for real (small models: the check that the fake trace is right)
            stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
            stack.enter_context(common.FakeScalars())
        recorder = AllocationRecorder("setup")
        with recorder, common.phase_hooks(recorder) as set_phase:
            tt["dist_utils"].set_spmd_backend(parallelism.spmd_backend)
            cfg = model_config(job)
            tt_job = types.SimpleNamespace(parallelism=parallelism, training=training)
            cfg.update_from_config(config=tt_job)
            with torch.device("meta"):
                model = cfg.build()
            if p.pp > 1:
                names = tt["pipeline"]._generate_llm_fqn_per_model_part(
                    p.pp, job.model.num_layers, parallelism.pipeline_parallel_first_stage_less_layers,
                    parallelism.pipeline_parallel_last_stage_less_layers,
                )  # fmt: skip
                model = tt["pipeline"]._split_module(model, names[stage])
                notes.append(f"stage modules: {names[stage]}")
            ac_config = _ac_config(tt, mode) if mode != "selective_layer" else None
            if mode == "selective_layer":
                _apply_layer_ac(tt, model, opts.ac_layer_freq)
            model = tt["llama3"].parallelize_llama(
                model,
                parallel_dims=parallel_dims,
                training=training,
                parallelism=parallelism,
                compile_config=importlib.import_module("torchtitan.config").CompileConfig(),
                ac_config=ac_config,
                dump_folder="",
            )
            # init_weights is not run: values do not matter under fake tensors, and its trunc_normal_ on a
            # DTensor reads a scalar (.item()), which fake tensors cannot answer. to_empty allocates every
            # parameter and buffer (RoPE tables included) as init would leave them.
            model.to_empty(device="cpu")
            model.train()
            loss_cfg = tt["loss"].CrossEntropyLoss.Config(global_vocab_size=job.model.vocab_size)
            if opts.chunked_loss:
                loss_cfg = tt["loss"].ChunkedLossWrapper.Config(loss_fn=loss_cfg)
            loss_fn = loss_cfg.build(compile_config=importlib.import_module("torchtitan.config").CompileConfig())
            last = stage == p.pp - 1
            if isinstance(loss_fn, tt["loss"].ChunkedLossWrapper) and last:
                loss_fn.set_lm_head(model.lm_head)
                model._skip_lm_head = True
            optimizers = tt["optimizer"].default_adamw(lr=8e-4)
            containers = optimizers.build(model_parts=[model])
            recorder.mark_setup_end()

            def forward_hook(_module: Any, _args: Any) -> None:
                set_phase(f"forward:{counter['forward']}")
                counter["forward"] += 1

            counter = {"forward": 0}
            model.register_forward_pre_hook(forward_hook)
            trainer_cls = tt["trainer"].Trainer
            if p.pp == 1:
                shell = _trainer_shell(
                    tt, job, model, loss_fn, containers, parallel_dims, training, parallelism, run_mb
                )
                for _ in range(steps):
                    counter["forward"] = 0
                    trainer_cls.train_step(shell, _batches(job, run_mb))
            else:
                for _ in range(steps):
                    counter["forward"] = 0
                    _pipeline_step(tt, job, stage, model, loss_fn, containers, parallel_dims, run_mb, set_phase)
            set_phase("end")
        trace = recorder.trace()
    return common.stage_trace(
        trace,
        job,
        stage=stage,
        rank=rank,
        world_size=world,
        microbatches=run_mb,
        total_microbatches=total_mb,
        notes=notes,
    )


def _batches(job: JobSpec, n: int) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
    b, s, v = job.training.micro_batch_size, job.training.seq_len, job.model.vocab_size
    for _ in range(n):
        # torchtitan's data loaders emit per-document positions with every batch (one document here).
        positions = torch.arange(s).unsqueeze(0).expand(b, s).contiguous()
        yield {"input": torch.randint(0, v, (b, s)), "positions": positions}, torch.randint(0, v, (b, s))


def _trainer_shell(
    tt: dict[str, Any], job: JobSpec, model: Any, loss_fn: Any, optimizers: Any, parallel_dims: Any,
    training: Any, parallelism: Any, microbatches: int,
) -> Any:  # fmt: skip
    """An object with exactly what ``Trainer.train_step`` / ``forward_backward_step`` read."""
    trainer_cls = tt["trainer"].Trainer
    shell = trainer_cls.__new__(trainer_cls)
    config = types.SimpleNamespace(training=replace(training, max_norm=1.0), parallelism=parallelism)
    shell.config = config
    shell.model_parts = [model]
    shell.model_config = None
    shell.loss_fn = loss_fn
    shell.optimizers = optimizers
    shell.lr_schedulers = types.SimpleNamespace(get_metrics=dict, step=lambda: None)
    shell.metrics_processor = _Metrics()
    shell.parallel_dims = parallel_dims
    shell.gradient_accumulation_steps = microbatches
    shell.num_pipeline_parallel_microbatches = 1
    shell.device = torch.device("cpu")
    shell.checkpointer = _NoCheckpoint()
    shell.ntokens_seen = 0
    shell.step = 0
    shell.train_context = tt["dist_utils"].get_spmd_context(parallel_dims=parallel_dims, spmd_typechecking=False)
    shell.fwd_bwd_fn = shell._forward_backward_body
    return shell


def _pipeline_step(
    tt: dict[str, Any], job: JobSpec, stage: int, model: Any, loss_fn: Any, optimizers: Any, parallel_dims: Any,
    microbatches: int, set_phase: Any,
) -> None:  # fmt: skip
    """One step of 1F1B on this stage: forwards keep their outputs until their backward (as
    ``torch.distributed.pipelining`` does); received activations are leaves that get gradients.

    An FSDP stage gets the calls ``torch.distributed.pipelining`` makes around it (torch 2.13,
    ``_PipelineStageBase``): before every micro-batch's backward ``backward_maybe_with_nosync`` turns off
    the last-backward, reshard-after-backward and gradient-sync flags, so the groups stay gathered and
    accumulate unsharded gradients; after the last micro-batch ``perform_reduce_grad`` turns them back on,
    runs every group's ``post_backward`` (the reduce-scatters) and FSDP's final callback. torchtitan
    builds its schedules with ``scale_grads=False`` (distributed/pipeline_parallel.py), so no rescale."""
    p, t = job.parallel, job.training
    b, s, v = t.micro_batch_size, t.seq_len, job.model.vocab_size
    first, last = stage == 0, stage == p.pp - 1
    act_dtype = torch.bfloat16 if t.precision == Precision.BF16 else torch.float32
    optimizers.zero_grad(set_to_none=True)
    pending: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
    tokens = torch.tensor(float(b * s * microbatches))
    fsdp = _fsdp_module(model)
    for kind, mb in common.one_f_one_b(p.pp, stage, microbatches):
        if kind == "F":
            if first:
                inputs = torch.randint(0, v, (b, s))
            else:
                inputs = torch.empty(b, s, job.model.hidden_size, dtype=act_dtype).requires_grad_()
            with tt["dist_utils"].get_spmd_context(parallel_dims=parallel_dims, spmd_typechecking=False)():
                out = model(inputs)
                if last:
                    out, _ = loss_fn(out, torch.randint(0, v, (b, s)), tokens)
            pending[mb] = (out, None if first else inputs)
        else:
            set_phase(f"backward:{mb}")
            out, _inputs = pending.pop(mb)
            if fsdp is not None:
                fsdp.set_is_last_backward(False)
                fsdp.set_reshard_after_backward(False)
                fsdp.set_requires_gradient_sync(False)
            if last:
                torch.autograd.backward(out)
            else:
                torch.autograd.backward(out, torch.empty_like(out))
            del out, _inputs
    if fsdp is not None:
        set_phase("reduce_grad")
        _perform_reduce_grad(fsdp)
    set_phase("optimizer")
    tt["dist_utils"].clip_grad_norm_(
        list(model.parameters()), 1.0, foreach=True, pp_mesh=parallel_dims.get_optional_mesh("pp")
    )
    optimizers.step()


def _fsdp_module(model: Any) -> Any:
    """The stage module as an ``FSDPModule`` (``parallelize_llama`` shards it, dp = 1 included), else None."""
    from torch.distributed.fsdp import FSDPModule

    return model if isinstance(model, FSDPModule) else None


def _perform_reduce_grad(fsdp: Any) -> None:
    """``_PipelineStageBase.perform_reduce_grad`` for an FSDP2 stage (torch 2.13)."""
    from torch.distributed.fsdp import fully_shard

    fsdp.set_is_last_backward(True)
    fsdp.set_reshard_after_backward(True)
    fsdp.set_requires_gradient_sync(True)
    state = fully_shard.state(fsdp)
    for each in state._state_ctx.all_states:
        for group in each._fsdp_param_groups:
            group.post_backward()
    state._root_post_backward_final_callback()


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield
