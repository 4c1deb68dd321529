"""The training worker: ``torchrun … -m frenzy_opt.launch.worker.train --job JOB.json --plan PLAN.json`` trains the
reference decoder (``models/reference.py``) of a job spec with the parallel plan frenzy-opt chose.

Parallelism, on a device mesh ``(pp, dp, tp)`` (``torch.distributed.device_mesh``):

* **tp** — tensor parallelism with DTensor (``torch.distributed.tensor.parallel``): attention's q/k/v and
  the MLP's up/gate column-wise, attention's output and the MLP's down row-wise (Megatron-LM's split,
  Shoeybi et al. 2019, §3); each rank then holds ``heads / tp`` heads. Embedding, norms and output stay
  replicated across tp — unless ``sequence_parallel``: then norms run on sequence shards, the embedding is
  vocabulary-parallel and the head gathers the sequence (Korthikanti et al. 2022, :func:`apply_tp`).
* **pp / vpp** — pipeline parallelism with ``torch.distributed.pipelining``: the model's layers are split
  into ``pp x vpp`` chunks (uneven remainder to the first, as MARP assumes), chunk ``c`` on pipeline rank
  ``c % pp``; each rank cuts its chunks from the full seeded model (so every layout starts from the same
  weights) and runs 1F1B (GPipe with ``--schedule gpipe``), or interleaved 1F1B when ``vpp > 1``, over the
  step's micro-batches.
* **dp / ZeRO** — ``zero_stage`` 0: replicated weights, gradients all-reduced over the dp group (PyTorch DDP
  when the model is neither tensor- nor pipeline-parallel; an explicit all-reduce otherwise, since DDP around
  DTensor modules fails); 1: DDP + ``ZeroRedundancyOptimizer`` (optimizer states sharded; ZeRO-1); 2: FSDP2
  ``fully_shard(reshard_after_forward=False)`` (gradients and optimizer states sharded, weights kept between
  forward and backward; ZeRO-2); 3: FSDP2 ``fully_shard`` (everything sharded; ZeRO-3). FSDP2 composes with tp
  on the 2-D ``(dp, tp)`` mesh (HSDP-style) and with pp as torchtitan runs it: ``fully_shard`` on each block
  and on each pipeline chunk over its stage's dp slice of the mesh, the pipeline schedule across pp.
* **recompute** — the reference decoder's activation checkpointing (selective: attention core; full: every
  block). **Micro-batching** — ``global_batch = micro_batch x num_micro x dp``; gradients accumulate over the
  micro-batches (the pipeline schedule does it for pp > 1).

Data: synthetic sequences (a random start, then +1 per position modulo the vocabulary: learnable, so the
loss falls) drawn per step from the seed, identical for every layout; or windows of a token file (``--tokens``,
a flat uint16/uint32 array). Every ``--checkpoint-every`` steps the model and optimizer state are saved with
``torch.distributed.checkpoint`` (sharded, per pipeline stage); a restarted run resumes from the newest
complete checkpoint. Rank 0 writes one JSON line per step to ``--report`` (loss averaged over the global
batch, step time, tokens per second) and, once, every rank's measured peak memory: ``torch.cuda``'s peak
allocated bytes on GPU, MemTracker's peak of live tensor storage on CPU (the measurement the MARP validation
uses). Backend: nccl with CUDA, gloo without.

Several plans of one world size can be trained one after another in one process group (``--plan`` holding a
list): every report line then carries ``run``, the plan's index.

Teardown: every layout ends with its pending communication waited for and a barrier, then every reference
this rank holds to its model, optimizer, pipeline and device mesh dropped (with the DTensor caches that keep
meshes alive) and the mesh's process groups destroyed; the run ends with a barrier and the default group
destroyed. A gloo process group's worker and transport threads stop only when its last reference goes, so a
group that outlived ``destroy_process_group`` would be torn down during interpreter finalization, racing the
peers' exits (``terminate called without an active exception``); the worker checks that no gloo thread is
left and says so on stderr otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import importlib
import json
import math
import os
import resource
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from frenzy_opt.core.partition import chunk_layer_counts
from frenzy_opt.core.spec import JobSpec, ParallelConfig, check_runtime, parse_job, plan_layout
from frenzy_opt.launch.worker.support import worker_supports
from frenzy_opt.models.reference import ReferenceDecoder

SUPPORTED = "dp, tp (+ sequence parallel), pp, vpp, zero_stage 0-3, recompute, micro-batching (cp and ep are not)"


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Where this rank sits: its coordinates on the (pp, dp, tp) mesh."""

    rank: int
    world: int
    pp: int
    dp: int
    tp: int
    stage: int
    dp_rank: int
    tp_rank: int


def check_plan(job: JobSpec, parallel: ParallelConfig, micro_batch_size: int, world: int) -> int:
    """The number of micro-batches per step; ``ValueError`` names what this worker cannot run."""
    per_step = micro_batch_size * parallel.dp
    num_micro = job.training.num_micro_batches(parallel.dp, micro_batch_size)
    # The same rule the executors' filter applies (worker_supports), with this step's micro-batch count.
    reason = worker_supports(parallel, job.model, num_micro)
    if reason is not None:
        raise ValueError(f"train: the worker runs {SUPPORTED}; not {reason}")
    try:  # the job's runtime's row of frenzy_opt.core.runtimes.CAPABILITIES: what the job asked to run on
        check_runtime(job.training, parallel)
    except ValueError as err:
        raise ValueError(f"train: {err}") from None
    if parallel.num_gpus != world:
        raise ValueError(f"train: plan needs dp x tp x pp = {parallel.num_gpus} ranks, torchrun started {world}")
    arch = job.model
    if arch.num_attention_heads % parallel.tp or arch.num_kv_heads % parallel.tp or arch.ffn_hidden_size % parallel.tp:
        raise ValueError(f"train: tp={parallel.tp} must divide heads, kv heads and ffn of the model")
    if job.training.global_batch_size % per_step:
        raise ValueError(
            f"train: global_batch_size {job.training.global_batch_size} must be a multiple of "
            f"micro_batch_size x dp = {per_step}"
        )
    return num_micro


def build_full_model(job: JobSpec, seed: int) -> ReferenceDecoder:
    """The whole model, seeded: every layout starts from these weights."""
    torch.manual_seed(seed)
    return ReferenceDecoder(
        job.model,
        attention=job.parallel.attention,
        recompute=job.parallel.recompute,
        max_seq_len=job.training.seq_len,
    )


def cut_chunk(model: ReferenceDecoder, chunk: int, pp: int, vpp: int = 1) -> ReferenceDecoder:
    """Keep only model chunk ``chunk``'s layers (of ``pp x vpp`` chunks; chunk c lives on pipeline rank
    ``c % pp``, Narayanan et al. 2021 §2.2) — and the embedding on the first chunk, the head on the last."""
    chunks = pp * vpp
    if chunks == 1:
        return model
    counts = chunk_layer_counts(len(model.layers), pp, vpp)
    first = sum(counts[:chunk])
    model.layers = nn.ModuleList(list(model.layers)[first : first + counts[chunk]])
    if chunk > 0:
        model.embed = None
        model.pos_embed = None
    if chunk < chunks - 1:
        model.final_norm = None
        model.output = None
    return model


def apply_tp(model: ReferenceDecoder, mesh: Any, tp: int, sequence_parallel: bool = False) -> None:
    """Megatron's column/row split of every block over the tp mesh (module docstring). With
    ``sequence_parallel`` (Korthikanti et al. 2022, §4.2.2) the residual stream between the tensor-parallel
    regions is sharded along the sequence: norms run on ``s / tp`` tokens, the attention and MLP inputs are
    all-gathered and their outputs reduce-scattered; the embedding becomes vocabulary-parallel and the head
    gathers the sequence back."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    if tp == 1:
        return
    for block in model.layers:
        out = {"output_layouts": Shard(1), "use_local_output": False} if sequence_parallel else {}
        plan: dict[str, Any] = {
            "attn.wq": ColwiseParallel(),
            "attn.wk": ColwiseParallel(),
            "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(**out),
            "mlp.up": ColwiseParallel(),
            "mlp.down": RowwiseParallel(**out),
        }
        if getattr(block.mlp, "gate", None) is not None:
            plan["mlp.gate"] = ColwiseParallel()
        if sequence_parallel:
            plan["norm1"] = SequenceParallel()
            plan["norm2"] = SequenceParallel()
            plan["attn"] = PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None))
            plan["mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        parallelize_module(block, mesh, plan)
        block.attn.num_heads //= tp  # the local outputs hold heads / tp heads
        block.attn.num_kv_heads //= tp
    if sequence_parallel:
        top: dict[str, Any] = {}
        if model.embed is not None:
            top["embed"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False)
        if model.final_norm is not None and model.output is not None:
            top["final_norm"] = SequenceParallel()
            top["output"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
        parallelize_module(model, mesh, top)


def batch_for(step: int, job: JobSpec, seed: int, tokens: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of a step (inputs, targets), the same for every layout (module docstring)."""
    t = job.training
    rng = np.random.default_rng([seed, step])
    vocab = job.model.vocab_size
    if tokens is None:
        starts = rng.integers(0, vocab, size=(t.global_batch_size, 1))
        seq = (starts + np.arange(t.seq_len + 1)) % vocab
    else:
        offsets = rng.integers(0, len(tokens) - t.seq_len - 1, size=t.global_batch_size)
        seq = np.stack([tokens[o : o + t.seq_len + 1] for o in offsets]).astype(np.int64) % vocab
    data = torch.from_numpy(seq.astype(np.int64))
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


class Worker:
    """One rank of a training run."""

    def __init__(self, job: JobSpec, parallel: ParallelConfig, micro_batch_size: int, args: argparse.Namespace) -> None:
        self.job, self.parallel, self.args = job, parallel, args
        self.micro = micro_batch_size
        self.cuda = torch.cuda.is_available() and not args.cpu
        rank, world = dist.get_rank(), dist.get_world_size()
        self.num_micro = check_plan(job, parallel, micro_batch_size, world)
        self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if self.cuda else torch.device("cpu")
        if self.cuda:
            torch.cuda.set_device(self.device)
        from torch.distributed.device_mesh import init_device_mesh

        p = parallel
        self.mesh = init_device_mesh(self.device.type, (p.pp, p.dp, p.tp), mesh_dim_names=("pp", "dp", "tp"))
        self.layout = Layout(
            rank=rank,
            world=world,
            pp=p.pp,
            dp=p.dp,
            tp=p.tp,
            stage=self.mesh.get_local_rank("pp"),
            dp_rank=self.mesh.get_local_rank("dp"),
            tp_rank=self.mesh.get_local_rank("tp"),
        )
        self.dp_group = self.mesh.get_group("dp")
        # This rank's model chunks: one per pipeline stage, vpp of them with interleaving (c = stage + k pp).
        chunk_ids = [c for c in range(p.pp * p.vpp) if c % p.pp == self.layout.stage]
        full = build_full_model(job, args.seed)
        modules = [cut_chunk(copy.deepcopy(full) if len(chunk_ids) > 1 else full, c, p.pp, p.vpp) for c in chunk_ids]
        for module in modules:
            module.to(self.device)
            apply_tp(module, self.mesh["tp"], p.tp, p.sequence_parallel)
        self.chunks = list(zip(chunk_ids, modules, strict=True))
        model: Any = modules[0] if len(modules) == 1 else nn.ModuleDict({f"chunk{c}": m for c, m in self.chunks})
        self.module: nn.Module = model
        self.model = model
        self.manual_allreduce = False
        self.pending: list[Any] = []  # async work handles not yet waited for (dist.Work)
        if p.zero_stage >= 2:
            from torch.distributed.fsdp import fully_shard

            # Per pipeline chunk (torchtitan's FSDP x PP): each block, then the chunk as its root, sharded over
            # this stage's dp slice of the mesh; ZeRO-3 reshards the weights after forward, ZeRO-2 keeps them.
            dp_mesh = self.mesh["dp"]
            for module in modules:
                for block in module.layers:
                    fully_shard(block, mesh=dp_mesh, reshard_after_forward=p.zero_stage == 3)
                fully_shard(module, mesh=dp_mesh, reshard_after_forward=p.zero_stage == 3)
        elif p.dp > 1 and p.tp == 1 and p.pp == 1:
            self.module = nn.parallel.DistributedDataParallel(model, process_group=self.dp_group)
        elif p.dp > 1:
            self.manual_allreduce = True
        params = [q for q in model.parameters() if q.requires_grad]
        if p.zero_stage == 1 and p.dp > 1:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            self.zero1: Any = ZeroRedundancyOptimizer(
                params, optimizer_class=torch.optim.AdamW, process_group=self.dp_group, lr=args.lr
            )
            self.optimizer: torch.optim.Optimizer = self.zero1
        else:
            self.zero1 = None
            self.optimizer = torch.optim.AdamW(params, lr=args.lr)
        self.schedule: Any = None
        if p.pp > 1:
            self._build_pipeline()
        self.tokens = None if args.tokens is None else np.memmap(args.tokens, dtype=args.token_dtype, mode="r")

    def _build_pipeline(self) -> None:
        from torch.distributed.pipelining import (
            PipelineStage,
            Schedule1F1B,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
        )

        num_stages = self.layout.pp * self.parallel.vpp
        stages = [
            PipelineStage(module, chunk, num_stages, self.device, group=self.mesh.get_group("pp"))
            for chunk, module in self.chunks
        ]
        vocab = self.job.model.vocab_size

        def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(logits.float().view(-1, vocab), targets.reshape(-1))

        if self.parallel.vpp > 1:  # interleaved 1F1B over the rank's chunks (Narayanan et al. 2021 §2.2)
            self.schedule = ScheduleInterleaved1F1B(stages, n_microbatches=self.num_micro, loss_fn=loss_fn)
        else:
            kind = ScheduleGPipe if self.args.schedule == "gpipe" else Schedule1F1B
            self.schedule = kind(stages[0], n_microbatches=self.num_micro, loss_fn=loss_fn)

    # --- one step ---------------------------------------------------------------------------------------

    def _local_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = batch_for(step, self.job, self.args.seed, self.tokens)
        per_rank = self.micro * self.num_micro
        lo = self.layout.dp_rank * per_rank
        return inputs[lo : lo + per_rank].to(self.device), targets[lo : lo + per_rank].to(self.device)

    def step(self, step: int, tracker: Any = None) -> float:
        """One optimizer step over the global batch; the loss averaged over it (the same on every rank).
        ``tracker``: a MemTracker whose per-module statistics are reset before each micro-batch (it refuses
        repeated calls of a module otherwise; its global peak is kept)."""
        inputs, targets = self._local_batch(step)
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=self.device)
        if self.schedule is not None:
            losses: list[torch.Tensor] = []
            last = self.layout.stage == self.layout.pp - 1
            if self.layout.stage == 0:
                self.schedule.step(inputs, target=targets if last else None, losses=losses)
            else:
                self.schedule.step(target=targets if last else None, losses=losses)
            if last:
                loss_sum = torch.stack([x.detach() for x in losses]).sum()
        else:
            for m in range(self.num_micro):
                sl = slice(m * self.micro, (m + 1) * self.micro)
                sync = m == self.num_micro - 1 or not isinstance(self.module, nn.parallel.DistributedDataParallel)
                context = self.module.no_sync() if not sync else contextlib.nullcontext()  # type: ignore[operator]
                if tracker is not None:
                    tracker.reset_mod_stats()
                with context:
                    loss = self.module(inputs[sl], targets[sl]) / self.num_micro
                    loss.backward()
                loss_sum += loss.detach() * self.num_micro
        if self.manual_allreduce:
            reduced = []
            for q in self.model.parameters():
                if q.grad is not None:
                    local = q.grad.to_local() if hasattr(q.grad, "to_local") else q.grad
                    self.pending.append(dist.all_reduce(local, group=self.dp_group, async_op=True))
                    reduced.append(local)
            self.wait_pending()
            for local in reduced:
                local.div_(self.layout.dp)
        self.optimizer.step()
        # The mean loss over the global batch: the last stage holds it; sum over dp, divide by micro-batches.
        total = loss_sum.detach().float().reshape(1)
        dist.all_reduce(total)  # ranks without the loss add 0
        holders = self.layout.dp * self.layout.tp
        return float(total.item()) / (holders * self.num_micro)

    def wait_pending(self) -> None:
        """Wait for every async work handle this rank issued and has not waited for yet."""
        while self.pending:
            self.pending.pop(0).wait()

    # --- teardown ---------------------------------------------------------------------------------------

    def close(self, clean: bool) -> None:
        """End this layout (module docstring, *Teardown*): on a clean end wait for the pending work and meet
        the other ranks at a barrier; then drop every reference to the model, optimizer, pipeline and mesh,
        release the DTensor caches that hold meshes, and destroy the mesh's process groups (not the default
        group). After an error no barrier: a peer may be gone."""
        groups: dict[str, Any] = {}
        world = dist.group.WORLD
        for group in self.mesh.get_all_groups():
            if world is None or group.group_name != world.group_name:
                groups.setdefault(group.group_name, group)
        if clean:
            self.wait_pending()
            dist.barrier()
        self.pending.clear()
        for name in ("schedule", "optimizer", "zero1", "module", "model", "chunks", "dp_group", "mesh", "tokens"):
            setattr(self, name, None)
        release_dtensor_caches()
        gc.collect()
        for group in reversed(list(groups.values())):
            dist.destroy_process_group(group)
        groups.clear()
        gc.collect()

    # --- checkpoints ------------------------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {f"stage{self.layout.stage}": {"model": model_sd, "optim": optim_sd}}

    def save(self, step: int) -> None:
        """A checkpoint of this step: DCP (sharded) for every layout but ZeRO-1, whose optimizer is
        consolidated on rank 0 and saved with the (replicated) model by ``torch.save``."""
        import torch.distributed.checkpoint as dcp

        target = Path(self.args.checkpoint_dir) / f"step-{step:08d}"
        if self.zero1 is not None:
            self.zero1.consolidate_state_dict(to=0)
            if dist.get_rank() == 0:
                target.mkdir(parents=True, exist_ok=True)
                state = {"model": self.model.state_dict(), "optim": self.zero1.state_dict()}
                torch.save(state, target / "zero1.pt")
        else:
            dcp.save(self._state(), checkpoint_id=str(target))
        dist.barrier()
        if dist.get_rank() == 0:
            (target / "layout.json").write_text(self._layout_key(), encoding="utf-8")
            (target / "COMPLETE").write_text(str(step), encoding="utf-8")
        dist.barrier()

    def _layout_key(self) -> str:
        """What a checkpoint must match to be resumed: the parallel layout and micro-batch size (sharded
        states do not load into another layout's pipeline stages)."""
        return json.dumps({"parallel": self.parallel.to_dict(), "micro_batch_size": self.micro}, sort_keys=True)

    def resume(self) -> int:
        """Load the newest complete checkpoint; the step to continue from (0 without one)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        root = Path(self.args.checkpoint_dir)
        done = sorted(p for p in root.glob("step-*") if (p / "COMPLETE").is_file()) if root.is_dir() else []
        done = [p for p in done if (p / "layout.json").read_text(encoding="utf-8") == self._layout_key()]
        if not done:
            return 0
        if self.zero1 is not None:
            state = torch.load(done[-1] / "zero1.pt", map_location=self.device, weights_only=False)
            self.model.load_state_dict(state["model"])
            self.zero1.load_state_dict(state["optim"])
        else:
            full = self._state()
            dcp.load(full, checkpoint_id=str(done[-1]))
            part = full[f"stage{self.layout.stage}"]
            set_state_dict(self.model, self.optimizer, model_state_dict=part["model"], optim_state_dict=part["optim"])
        return int((done[-1] / "COMPLETE").read_text(encoding="utf-8"))

    # --- memory -----------------------------------------------------------------------------------------

    def measured_step(self, step: int) -> tuple[float, int, str]:
        """A step whose peak memory is measured (module docstring): the loss, the peak in bytes, and how it
        was measured. MemTracker follows plain, DDP and tensor-parallel modules; under FSDP2 and pipelining
        (parameters and buffers it cannot attribute) the process's peak resident set size is reported instead,
        marked ``max_rss`` (it includes the runtime, so it does not compare with MARP)."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            loss = self.step(step)
            return loss, int(torch.cuda.max_memory_allocated(self.device)), "torch.cuda.max_memory_allocated"
        if self.parallel.pp == 1 and self.parallel.zero_stage < 2:
            from torch.distributed._tools.mem_tracker import MemTracker

            tracker = MemTracker()
            tracker.track_external(self.model, self.optimizer)
            with _mod_tracker_hooks_removed_after(), tracker:
                loss = self.step(step, tracker)
            return loss, int(tracker.get_tracker_snapshot("peak")[self.device]["Total"]), "MemTracker"
        loss = self.step(step)
        return loss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "max_rss"


def release_dtensor_caches() -> None:
    """Clear DTensor's sharding-propagation, redistribution and mesh-topology caches: their keys hold
    ``DTensorSpec``s, every spec its device mesh, and a mesh its process groups (``DeviceMesh._pg_registry``)."""
    from torch.distributed.tensor import DTensor, debug
    from torch.distributed.tensor._collective_utils import MeshTopoInfo
    from torch.distributed.tensor._redistribute import _gen_transform_infos, clear_redistribute_planner_cache

    debug._clear_sharding_prop_cache()
    DTensor._op_dispatcher.sharding_propagator._propagate_tensor_meta_cached.cache_clear()
    _gen_transform_infos.cache_clear()
    clear_redistribute_planner_cache()
    MeshTopoInfo.build_from_mesh.cache_clear()


@contextlib.contextmanager
def _mod_tracker_hooks_removed_after() -> Iterator[None]:
    """Remove the multi-grad hooks MemTracker's ModTracker registers on module inputs and outputs once the
    measured step is done. It never removes them, and each hook's closure holds the ``grad_fn`` of the tensor
    it is registered on: a reference cycle through autograd's C++ nodes that the garbage collector cannot see,
    so the step's graph — and through it the parameters (under tp DTensors, with their device mesh and its
    process groups) — would outlive the run."""
    from torch.distributed._tools import mod_tracker

    register = mod_tracker.register_multi_grad_hook
    handles: list[Any] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        handle = register(*args, **kwargs)
        handles.append(handle)
        return handle

    mod_tracker.register_multi_grad_hook = recording
    try:
        yield
    finally:
        mod_tracker.register_multi_grad_hook = register
        for handle in handles:
            handle.remove()


def _import_world_defaults(plans: list[tuple[JobSpec, ParallelConfig]]) -> None:
    """Import, before ``init_process_group``, the torch modules that bind ``group.WORLD`` as a default argument
    when they are imported: imported later (DDP, ZeRO-1) they hold the default process group past
    ``destroy_process_group`` and its gloo threads run on until interpreter exit."""
    importlib.import_module("torch.distributed.nn.functional")
    if any(p.zero_stage == 1 and p.dp > 1 for _, p in plans):
        importlib.import_module("torch.distributed.optim.zero_redundancy_optimizer")


_GLOO_THREADS = ("gloo_tcp_loop", "pt_gloo_runloop")


def lingering_threads() -> list[str]:
    """The Python threads other than the main one and the gloo threads (``/proc``, Linux) still alive."""
    names = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    tasks = Path("/proc/self/task")
    if tasks.is_dir():
        for task in tasks.iterdir():
            with contextlib.suppress(OSError):
                name = (task / "comm").read_text(encoding="utf-8").strip()
                if name in _GLOO_THREADS:
                    names.append(name)
    return sorted(names)


def _load_plans(job: JobSpec, path: str) -> list[tuple[JobSpec, ParallelConfig]]:
    """The plans of ``--plan``: one plan mapping (:func:`frenzy_opt.core.spec.plan_layout`) or a list of them."""
    loaded = json.loads(Path(path).read_text(encoding="utf-8"))
    plans = []
    for plan in loaded if isinstance(loaded, list) else [loaded]:
        parallel, micro_batch_size = plan_layout(plan)
        plans.append((job.with_parallel(parallel, micro_batch_size), parallel))
    if not plans:
        raise ValueError(f"train: {path} holds no plan")
    return plans


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m frenzy_opt.launch.worker.train", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--job", required=True, help="job spec (contract 1, JSON or YAML)")
    parser.add_argument(
        "--plan",
        required=True,
        help="JSON: a plan ({parallel: {...}, micro_batch_size: n, ...}, as `frenzy plan --json` prints one), "
        "or a list of them trained in turn in one process group",
    )
    parser.add_argument("--steps", type=int, help="steps to train (default: the spec's train_steps)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b")
    parser.add_argument("--tokens", help="flat token file (numpy raw array) instead of synthetic data")
    parser.add_argument("--token-dtype", default="uint16", choices=("uint16", "uint32"))
    parser.add_argument(
        "--checkpoint-dir",
        help="save here every --checkpoint-every steps and resume from it (run-<i>/ per plan with several plans)",
    )
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--report", help="rank 0 appends one JSON line per step here (default: stdout)")
    parser.add_argument("--measure-step", type=int, default=2, help="the step whose peak memory is measured")
    parser.add_argument("--cpu", action="store_true", help="use gloo on CPU even if CUDA is present")
    parser.add_argument("--fail-at-step", type=int, default=-1, help="testing: rank --fail-rank exits at this step")
    parser.add_argument("--fail-rank", type=int, default=-1)
    args = parser.parse_args(argv)
    from frenzy_opt.core.spec import load_mapping

    plans = _load_plans(parse_job(load_mapping(args.job)), args.plan)
    backend = "nccl" if torch.cuda.is_available() and not args.cpu else "gloo"
    _import_world_defaults(plans)
    dist.init_process_group(backend=backend)
    clean = False
    try:
        for index, (job, parallel) in enumerate(plans):
            run_args = copy.copy(args)
            if run_args.steps is None:
                run_args.steps = job.training.train_steps
            if args.checkpoint_dir and len(plans) > 1:
                run_args.checkpoint_dir = str(Path(args.checkpoint_dir) / f"run-{index}")
            tag = {"run": index} if len(plans) > 1 else {}
            train_layout(job, parallel, run_args, backend, tag)
        clean = True
    finally:
        if clean:
            dist.barrier()
        dist.destroy_process_group()
        gc.collect()
        left = lingering_threads()
        if left:
            print(
                f"train: rank {os.environ.get('RANK', '?')}: threads still alive after destroy_process_group "
                f"(a process group or worker thread outlived the run): {', '.join(left)}",
                file=sys.stderr,
                flush=True,
            )
    return 0


def train_layout(
    job: JobSpec, parallel: ParallelConfig, args: argparse.Namespace, backend: str, tag: dict[str, Any]
) -> None:
    """Train one plan in the initialized process group; its report lines carry ``tag``; its own process
    groups are gone when it returns (:meth:`Worker.close`)."""
    worker = Worker(job, parallel, job.training.micro_batch_size, args)
    clean = False
    try:
        first = worker.resume() if args.checkpoint_dir else 0
        report = _Reporter(args.report if dist.get_rank() == 0 else None, tag)
        report.write(
            {
                "event": "start",
                "resumed_from": first,
                "world": dist.get_world_size(),
                "backend": backend,
                "plan": parallel.to_dict(),
                "micro_batch_size": worker.micro,
                "num_micro": worker.num_micro,
            }
        )
        tokens_per_step = job.training.global_batch_size * job.training.seq_len
        for step in range(first, args.steps):
            if step == args.fail_at_step and dist.get_rank() == args.fail_rank:
                os._exit(17)  # a rank dies mid-run (tests of the executor's failure handling)
            started = time.perf_counter()
            if step == args.measure_step or (step == first and first > args.measure_step):
                loss, peak, source = worker.measured_step(step)
                peaks: list[Any] = [None] * dist.get_world_size()
                dist.all_gather_object(peaks, peak)
                report.write({"event": "memory", "step": step + 1, "peak_memory_bytes": peaks, "source": source})
            else:
                loss = worker.step(step)
            elapsed = time.perf_counter() - started
            report.write({"event": "step", "step": step + 1, "loss": loss, "step_time_s": elapsed,
                          "tokens_per_s": tokens_per_step / elapsed})  # fmt: skip
            if dist.get_rank() == 0:  # the run's log (frenzy logs) in words; the report is for the scheduler
                print(f"step {step + 1}/{args.steps} loss {loss:.4f} ({elapsed:.3f} s)", flush=True)
            if not math.isfinite(loss):
                raise RuntimeError(f"loss is {loss} at step {step + 1}")
            if args.checkpoint_dir and (step + 1) % args.checkpoint_every == 0:
                worker.save(step + 1)
        report.write({"event": "end", "steps": args.steps})
        if dist.get_rank() == 0:
            print(f"completed {args.steps} steps", flush=True)
        clean = True
    finally:
        worker.close(clean)


class _Reporter:
    def __init__(self, path: str | None, tag: dict[str, Any] | None = None) -> None:
        self.path = path
        self.tag = tag or {}
        self.active = dist.get_rank() == 0

    def write(self, record: dict[str, Any]) -> None:
        if not self.active:
            return
        line = json.dumps({**record, **self.tag, "time": time.time()})
        if self.path is None:
            print(f"FRENZY_REPORT {line}", flush=True)
        else:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(line + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
