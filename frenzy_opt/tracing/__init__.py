"""The trace path: what the real runtimes (torchtitan, Megatron-core) allocate in a training step.

:mod:`frenzy_opt.tracing.recorder` records tensor-storage allocations and frees (``MemEvent``) while a
step runs under ``FakeTensorMode``; :func:`trace_job` builds a job's rank on the real runtime and records
its steps (torchtitan and megatron-core are imported only when a job is traced). See docs/trace-path.md.
"""

from frenzy_opt.tracing.common import StageTrace, TraceResult
from frenzy_opt.tracing.recorder import AllocationRecorder, Trace, base_phase
from frenzy_opt.tracing.trace import TRACE_RUNTIMES, trace_job

__all__ = ["TRACE_RUNTIMES", "AllocationRecorder", "StageTrace", "Trace", "TraceResult", "base_phase", "trace_job"]
