"""Model-state layout per runtime: which copies of weights, gradients and optimizer states a rank keeps.

``Φ`` below is the number of parameters a rank holds after tensor/pipeline/expert partitioning. The
runtimes keep different copies (bytes per parameter):

* megatron (Megatron-LM/Core, mixed precision): 16-bit weights, fp32 ``main_grad`` buffer, fp32 master
  weights and Adam states; the distributed optimizer (zero_stage 1) shards master weights and optimizer
  states over dp: ``6 + 12/dp`` bytes (Megatron-LM docs, "Distributed Optimizer" table; 18 without it).
  Megatron-core's FSDP (``--use-megatron-fsdp`` with ``--data-parallel-sharding-strategy``; Megatron-core
  docs, "Megatron FSDP") also shards the gradient buffer (``optim_grads``, zero_stage 2: ``2 + 16/dp``) and
  the 16-bit weights (``optim_grads_params``, zero_stage 3: ``18/dp``), all-gathering one block's weights
  and reduce-scattering one block's gradients at a time.
* deepspeed (ZeRO, Rajbhandari et al. 2020, Sec. 3 and Fig. 1): 16-bit weights and gradients, fp32 master
  weights + Adam states (K = 12); stage 1 shards the K states, stage 2 also gradients, stage 3 also weights:
  ``2 + 2 + 12/dp``, ``2 + 14/dp``, ``16/dp``.
* fsdp2 (PyTorch FSDP2 ``fully_shard`` with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``,
  Zhao et al. 2023): fp32 sharded parameters are the master copy; fp32 sharded gradients; Adam states on the
  shard: ``16/dp`` plus the 16-bit unsharded parameters of the blocks being computed (zero_stage 3;
  zero_stage 2 = ``reshard_after_forward=False`` keeps all of them gathered between forward and backward).
* hf (Hugging Face Trainer on DDP with ``torch.autocast``): fp32 weights, fp32 gradients and fp32 states
  (16 bytes), plus the autocast cache of 16-bit weight copies during forward and backward, and DDP's gradient
  buckets (``4Φ`` for dp > 1; Li et al. 2020, PyTorch Distributed, Sec. 3.2.3).

fp32 training keeps no master copy (weights are the master). fp8 keeps the 16-bit weights and states of
bf16 training; what it adds depends on the library doing the casts (the runtime profile's ``fp8_weight_cache_bytes``):
Transformer Engine (megatron, deepspeed) caches each weight's fp8 copy across the micro-batches of a step
and, for the weight-gradient GEMM, its transposed ("columnwise") copy: 2 bytes per parameter (Transformer
Engine docs, "Using FP8 with Transformer Engine": ``is_first_microbatch`` weight caching; Float8Tensor
keeps ``_data`` and ``_transpose``), and saves fp8 linear inputs for backward; torchao's ``Float8Linear``
(torchtitan, fsdp2) casts weights on the fly per GEMM and keeps no copy, and saves the high-precision
input and weight for backward (torchao ``float8_linear.matmul_with_hp_or_float8_args``), so its saved
activations stay 16-bit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from frenzy_opt.core.enums import Precision
from frenzy_opt.core.runtime_profile import profile
from frenzy_opt.core.spec import ParallelConfig, TrainingConfig, check_zero_stage

# Bytes per element of each number format (IEEE 754 binary32/binary16, bfloat16, OCP FP8 spec).
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True, slots=True, kw_only=True)
class StateLayout:
    """Bytes per parameter of each model-state copy on one rank before sharding, and which copies
    ZeRO/FSDP shard over the data-parallel ranks (:meth:`per_param` divides those by dp)."""

    compute_bytes: int
    """Element size of weights as the matmuls see them (2 for 16-bit and fp8 training, 4 for fp32)."""
    weight_bytes: float
    grad_bytes: float
    master_bytes: float
    optimizer_bytes: float
    shard_weights: bool
    shard_grads: bool
    shard_optimizer: bool
    """Master weights and optimizer states are sharded together (ZeRO stage >= 1)."""
    weight_cache_bytes: float
    """Per-parameter bytes of compute copies alive during a step (autocast cache, fp8 cache)."""
    grad_buffer_bytes: float
    """Per-parameter bytes of gradient communication buffers (DDP buckets)."""
    gathered_weight_bytes: int
    """Bytes per parameter of an unsharded (all-gathered) compute copy, for ZeRO-3/FSDP; 0 otherwise."""
    gathered_grad_bytes: int
    """Bytes per parameter of an unsharded gradient before its reduce-scatter (ZeRO-2/3, FSDP)."""
    transient_grad_bytes: int
    """Bytes per parameter of the autograd ``.grad`` made before it is folded into a persistent buffer."""

    def per_param(self, dp: int) -> tuple[float, float, float, float]:
        """(weights, grads, master weights, optimizer states) bytes per parameter at data parallelism dp."""
        w = self.weight_bytes / dp if self.shard_weights else self.weight_bytes
        g = self.grad_bytes / dp if self.shard_grads else self.grad_bytes
        shard = dp if self.shard_optimizer else 1
        return w, g, self.master_bytes / shard, self.optimizer_bytes / shard


def optimizer_state_bytes(optimizer: str) -> float:
    """fp32 optimizer state bytes per parameter (states kept in fp32 by every runtime modelled).

    Adam/AdamW: first and second moments (Kingma & Ba 2015). SGD with momentum: one buffer. Adafactor keeps
    a factored second moment (Shazeer & Stern 2018, Alg. 4) whose size is handled per matrix by the caller;
    here it counts as 0 per parameter.
    """
    return {"adamw": 8.0, "adam": 8.0, "sgd": 4.0, "adafactor": 0.0}[optimizer]


def fp8_param_gather(training: TrainingConfig, zero: int) -> bool:
    """Whether the run gathers its parameters in fp8 (``training.fp8_param_gather``; None: wherever it
    applies). It applies to Megatron-core fp8 with the distributed optimizer or Megatron FSDP
    (``--fp8-param-gather``: fp8 parameters) and to fsdp2 fp8 (torchao's ``enable_fsdp_float8_all_gather``,
    as torchtitan's ``float8.enable_fsdp_float8_all_gather`` sets it: the fp32 shard is cast to fp8 before
    the all-gather, so the gathered copy of a block is 1 byte per parameter)."""
    if training.precision != Precision.FP8 or training.fp8_param_gather is False:
        return False
    min_zero = profile(training.runtime).fp8_param_gather_min_zero
    return min_zero is not None and zero >= min_zero


def state_layout(training: TrainingConfig, parallel: ParallelConfig) -> StateLayout:
    """The :class:`StateLayout` of ``training.runtime`` at ``training.precision`` and ``zero_stage``."""
    check_zero_stage(training, parallel)
    return state_layout_for(
        training.runtime,
        training.precision,
        training.optimizer,
        parallel.zero_stage,
        parallel.dp > 1,
        fp8_param_gather(training, parallel.zero_stage),
    )


@functools.lru_cache(maxsize=256)
def state_layout_for(
    runtime: str, precision: str, optimizer: str, zero: int, data_parallel: bool, fp8_params: bool = False
) -> StateLayout:
    """The layout its profile names (``RuntimeProfile.state_layout``, the module docstring's list)."""
    mixed = precision != Precision.FP32
    compute = 4 if not mixed else 2
    opt = optimizer_state_bytes(optimizer)
    fp8_cache = profile(runtime).fp8_weight_cache_bytes if precision == Precision.FP8 else 0.0
    master = 4.0 if mixed else 0.0
    kind = profile(runtime).state_layout
    if kind == "distributed_optimizer":
        # zero_stage 2/3 = Megatron FSDP: the fp32 main_grad buffer and (3) the 16-bit weights sharded too.
        # fp8 parameters (--fp8-param-gather): the parameter itself is the fp8 copy (1 byte) and only its
        # transpose is cached (1 byte): Transformer Engine's Float8Tensor keeps ``_data`` and ``_transpose``.
        weight = 1 if fp8_params else compute
        return StateLayout(
            compute_bytes=compute, weight_bytes=weight, grad_bytes=4, master_bytes=master, optimizer_bytes=opt,
            shard_weights=zero >= 3, shard_grads=zero >= 2, shard_optimizer=zero >= 1,
            weight_cache_bytes=fp8_cache / 2 if fp8_params else fp8_cache, grad_buffer_bytes=0.0,
            gathered_weight_bytes=weight if zero >= 3 else 0, gathered_grad_bytes=4 if zero >= 2 else 0,
            transient_grad_bytes=compute,
        )  # fmt: skip
    if kind == "zero":
        return StateLayout(
            compute_bytes=compute, weight_bytes=compute, grad_bytes=compute, master_bytes=master,
            optimizer_bytes=opt, shard_weights=zero >= 3, shard_grads=zero >= 2, shard_optimizer=zero >= 1,
            weight_cache_bytes=fp8_cache, grad_buffer_bytes=0.0,
            gathered_weight_bytes=compute if zero >= 3 else 0, gathered_grad_bytes=compute if zero >= 2 else 0,
            transient_grad_bytes=0,
        )  # fmt: skip
    if kind == "fully_shard":
        # The fp32 sharded parameters are the master copy: no separate master weights.
        return StateLayout(
            compute_bytes=compute, weight_bytes=4, grad_bytes=4, master_bytes=0.0, optimizer_bytes=opt,
            shard_weights=True, shard_grads=True, shard_optimizer=True,
            weight_cache_bytes=fp8_cache, grad_buffer_bytes=0.0,
            gathered_weight_bytes=1 if fp8_params else compute, gathered_grad_bytes=4, transient_grad_bytes=0,
        )  # fmt: skip
    assert kind == "ddp_autocast", kind
    # hf: fp32 model under autocast; DDP buckets when data parallel.
    return StateLayout(
        compute_bytes=compute, weight_bytes=4, grad_bytes=4, master_bytes=0.0, optimizer_bytes=opt,
        shard_weights=False, shard_grads=False, shard_optimizer=False,
        weight_cache_bytes=(2.0 if mixed else 0.0) + fp8_cache, grad_buffer_bytes=4.0 if data_parallel else 0.0,
        gathered_weight_bytes=0, gathered_grad_bytes=0, transient_grad_bytes=0,
    )  # fmt: skip
