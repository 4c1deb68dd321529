"""MARP's CUDA-only terms and a rank's bound: the memory outside tensors (:class:`CudaTerms`, the shipped
:data:`DEFAULT_CUDA`), NCCL's buffers and the GEMM libraries' workspaces of a job, the reserved and
nvidia-smi totals of an allocated peak (:func:`cuda_totals`) and the rank's bound of parts
(:func:`stage_bound`, of the parts in :mod:`frenzy_opt.prediction.marp.bound`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from frenzy_opt.core.spec import JobSpec
from frenzy_opt.hardware.gpus import GpuType
from frenzy_opt.prediction.marp import bound
from frenzy_opt.prediction.marp.fit import SHIPPED_FIT, MemoryFit
from frenzy_opt.prediction.marp.stage_model import StageModel

MIB = 2**20


@dataclass(frozen=True, slots=True, kw_only=True)
class CudaTerms:
    """CUDA-only memory outside tensors. Defaults are public figures, calibratable from GPU runs."""

    fragmentation: float = 0.05
    """Reserved/allocated - 1 of the point prediction. The caching allocator rounds blocks to 2 MiB and
    splits them (PyTorch docs, "CUDA memory management"); GMLake (Guo et al., ASPLOS 2024, Fig. 2) measures
    5-30 % fragmentation in LLM training, the low end for static-shape training without offload."""
    context_bytes: int = 500 * MIB
    """CUDA context and kernel images, created at the first CUDA call (NVIDIA CUDA C++ Programming Guide,
    "Initialization"; typically 300-600 MiB with the PyTorch kernels loaded)."""
    workspaces: bool = True
    """Count the GEMM libraries' workspaces in the allocated peak (:func:`bound.library_workspace_bytes`)."""
    nccl: bool = True
    """Count NCCL's buffers per communicator (:func:`bound.nccl_buffer_bytes`)."""


def cuda_terms_of(fit: MemoryFit, family: str | None = None) -> CudaTerms:
    """The CUDA-only terms of a fit: its fragmentation and its CUDA context (what nvidia-smi shows beyond
    the allocator and NCCL). Public defaults when nothing was fitted."""
    if not fit.rows:
        return CudaTerms()
    return CudaTerms(fragmentation=fit.fragmentation, context_bytes=fit.context_of(family))


DEFAULT_CUDA = cuda_terms_of(SHIPPED_FIT)


def nccl_bytes(job: JobSpec, cuda: CudaTerms, gpu: GpuType | None) -> int:
    """NCCL's buffers of ``job``'s layout (:func:`bound.nccl_buffer_bytes`), 0 when switched off."""
    if not cuda.nccl:
        return 0
    return bound.nccl_buffer_bytes(job.training.runtime, job.parallel, gpu.intra_node if gpu is not None else None)


def workspace_bytes(job: JobSpec, cuda: CudaTerms | None, architecture: str | None) -> int:
    """The GEMM libraries' workspaces in the allocator (:func:`bound.library_workspace_bytes`), 0 on the CPU."""
    if cuda is None or not cuda.workspaces:
        return 0
    return bound.library_workspace_bytes(job.training.runtime, architecture)


def cuda_totals(allocated: int, cuda: CudaTerms | None, outside: int, capacity: int | None = None) -> tuple[int, int]:
    """(peak_reserved_bytes, device_used_bytes) from the allocated peak and the memory ``outside`` the
    allocator (CUDA context and NCCL buffers). On a GPU of ``capacity`` bytes the allocator's cache stops
    where the device ends: it frees cached segments and retries before it fails (``release_cached_blocks``,
    :mod:`frenzy_opt.prediction.marp.allocator`), so the fitted fragmentation never pushes a run over."""
    if cuda is None:
        return allocated, allocated
    reserved = int(allocated * (1 + cuda.fragmentation))
    if capacity is not None:
        reserved = max(allocated, min(reserved, capacity - outside))
    return reserved, reserved + outside


def stage_bound(
    model: StageModel,
    dp: int,
    runtime: str,
    fit: MemoryFit,
    *,
    cuda: CudaTerms | None,
    workspaces: int,
    nccl: int,
    with_reserve: bool = True,
    reserve_ratio: float | None = None,
    split: tuple[int, int] | None = None,
) -> bound.MemoryBound:
    """The rank's bound of parts (:mod:`frenzy_opt.prediction.marp.bound`). ``with_reserve=False`` leaves
    the allocator replay out (a lower figure the plan search refuses on before paying for the replay);
    ``reserve_ratio`` (reserve over the bounded allocated peak, from a replay of the same stage at another
    dp) stands in for the replay; ``split`` is :meth:`StageModel.split` at ``dp`` when the caller has it."""
    states, beyond = split if split is not None else model.split(dp)
    margin = fit.margin_of(runtime)
    rows = {
        "states": states,
        "activations": beyond,
        "activation_margin": math.ceil(margin * beyond) + fit.fixed_margin_of(runtime),
        "library_workspaces": workspaces,
        "allocator_reserve": 0,
        "cuda_context": 0,
        "nccl_buffers": 0,
        "cached_reserve": 0,
    }
    if cuda is not None:
        if with_reserve and reserve_ratio is not None:
            allocated = states + beyond + rows["activation_margin"] + workspaces
            rows["allocator_reserve"] = math.ceil(reserve_ratio * allocated)
        elif with_reserve:
            rows["allocator_reserve"] = bound.allocator_reserve_bytes(model.step_shape(dp, 1 + margin))
        rows["cuda_context"] = cuda.context_bytes
        rows["nccl_buffers"] = nccl
        allocated = states + beyond + rows["activation_margin"] + workspaces
        rows["cached_reserve"] = math.ceil(fit.cached_fraction * allocated)
    return bound.MemoryBound(rows)
