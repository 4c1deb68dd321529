"""The megatron runtime traced on megatron-core 0.16.1: GPTModel with the local (non-Transformer-Engine)
layer spec, ``parallel_state.initialize_model_parallel`` over the fake group, its
``DistributedDataParallel`` (contiguous fp32 grad buffers), ``get_megatron_optimizer`` (bf16 params with
fp32 main params; the distributed optimizer when zero_stage >= 1) and ``get_forward_backward_func``'s
schedule (1F1B for pp > 1), with the last stage's loss from ``GPTModel`` (vocab-parallel cross entropy).

CPU patches (narrow, all listed in docs/trace-path.md): ``torch.cuda.current_device`` answers "cpu",
``Tensor.cuda()`` is the identity, CUDA streams/events/synchronize are no-ops; weights are not initialized
(``perform_initialization=False``, values do not matter under fake tensors); fusions that need apex/TE
are off. With ``parallel.attention == "flash"`` the core attention is :class:`FlashCoreAttention`, which
calls SDPA (on the CPU: ``_scaled_dot_product_flash_attention_for_cpu``, which keeps q, k, v, out and the
fp32 log-sum-exp as TE's flash attention does); "eager" keeps Megatron's ``DotProductAttention``
(materialized s x s scores, softmax and its mask).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from frenzy_opt.core.enums import Precision, Recompute
from frenzy_opt.core.spec import JobSpec
from frenzy_opt.tracing import common
from frenzy_opt.tracing.recorder import AllocationRecorder

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True, slots=True, kw_only=True)
class McoreOptions:
    recompute: str | None = None
    """none / selective (Megatron's core-attention recompute) / full (uniform, 1 layer per chunk); None =
    the job's ``parallel.recompute``."""
    attention: str | None = None
    """flash (SDPA core attention, TE-like) / eager (Megatron's local DotProductAttention); None = the job's."""
    overlap_grad_reduce: bool = False


def check_supported(job: JobSpec) -> None:
    arch, p, t = job.model, job.parallel, job.training
    problems = []
    if t.optimizer not in ("adamw", "adam"):
        problems.append("optimizer must be adamw/adam")
    if t.precision not in _DTYPES:
        problems.append("precision must be bf16, fp16 or fp32")
    if p.vpp != 1:
        problems.append("vpp must be 1")
    if arch.num_layers % p.pp:
        problems.append("megatron splits layers evenly: num_layers must be a multiple of pp")
    if arch.position_embedding != "rope":
        problems.append("position embedding must be rope")
    if p.ep > 1 and not arch.is_moe:
        problems.append("ep > 1 needs an MoE model")
    if problems:
        raise ValueError(f"megatron trace of {job.name}: " + "; ".join(problems))


@contextlib.contextmanager
def cpu_as_cuda() -> Iterator[None]:
    """The CUDA entry points Megatron-core calls, answered on the CPU for the trace's duration."""

    class _Stream:
        def __init__(self, *_: Any, **__: Any) -> None:
            pass

        def wait_stream(self, *_: Any) -> None:
            pass

        def synchronize(self) -> None:
            pass

        def record_event(self, *_: Any) -> Any:
            return _Event()

    class _Event(_Stream):
        def record(self, *_: Any) -> None:
            pass

        def wait(self, *_: Any) -> None:
            pass

        def query(self) -> bool:
            return True

    @contextlib.contextmanager
    def _stream_ctx(*_: Any) -> Iterator[None]:
        yield

    cuda = torch.cuda
    original_type = torch.Tensor.type

    def tensor_type(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        # Megatron's optimizers check ``param.type() == "torch.cuda.BFloat16Tensor"`` (optimizer.py,
        # distrib_optimizer.py, clip_grads.py): CPU tensors answer with the CUDA type names.
        out = original_type(self, *args, **kwargs)
        if not args and not kwargs and isinstance(out, str) and out.startswith("torch.") and ".cuda." not in out:
            return "torch.cuda." + out[len("torch.") :]
        return out

    patches = {
        (torch.Tensor, "type"): tensor_type,
        (cuda, "current_device"): lambda: "cpu",
        (cuda, "device_count"): lambda: 1,
        (cuda, "set_device"): lambda *_: None,
        (cuda, "synchronize"): lambda *_: None,
        (cuda, "current_stream"): lambda *_: _Stream(),
        (cuda, "default_stream"): lambda *_: _Stream(),
        (cuda, "Stream"): _Stream,
        (cuda, "Event"): _Event,
        (cuda, "stream"): _stream_ctx,
        (cuda, "empty_cache"): lambda: None,
        (cuda, "manual_seed"): lambda *_: None,
        (torch.Tensor, "cuda"): lambda self, *_, **__: self,
        (torch.Tensor, "record_stream"): lambda self, *_: None,
    }
    import megatron.core.distributed.param_and_grad_buffer as pgb

    class _Work:
        def wait(self) -> None:
            pass

    @contextlib.contextmanager
    def coalescing_manager(*_: Any, **__: Any) -> Iterator[_Work]:
        # The grouped all-reduce/reduce-scatter of the grad buckets: each op inside still runs (in place,
        # no-ops on the fake backend); only the coalesced flush has no fake kernel (allreduce_coalesced_).
        yield _Work()

    patches[(pgb, "_coalescing_manager")] = coalescing_manager
    import megatron.core.optimizer.clip_grads as clip_grads

    def l2_norm(chunk_size: int, noop_flag: Any, tensor_lists: Any, per_tensor: bool, *args: Any) -> Any:
        # Megatron's no-apex fallback (utils.local_multi_tensor_l2_norm) builds torch.tensor() from the
        # per-tensor norms, which fake tensors cannot; TE's/apex's fused kernel returns one fp32 scalar too.
        norms = [torch.linalg.vector_norm(t.float()) for lst in tensor_lists for t in lst]
        total = torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())
        return total.reshape(1), None

    patches[(clip_grads, "l2_norm_impl")] = l2_norm
    from megatron.core.transformer import torch_norm

    original_norm_new = torch_norm.WrappedTorchNorm.__new__

    def norm_new(cls: Any, config: Any, hidden_size: int, *args: Any, **kwargs: Any) -> Any:
        # WrappedTorchNorm (the no-apex norm of the local spec) refuses sequence parallelism; apex's and
        # TE's norms take it and mark their weights ``sequence_parallel`` (grads all-reduced over tp).
        sp = config.sequence_parallel
        config.sequence_parallel = False
        try:
            norm = original_norm_new(cls, config, hidden_size, *args, **kwargs)
        finally:
            config.sequence_parallel = sp
        for param in norm.parameters():
            param.sequence_parallel = sp
        return norm

    patches[(torch_norm.WrappedTorchNorm, "__new__")] = staticmethod(norm_new)
    from megatron.core.tensor_parallel import random as mp_random

    @contextlib.contextmanager
    def fork(self: Any, name: str = "") -> Iterator[None]:
        # The model-parallel CUDA RNG streams (dropout under tp/sp) hold CUDA generator states: values only.
        yield

    patches[(mp_random.CudaRNGStatesTracker, "fork")] = fork
    # Megatron's CheckpointFunction (full recompute) stashes and restores the CUDA RNG state: a CPU one here.
    patches[(mp_random, "_get_cuda_rng_state")] = lambda *_, **__: torch.empty(0, dtype=torch.uint8)
    patches[(mp_random, "_set_cuda_rng_state")] = lambda *_, **__: None
    from megatron.core.models.common.embeddings import rotary_pos_embedding

    def pos_emb_on_cp_rank(pos_emb: torch.Tensor, seq_dim: int, cp_group: Any = None) -> torch.Tensor:
        # rope_utils.get_pos_emb_on_this_cp_rank without its pinned host index (no pinned allocator here).
        cp_size, cp_rank = cp_group.size(), cp_group.rank()
        cp_idx = torch.tensor([cp_rank, 2 * cp_size - cp_rank - 1])
        pos_emb = pos_emb.view(*pos_emb.shape[:seq_dim], 2 * cp_size, -1, *pos_emb.shape[(seq_dim + 1) :])
        pos_emb = pos_emb.index_select(seq_dim, cp_idx)
        return pos_emb.view(*pos_emb.shape[:seq_dim], -1, *pos_emb.shape[(seq_dim + 2) :])

    if hasattr(rotary_pos_embedding, "get_pos_emb_on_this_cp_rank"):
        patches[(rotary_pos_embedding, "get_pos_emb_on_this_cp_rank")] = pos_emb_on_cp_rank
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        # megatron-core 0.16.1 bug: moe_utils imports te_general_gemm only when Transformer Engine is there,
        # but RouterGatingLinearFunction tests ``te_general_gemm is not None`` (moe_utils.py line 1192):
        # a NameError without TE. None selects its torch.mm fallback.
        moe_utils.te_general_gemm = None
        restore_moe = True
    else:
        restore_moe = False
    from megatron.core.transformer.moe import experts as moe_experts

    original_sequential_forward = moe_experts.SequentialMLP.forward

    class _EqualSplits:
        def __init__(self, total: int, parts: int) -> None:
            self.splits = [total // parts] * parts

        def tolist(self) -> list[int]:
            return self.splits

    def sequential_forward(self: Any, hidden: torch.Tensor, tokens_per_expert: Any, probs: torch.Tensor) -> Any:
        # Drop-and-pad routing gives every local expert the same token count; the counts are a fake
        # tensor here, so the split SequentialMLP reads with .tolist() is given by the shapes.
        if self.num_local_experts > 1:
            tokens_per_expert = _EqualSplits(hidden.shape[0], self.num_local_experts)
        return original_sequential_forward(self, hidden, tokens_per_expert, probs)

    patches[(moe_experts.SequentialMLP, "forward")] = sequential_forward
    from megatron.core.fusions import fused_bias_swiglu

    for name in ("swiglu", "bias_swiglu", "weighted_swiglu", "swiglu_back", "bias_swiglu_back",
                 "weighted_swiglu_back"):  # fmt: skip
        # The jit-fused SwiGLU kernels (torch.compile at import) run eagerly inside their autograd Functions:
        # the same saved tensor (the FC1 output), no compilation of fake tensors.
        fn = getattr(fused_bias_swiglu, name, None)
        eager = getattr(fn, "_torchdynamo_orig_callable", None) or getattr(fn, "__wrapped__", None)
        if eager is not None:
            patches[(fused_bias_swiglu, name)] = eager
    import megatron.core.optimizer.optimizer as mcore_opt

    def tensor_scale(chunk_size: int, noop_flag: Any, tensor_lists: Any, scale: float) -> None:
        # Megatron's no-apex fallback (utils.local_multi_tensor_scale) writes dst.copy_(src * scale): an
        # fp32 temporary of each parameter (the embedding's is the largest) while main params are copied to
        # the model params. TE's/apex's multi_tensor_scale writes dst directly, as here.
        for src, dst in zip(tensor_lists[0], tensor_lists[1], strict=True):
            dst.copy_(src)
            if scale != 1.0:
                dst.mul_(scale)

    patches[(mcore_opt, "multi_tensor_scale_impl")] = tensor_scale
    if hasattr(clip_grads, "multi_tensor_scale_impl"):
        patches[(clip_grads, "multi_tensor_scale_impl")] = tensor_scale
    saved = {key: getattr(*key) for key in patches}
    remap = _CudaToCpu()
    for (obj, name), value in patches.items():
        setattr(obj, name, value)
    remap.__enter__()
    try:
        yield
    finally:
        remap.__exit__(None, None, None)
        for (obj, name), value in saved.items():
            setattr(obj, name, value)
        if restore_moe:
            del moe_utils.te_general_gemm


def softmax_batch_per_block(sq: int, sk: int, b: int, np: int) -> int:
    """``get_batch_per_block`` of Megatron's fused softmax kernels (``scaled_masked_softmax.h``,
    megatron/core/fusions csrc): 128 threads per block, one warp of ``min(next_pow2(sk), 32)`` lanes per
    row, two rows per warp when ``next_pow2(sk) <= 128``."""
    pow2 = 1 << max(sk - 1, 0).bit_length()
    warp = min(pow2, 32)
    return (128 // warp) * (2 if pow2 <= 128 else 1)


class _FusedSoftmax(torch.autograd.Function):  # type: ignore[misc]
    """Megatron's fused scale-mask-softmax kernels (``ScaledUpperTriangMaskedSoftmax``,
    ``ScaledMaskedSoftmax``, ``ScaledSoftmax``) on the CPU: they compute in fp32 registers, write the
    16-bit probabilities and keep only those for backward, whose kernel writes the input gradient into
    the incoming gradient's storage. The stand-in scales and masks the scores in place (they are not
    needed after the softmax) and forms the row sums by a batched matmul, so no full-size fp32 or extra
    16-bit tensor is made that the kernels do not make."""

    @staticmethod
    def forward(ctx: Any, scores: torch.Tensor, mask: torch.Tensor | None, scale: float, causal: bool) -> Any:
        x = scores.mul_(scale)
        if causal:
            sq, sk = x.shape[-2:]
            x.masked_fill_(torch.ones(sq, sk, dtype=torch.bool, device=x.device).triu_(1), float("-inf"))
        if mask is not None:
            x.masked_fill_(mask, -10000.0)
        probs = torch.softmax(x, dim=-1)
        ctx.save_for_backward(probs)
        ctx.scale = scale
        return probs

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (probs,) = ctx.saved_tensors
        rows = torch.matmul(grad.unsqueeze(-2), probs.unsqueeze(-1)).squeeze(-1)
        return grad.sub_(rows).mul_(probs).mul_(ctx.scale), None, None, None


@contextlib.contextmanager
def fused_softmax() -> Iterator[None]:
    """Megatron's fused softmax kernels as :class:`_FusedSoftmax` (their availability check unchanged)."""
    fs = importlib.import_module("megatron.core.fusions.fused_softmax")
    saved = {
        name: getattr(fs, name) for name in ("ScaledUpperTriangMaskedSoftmax", "ScaledMaskedSoftmax", "ScaledSoftmax")
    }
    original_block = fs.FusedScaleMaskSoftmax.__dict__["get_batch_per_block"]

    class Causal:
        @staticmethod
        def apply(inputs: torch.Tensor, scale: float) -> Any:
            return _FusedSoftmax.apply(inputs, None, scale, True)

    class Masked:
        @staticmethod
        def apply(inputs: torch.Tensor, mask: torch.Tensor, scale: float) -> Any:
            return _FusedSoftmax.apply(inputs, mask, scale, False)

    class Plain:
        @staticmethod
        def apply(inputs: torch.Tensor, scale: float) -> Any:
            return _FusedSoftmax.apply(inputs, None, scale, False)

    for name, stand_in in zip(saved, (Causal, Masked, Plain), strict=True):
        setattr(fs, name, stand_in)
    fs.FusedScaleMaskSoftmax.get_batch_per_block = staticmethod(softmax_batch_per_block)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(fs, name, value)
        fs.FusedScaleMaskSoftmax.get_batch_per_block = original_block


class _CudaToCpu(TorchFunctionMode):  # type: ignore[misc]
    """Factories called with ``device="cuda"`` (Megatron's optimizer scalars, ``torch.cuda.current_device()``
    indices) make CPU tensors."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and (device == "cuda" or str(device).startswith("cuda") or isinstance(device, int)):
            kwargs = {**kwargs, "device": "cpu"}
        return func(*args, **kwargs)


def _flash_core_attention_cls() -> type:
    from megatron.core.transformer.module import MegatronModule

    class FlashCoreAttention(MegatronModule):  # type: ignore[misc,valid-type]
        """Megatron's core-attention interface on SDPA's flash kernel: [s, b, heads, d] in, [s, b, h] out.
        Stands in for TEDotProductAttention (flash), which needs Transformer Engine and CUDA."""

        def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str,
                     attention_dropout: float | None = None, softmax_scale: float | None = None,
                     cp_comm_type: str | None = None, pg_collection: Any = None) -> None:  # fmt: skip
            super().__init__(config=config)
            self.softmax_scale = softmax_scale

        def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                    attn_mask_type: Any = None, attention_bias: Any = None,
                    packed_seq_params: Any = None) -> torch.Tensor:  # fmt: skip
            q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=self.softmax_scale, enable_gqa=k.shape[1] != q.shape[1]
            )
            s, b = query.shape[0], query.shape[1]
            return out.permute(2, 0, 1, 3).reshape(s, b, -1)

    return FlashCoreAttention


def _layer_spec(job: JobSpec, attention: str) -> Any:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    arch = job.model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = get_gpt_layer_local_spec(
            num_experts=arch.num_experts if arch.is_moe else None,
            moe_grouped_gemm=False,
            normalization="RMSNorm" if arch.norm == "rmsnorm" else "LayerNorm",
        )
    if attention == "flash":
        spec.submodules.self_attention.submodules.core_attention = _flash_core_attention_cls()
    return spec


def transformer_config(job: JobSpec, recompute: str) -> Any:
    from megatron.core.transformer.transformer_config import TransformerConfig

    arch, p, t = job.model, job.parallel, job.training
    dtype = _DTYPES[t.precision]
    kwargs: dict[str, Any] = dict(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.kv_channels,
        normalization="RMSNorm" if arch.norm == "rmsnorm" else "LayerNorm",
        gated_linear_unit=arch.mlp == "swiglu",
        activation_func=F.silu if arch.mlp == "swiglu" else F.gelu,
        add_bias_linear=arch.linear_bias,
        add_qkv_bias=arch.qkv_bias,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        params_dtype=dtype,
        bf16=t.precision == Precision.BF16,
        fp16=t.precision == Precision.FP16,
        pipeline_dtype=dtype,
        tensor_model_parallel_size=p.tp,
        pipeline_model_parallel_size=p.pp,
        context_parallel_size=p.cp,
        sequence_parallel=p.sequence_parallel and p.tp > 1,
        expert_model_parallel_size=p.ep,
        use_cpu_initialization=True,
        perform_initialization=False,
        gradient_accumulation_fusion=False,
        # Megatron-LM's default (--no-masked-softmax-fusion turns it off); the CUDA kernels are stood in
        # for by :func:`fused_softmax`.
        masked_softmax_fusion=True,
        # Megatron-LM's --swiglu turns the fused bias-SwiGLU on (it keeps only the FC1 output for backward).
        bias_activation_fusion=arch.mlp == "swiglu",
        bias_dropout_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        deallocate_pipeline_outputs=True,
        variable_seq_lengths=False,
    )
    if arch.is_moe:
        kwargs.update(
            num_moe_experts=arch.num_experts,
            moe_router_topk=arch.moe_top_k,
            moe_ffn_hidden_size=arch.expert_ffn_size,
            moe_token_dispatcher_type="alltoall",
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=0.0,
            moe_grouped_gemm=False,
            moe_permute_fusion=False,
            moe_router_dtype="fp32",
            # Routed token counts are data-dependent shapes, which fake tensors cannot take: experts run at
            # capacity ceil(top_k * tokens / experts), padded (Megatron's drop-and-pad mode).
            moe_expert_capacity_factor=1.0,
            moe_pad_expert_input_to_capacity=True,
        )
    if recompute == Recompute.FULL:
        kwargs.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif recompute == Recompute.SELECTIVE:
        kwargs.update(recompute_granularity="selective")
    return TransformerConfig(**kwargs)


def _rank_of_stage(job: JobSpec, stage: int) -> int:
    # parallel_state's default order "tp-cp-ep-dp-pp": pp is the slowest-varying coordinate.
    p = job.parallel
    return stage * (p.tp * p.cp * p.dp)


def trace_stage(
    job: JobSpec,
    stage: int,
    *,
    steps: int = 2,
    opts: McoreOptions | None = None,
    max_microbatches: int | None = None,
    fake: bool = True,
) -> common.StageTrace:
    """Build pipeline stage ``stage``'s rank on megatron-core and record ``steps`` training steps."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    check_supported(job)
    opts = opts or McoreOptions()
    p = job.parallel
    recompute = opts.recompute or p.recompute
    attention = opts.attention or p.attention
    total_mb, run_mb = common.step_microbatches(job, max_microbatches)
    world = p.dp * p.tp * p.pp * p.cp
    rank = _rank_of_stage(job, stage)
    with contextlib.ExitStack() as stack:
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        stack.enter_context(common.fake_process_group(rank, world))
        stack.enter_context(cpu_as_cuda())
        from megatron.core import parallel_state as ps

        ps.initialize_model_parallel(
            tensor_model_parallel_size=p.tp,
            pipeline_model_parallel_size=p.pp,
            context_parallel_size=p.cp,
            expert_model_parallel_size=p.ep,
            create_gloo_process_groups=False,
        )
        stack.callback(ps.destroy_model_parallel)
        assert ps.get_pipeline_model_parallel_rank() == stage, (ps.get_pipeline_model_parallel_rank(), stage)
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        with contextlib.suppress(Exception):
            model_parallel_cuda_manual_seed(1234)
        stack.enter_context(common.real_device_meshes())
        stack.enter_context(common.fused_rms_norm())
        stack.enter_context(fused_softmax())
        if fake:  # fake=False executes for real (small models: the check that the fake trace is right)
            stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
            stack.enter_context(common.FakeScalars())
        recorder = AllocationRecorder("setup")
        with recorder, common.phase_hooks(recorder) as set_phase:
            model, optimizer, config = _build(job, stage, recompute, attention, opts)
            recorder.mark_setup_end()
            counter = {"forward": 0}
            for _ in range(steps):
                counter["forward"] = 0
                _train_step(job, model, optimizer, config, run_mb, counter, set_phase)
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
    )


def _build(job: JobSpec, stage: int, recompute: str, attention: str, opts: McoreOptions) -> tuple[Any, Any, Any]:
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    arch, p, t = job.model, job.parallel, job.training
    config = transformer_config(job, recompute)
    model = GPTModel(
        config=config,
        transformer_layer_spec=_layer_spec(job, attention),
        vocab_size=arch.vocab_size,
        max_sequence_length=t.seq_len,
        pre_process=stage == 0,
        post_process=stage == p.pp - 1,
        share_embeddings_and_output_weights=arch.tied_embeddings,
        position_embedding_type="rope",
    )
    distributed = p.zero_stage >= 1 and t.precision != Precision.FP32
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=opts.overlap_grad_reduce,
        use_distributed_optimizer=distributed,
    )
    ddp = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=1e-4,
        weight_decay=0.1,
        adam_beta1=0.9,
        adam_beta2=0.95,
        bf16=t.precision == Precision.BF16,
        fp16=t.precision == Precision.FP16,
        params_dtype=_DTYPES[t.precision],
        use_distributed_optimizer=distributed,
        clip_grad=1.0,
    )
    optimizer = get_megatron_optimizer(opt_config, [ddp], use_gloo_process_groups=False)
    _fuse_torch_adam(optimizer)
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = ddp.no_sync
    return ddp, optimizer, config


def _fuse_torch_adam(optimizer: Any) -> None:
    """Without TE/apex, megatron-core builds ``torch.optim.AdamW`` (``USING_PYTORCH_OPTIMIZER``): for-loop
    on CPU tensors, foreach on CUDA ones, both with sqrt/div temporaries of a parameter (for-loop) or of the
    whole group (foreach). TE's/apex's FusedAdam, which a GPU run uses, updates in place: the torch AdamW's
    groups are switched to its fused kernel (in place, on the CPU too)."""
    for chained in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(chained, "optimizer", None)
        if isinstance(inner, torch.optim.AdamW | torch.optim.Adam):
            for group in inner.param_groups:
                group["fused"], group["foreach"] = True, False


def _train_step(job: JobSpec, model: Any, optimizer: Any, config: Any, microbatches: int, counter: dict[str, int],
                set_phase: Any) -> None:  # fmt: skip
    """Megatron-LM's ``train_step``: zero the grad buffers, the schedule's forwards and backwards, the step."""
    from megatron.core.pipeline_parallel import get_forward_backward_func, schedules

    t, p = job.training, job.parallel
    b, s, v = t.micro_batch_size, t.seq_len // p.cp, job.model.vocab_size
    model.zero_grad_buffer()
    optimizer.zero_grad()

    def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        losses = output_tensor.float().view(-1)
        loss = torch.sum(losses * loss_mask.view(-1))
        return loss, {"lm loss": loss.detach()}

    def forward_step(data_iterator: Any, model: Any) -> tuple[torch.Tensor, Any]:
        set_phase(f"forward:{counter['forward']}")
        counter["forward"] += 1
        tokens = torch.randint(0, v, (b, s))
        labels = torch.randint(0, v, (b, s))
        position_ids = torch.arange(s).unsqueeze(0).expand(b, s)
        loss_mask = torch.ones(b, s)
        output = model(tokens, position_ids, None, labels=labels)
        return output, functools.partial(loss_func, loss_mask)

    original_backward_step = schedules.backward_step
    backward_counter = {"n": 0}

    def backward_step(*args: Any, **kwargs: Any) -> Any:
        set_phase(f"backward:{backward_counter['n']}")
        backward_counter["n"] += 1
        return original_backward_step(*args, **kwargs)

    schedules.backward_step = backward_step
    try:
        forward_backward = get_forward_backward_func()
        forward_backward(
            forward_step_func=forward_step,
            data_iterator=None,
            model=[model],
            num_microbatches=microbatches,
            seq_length=s,
            micro_batch_size=b,
            forward_only=False,
        )
    finally:
        schedules.backward_step = original_backward_step
    set_phase("optimizer")
    optimizer.step()
