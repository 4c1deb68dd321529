"""``trace_job``: a job's rank per pipeline stage built on its real runtime, its steps recorded."""

from __future__ import annotations

from frenzy_opt.core.enums import Runtime
from frenzy_opt.core.spec import JobSpec
from frenzy_opt.tracing.common import StageTrace, TraceResult

TRACE_RUNTIMES = ("fsdp2", "megatron")


def trace_stages(job: JobSpec, stage: int | None) -> list[int]:
    """The stages traced: the one given, else the first and the last (where MARP's peak can be)."""
    pp = job.parallel.pp
    if stage is not None:
        if not 0 <= stage < pp:
            raise ValueError(f"stage must be in 0..{pp - 1}, got {stage}")
        return [stage]
    return sorted({0, pp - 1})


def trace_job(
    job: JobSpec,
    *,
    stage: int | None = None,
    steps: int = 2,
    max_microbatches: int | None = None,
    options: object | None = None,
    fake: bool = True,
) -> TraceResult:
    """Run ``steps`` training steps of ``job`` on its runtime's own code under ``FakeTensorMode`` and fake
    process groups, one rank (dp/tp/cp/ep rank 0) per traced pipeline stage, recording every storage
    allocation and free (:class:`frenzy_opt.tracing.recorder.AllocationRecorder`).

    ``training.runtime`` "fsdp2" runs torchtitan 0.3.0 (:mod:`frenzy_opt.tracing.titan`, ``options`` a
    ``TitanOptions``), "megatron" runs megatron-core 0.16.1 (:mod:`frenzy_opt.tracing.mcore`, ``options`` a
    ``McoreOptions``). A step runs ``min(micro-batches per step, max_microbatches or pp + 1)`` micro-batches:
    the peak repeats after the first one without pipelining and after 1F1B's warm-up with it.
    ``fake=False`` executes the step for real on the CPU (small models only): the same events must come out.
    """
    runtime = job.training.runtime
    results: list[StageTrace] = []
    for s in trace_stages(job, stage):
        if runtime == Runtime.FSDP2:
            from frenzy_opt.tracing import titan

            results.append(
                titan.trace_stage(job, s, steps=steps, opts=options, max_microbatches=max_microbatches, fake=fake)  # type: ignore[arg-type]
            )
        elif runtime == Runtime.MEGATRON:
            from frenzy_opt.tracing import mcore

            results.append(
                mcore.trace_stage(job, s, steps=steps, opts=options, max_microbatches=max_microbatches, fake=fake)  # type: ignore[arg-type]
            )
        else:
            raise ValueError(f"trace_job: training.runtime must be one of {', '.join(TRACE_RUNTIMES)}, got {runtime!r}")
    return TraceResult(job_name=job.name, runtime=runtime, stages=tuple(results))
