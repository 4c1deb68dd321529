"""How each runtime (training library) behaves where MARP, the step-time model and the job-spec parser tell
the runtimes apart: one :class:`RuntimeProfile` per :class:`Runtime`, beside its capability row
(:mod:`frenzy_opt.core.runtimes`: what it runs). Adding a runtime means filling one row here and one there;
the models read the fields and combine them with their other inputs (the ZeRO stage, pp, the reference
decoder's ``NATIVE_OPS``) where they are used.

Each field says, on the line above it, where the behaviour comes from; the branch sites cite the details.
"""

from __future__ import annotations

from dataclasses import dataclass

from frenzy_opt.core.enums import Runtime
from frenzy_opt.core.runtimes import CAPABILITIES, RuntimeCapabilities

STATE_LAYOUTS = ("distributed_optimizer", "zero", "fully_shard", "ddp_autocast")
"""The model-state layouts MARP knows (:func:`frenzy_opt.prediction.marp.layout.state_layout_for`, sources in
its module docstring): Megatron's fp32 ``main_grad`` buffer with its distributed optimizer / Megatron FSDP,
DeepSpeed ZeRO's 16-bit gradients, FSDP2's fp32 sharded parameters as the master copy, and DDP under
``torch.autocast`` (fp32 weights, 16-bit copies cached)."""

DP_OVERLAPS = ("last_microbatch", "every_microbatch", "none")
"""Which part of the data-parallel traffic a runtime hides behind compute
(:mod:`frenzy_opt.prediction.steptime`'s docstring): "last_microbatch" = the last micro-batch's backward (and
the first one's forward for the parameter all-gather); "every_microbatch" = each micro-batch's own compute
(FSDP2 prefetch); "none" = exposed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeProfile:
    """One runtime's behaviour choices (a row of :data:`PROFILES`). A field with a default says what plain
    PyTorch modules do (no fused kernels, no extra buffers or communicators): a row names it only where its
    runtime differs, or to cite why it does not."""

    capabilities: RuntimeCapabilities
    """What it runs: its row of :data:`frenzy_opt.core.runtimes.CAPABILITIES`."""

    # --- the job spec -----------------------------------------------------------------------------------
    default_zero_stage: int
    """The ZeRO stage used unless told otherwise when data parallel (at dp 1 only :attr:`fully_shard` keeps it)."""
    fully_shard: bool = False
    """Parameters are sharded DTensors at every ZeRO stage offered (FSDP2 ``fully_shard``), so the
    parameter all-gathers and gradient reduce-scatters run whatever the stage, dp 1 included."""
    pipeline_split: str = "even"
    """How the layers split over the ``pp x vpp`` chunks, one of :data:`frenzy_opt.core.partition.SPLIT_RULES`."""
    uneven_pipeline_split: bool = False
    """``parallel.first_stage_layers`` / ``last_stage_layers``: Megatron-core's uneven pipeline split
    (``--decoder-first-pipeline-num-layers``, ``--decoder-last-pipeline-num-layers``)."""
    chunked_loss: bool = False
    """``training.loss_chunks > 1``: torchtitan's ``ChunkedLossWrapper``; the others compute the loss on the
    full logits."""
    default_loss_chunks: int = 1
    """Chunks the loss is computed in by default (1: the full logits)."""

    # --- MARP: model states -----------------------------------------------------------------------------
    state_layout: str
    """Its model-state layout, one of :data:`STATE_LAYOUTS`."""
    fp8_weight_cache_bytes: float
    """Bytes per parameter of fp8 weight copies kept through a step under fp8 (the library doing the casts,
    :mod:`frenzy_opt.prediction.marp.layout`'s docstring)."""
    fp8_saves_fp8_inputs: bool
    """Linear layers save their inputs in fp8 for backward under fp8, rather than in 16-bit."""
    fp8_scaling_state: bool
    """Transformer Engine's delayed-scaling state per layer is kept with the fp8 weight cache
    (:data:`frenzy_opt.prediction.marp.stage_model.TE_SCALING_STATE_BYTES_PER_LAYER`)."""
    fp8_param_gather_min_zero: int | None = None
    """Lowest ZeRO stage at which fp8 parameters are all-gathered in fp8 (None: never)."""
    zero2_reduce_bucket_elements: int = 0
    """Elements of the gradient reduce bucket kept under ZeRO 2 in place of the gathered gradients (0: none)."""
    pipeline_defers_reshard: bool = False
    """Under pipelining (pp > 1) the stage keeps its weights gathered and its gradients unsharded over the
    whole step."""
    output_fsdp_group: bool = False
    """The final norm and output layer form their own FSDP group, driven by the loss."""

    # --- MARP: activations and buffers ------------------------------------------------------------------
    fused_swiglu: bool = False
    """SwiGLU is one fused kernel that saves the gate and the up projection only."""
    rope_out_of_place: bool = False
    """q, k, v are views of the fused QKV output, which stays alive, and RoPE is applied out of place."""
    fused_scale_mask_softmax: bool = False
    """Eager attention's softmax is Megatron-core's ``FusedScaleMaskSoftmax``: 16-bit where its kernel runs,
    else its fp32 PyTorch fallback."""
    softmax_fp32: bool = False
    """Eager attention's softmax runs in fp32 whatever the training precision."""
    vocab_parallel_cross_entropy: bool = False
    """The loss works in place on the fp32 logits (vocab-parallel cross entropy)."""
    sequence_parallel_saves_split_input: bool
    """Under sequence parallelism a column-parallel linear saves its sequence-sharded input for backward."""
    op_level_selective_recompute: bool = False
    """``recompute: selective`` is torch's op-level selective activation checkpointing, not Megatron's
    attention-core recompute (Korthikanti et al. 2022, Sec. 5)."""
    rope_cache_buffer: bool = False
    """Each block keeps its own unsharded RoPE table as a buffer."""
    global_memory_buffer: bool = False
    """Persistent buffers live beside the model states from the first step on (a global memory buffer and
    a cached RoPE table)."""

    # --- MARP: outside the model --------------------------------------------------------------------------
    transformer_engine_workspace: bool = False
    """Transformer Engine's cuBLASLt workspace is allocated beside PyTorch's."""
    dp_cp_communicator: bool = False
    """A data x context communicator exists when cp > 1 and dp > 1."""
    model_parallel_communicators: bool = False
    """The model-parallel (tp x pp) communicator and, when pp > 1, the embedding group exist."""

    # --- step time ----------------------------------------------------------------------------------------
    cudnn_attention_architectures: frozenset[str] = frozenset()
    """GPU architectures on which FlashAttention is cuDNN's fused attention rather than FlashAttention-2."""
    grad_reduce_fp32: bool
    """Gradients are reduced over data parallelism in fp32 whatever the training precision."""
    fp8_weight_casts_per_step: bool = False
    """Under fp8 weights are cast once per step (reused over the micro-batches) and the inputs of the QKV and
    first MLP GEMMs are cast inside the preceding norm; else every GEMM casts its input and weight."""
    balanced_pipeline_stages: bool = False
    """Pipeline stages are balanced by parameter count, embedding and output layer included."""
    dp_overlap: str
    """Data-parallel traffic hidden behind compute without pipelining, one of :data:`DP_OVERLAPS`."""
    dp_overlap_with_pp: str
    """The same with pp > 1."""


PROFILES: dict[str, RuntimeProfile] = {
    Runtime.MEGATRON: RuntimeProfile(
        capabilities=CAPABILITIES[Runtime.MEGATRON],
        # The distributed optimizer shards optimizer states when data parallel (Megatron-LM docs,
        # "Distributed Optimizer"); Megatron FSDP (zero_stage 2/3) only when asked for.
        default_zero_stage=1,
        # ``get_num_layers_to_build`` (``megatron/core/transformer/transformer_block.py``).
        pipeline_split="megatron",
        # Megatron-LM ``megatron/training/arguments.py``: --decoder-first/last-pipeline-num-layers.
        uneven_pipeline_split=True,
        # fp32 ``main_grad`` buffer, fp32 master weights sharded by the distributed optimizer (Megatron-LM docs).
        state_layout="distributed_optimizer",
        # Transformer Engine: fp8 copy + transpose (TE docs, "is_first_microbatch"; Float8Tensor ``_data``,
        # ``_transpose``).
        fp8_weight_cache_bytes=2.0,
        # Transformer Engine saves fp8 linear inputs for backward.
        fp8_saves_fp8_inputs=True,
        # TE ``DelayedScaling`` amax histories (TE docs, "Using FP8 with Transformer Engine", ``fp8_meta``).
        fp8_scaling_state=True,
        # --fp8-param-gather needs the distributed optimizer (Megatron-LM ``arguments.py``).
        fp8_param_gather_min_zero=1,
        # Megatron-core's fused bias-SwiGLU (``megatron/core/fusions/fused_bias_swiglu.py``).
        fused_swiglu=True,
        # Megatron-core splits q, k, v as views of the fused QKV GEMM output and applies RoPE out of place
        # (trace path finding M2, benchmarks/results/marp_vs_trace.md).
        rope_out_of_place=True,
        # ``FusedScaleMaskSoftmax`` (``megatron/core/fusions/fused_softmax.py``).
        fused_scale_mask_softmax=True,
        # ``_VocabParallelCrossEntropy`` (``megatron/core/tensor_parallel/cross_entropy.py``).
        vocab_parallel_cross_entropy=True,
        # Megatron-core saves the sequence-sharded input and all-gathers it again in backward
        # (Korthikanti et al. 2022, Sec. 4.2.2).
        sequence_parallel_saves_split_input=True,
        # ``GlobalMemoryBuffer`` (``megatron/core/utils.py``) and ``RotaryEmbedding``'s ``lru_cache``
        # (trace path findings M3, M4).
        global_memory_buffer=True,
        # Transformer Engine's cuBLASLt workspace (``transformer_engine/pytorch/module/base.py``).
        transformer_engine_workspace=True,
        # ``megatron/core/parallel_state.py``: the data x context group, the model-parallel group, the
        # embedding group.
        dp_cp_communicator=True,
        model_parallel_communicators=True,
        # Transformer Engine uses cuDNN's fused attention on Hopper and Blackwell (TE's default backend there).
        cudnn_attention_architectures=frozenset({"hopper", "blackwell"}),
        # Megatron-core DDP config, grad_reduce_in_fp32=False.
        grad_reduce_fp32=False,
        # TE fuses the input casts into LayerNormLinear / LayerNormMLP and caches weights (TE docs,
        # "is_first_microbatch").
        fp8_weight_casts_per_step=True,
        # Every stage gets the same number of transformer layers.
        balanced_pipeline_stages=False,
        # Overlapped grad reduce and param gather on the last micro-batch (--overlap-grad-reduce).
        dp_overlap="last_microbatch",
        dp_overlap_with_pp="last_microbatch",
    ),
    Runtime.FSDP2: RuntimeProfile(
        capabilities=CAPABILITIES[Runtime.FSDP2],
        # torchtitan ``fully_shard``s every block (ZeRO 3) by default (``torchtitan/distributed/fsdp.py``).
        default_zero_stage=3,
        fully_shard=True,
        # ``_generate_llm_fqn_per_model_part`` (``torchtitan/distributed/pipeline_parallel.py``).
        pipeline_split="torchtitan",
        # ``ChunkedLossWrapper`` (``torchtitan/components/loss.py``); torchtitan 0.3.0's llama3 configs wrap
        # the loss in it with ``num_chunks`` 8 (``torchtitan/models/llama3/config_registry.py``).
        chunked_loss=True,
        default_loss_chunks=8,
        # ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: fp32 shards are the master (Zhao et
        # al. 2023).
        state_layout="fully_shard",
        # torchao's ``Float8Linear`` casts weights per GEMM and keeps no copy.
        fp8_weight_cache_bytes=0.0,
        # torchao saves the high-precision input (``float8_linear.matmul_with_hp_or_float8_args``).
        fp8_saves_fp8_inputs=False,
        # torchao's dynamic scaling keeps no amax history.
        fp8_scaling_state=False,
        # torchao ``enable_fsdp_float8_all_gather`` at any stage FSDP2 offers.
        fp8_param_gather_min_zero=0,
        # ``_PipelineStage`` calls ``set_reshard_after_backward(False)`` and
        # ``set_requires_gradient_sync(False)`` (``torch.distributed.pipelining``).
        pipeline_defers_reshard=True,
        # torchtitan's last FSDP group, [norm, output] (``apply_fsdp_to_decoder``, ``torchtitan/distributed/fsdp.py``).
        output_fsdp_group=True,
        # PyTorch-native modules: separate SiLU, mul, RoPE, softmax, log_softmax + nll_loss.
        fused_swiglu=False,
        # DTensor ``ColwiseParallel`` saves the all-gathered input (``SequenceParallel`` norms ahead of
        # ``input_layouts=Shard(1)``, ``torchtitan/models/llama3/infra/parallelize.py``).
        sequence_parallel_saves_split_input=False,
        # torchtitan ``apply_ac``: ``selective_ac_option = "op"`` with its ``_save_list``.
        op_level_selective_recompute=True,
        # ``ComplexRoPE._precompute_cache`` per attention layer (``torchtitan/models/common/rope.py``); FSDP2
        # does not shard buffers.
        rope_cache_buffer=True,
        # ``ParallelDims.build_mesh``: one per mesh dimension plus the flattened dp x cp mesh.
        dp_cp_communicator=True,
        # PyTorch's SDPA runs the FlashAttention-2 kernels (its flash backend).
        cudnn_attention_architectures=frozenset(),
        # torchtitan config, mixed_precision_reduce = "float32".
        grad_reduce_fp32=True,
        # torchao's float8 casts everything each time.
        fp8_weight_casts_per_step=False,
        # FSDP2 prefetches the next block's all-gather behind each micro-batch's compute.
        dp_overlap="every_microbatch",
        dp_overlap_with_pp="every_microbatch",
    ),
    Runtime.DEEPSPEED: RuntimeProfile(
        capabilities=CAPABILITIES[Runtime.DEEPSPEED],
        # ZeRO stage 1 when data parallel.
        default_zero_stage=1,
        # ZeRO (Rajbhandari et al. 2020, Sec. 3 and Fig. 1): 16-bit weights and gradients, K = 12.
        state_layout="zero",
        # Transformer Engine modules (Hugging Face Accelerate docs, "Low precision training").
        fp8_weight_cache_bytes=2.0,
        fp8_saves_fp8_inputs=True,
        fp8_scaling_state=True,
        # ``reduce_bucket_size`` default 5e8 elements (DeepSpeed config docs).
        zero2_reduce_bucket_elements=500_000_000,
        # No sequence parallelism (its row in core/runtimes.py); the Megatron default kept.
        sequence_parallel_saves_split_input=True,
        # The data-parallel group, plus tp and pp when used.
        dp_cp_communicator=False,
        # DeepSpeed's fp16 engine all-reduces fp32 gradients ("fp32_allreduce", as the AMP runs state).
        grad_reduce_fp32=True,
        # PipelineModule partition_method="parameters" (DeepSpeed docs).
        balanced_pipeline_stages=True,
        # ZeRO reduction overlapped with the backward (overlap_comm), but the pipeline engine reduces after
        # the flush (DeepSpeed docs, "Pipeline Parallelism").
        dp_overlap="last_microbatch",
        dp_overlap_with_pp="none",
    ),
    Runtime.HF: RuntimeProfile(
        capabilities=CAPABILITIES[Runtime.HF],
        # DDP: no ZeRO.
        default_zero_stage=0,
        # fp32 model under autocast; DDP buckets when data parallel (Li et al. 2020, Sec. 3.2.3).
        state_layout="ddp_autocast",
        # No fp8 (its row in core/runtimes.py); the Transformer Engine values kept.
        fp8_weight_cache_bytes=2.0,
        fp8_saves_fp8_inputs=True,
        fp8_scaling_state=True,
        # ``torch.autocast`` runs softmax in fp32 (PyTorch docs, "Automatic Mixed Precision": ops that
        # autocast to float32).
        softmax_fp32=True,
        # No tensor parallelism (its row in core/runtimes.py); the Megatron default kept.
        sequence_parallel_saves_split_input=True,
        # DDP reduces the gradients in their own (autocast: training) precision.
        grad_reduce_fp32=False,
        # DDP overlaps its bucketed all-reduce with the last micro-batch's backward (no_sync before).
        dp_overlap="last_microbatch",
        dp_overlap_with_pp="last_microbatch",
    ),
}
"""The behaviour table, one row per :class:`Runtime`."""


def profile(runtime: str) -> RuntimeProfile:
    """The row of ``runtime`` (a :class:`Runtime` value); ``ValueError`` lists the runtimes."""
    try:
        return PROFILES[runtime]
    except KeyError:
        raise ValueError(f"training.runtime must be one of {', '.join(Runtime)}, got {runtime!r}") from None
