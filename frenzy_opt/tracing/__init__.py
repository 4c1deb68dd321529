"""The trace path: what the real runtimes (torchtitan, Megatron-core) allocate in a training step.

:mod:`frenzy_opt.tracing.recorder` records tensor-storage allocations and frees (``MemEvent``) while a
step runs under ``FakeTensorMode``; :func:`trace_job` (:mod:`frenzy_opt.tracing.trace`) builds a job's
rank on the real runtime and records its steps. See docs/trace-path.md.
"""

from frenzy_opt.tracing.recorder import AllocationRecorder, Trace, base_phase

__all__ = ["AllocationRecorder", "Trace", "base_phase"]
