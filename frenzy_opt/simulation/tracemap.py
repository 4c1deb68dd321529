"""Trace jobs -> LLM training jobs, and the request a user would make for each job on a plain cluster.

Published heterogeneity studies replay DL-era traces by mapping each trace job to a model class of matching
GPU-time (Sia, SOSP 2023 §6: S < 1, M 1–10, L 10–100, XL > 100 GPU-hours). frenzy-opt does the same with
LLMs from its catalogue:

1. the trace job's class picks a model from the class's mix (seeded); a model no GPU type of the cluster can
   hold is dropped from the mix, and a class with no model left falls back to the next smaller class;
2. the *request* is what the user would have asked for: the trace's GPU count on the cluster's most common
   GPU type that holds the model, raised to the fewest GPUs that fit its memory, among the counts users
   ask for (powers of two inside a server, whole servers beyond);
3. the job's ``train_steps`` are set so that it keeps the trace job's GPU-time on that request:
   steps = GPU-seconds / (request GPUs x predicted step time), at least 1.

The request is what the ``fifo`` and ``gavel`` baselines run (users pick hardware by hand); ``frenzy`` and
``sia`` choose their own.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from frenzy_opt.core.enums import Precision
from frenzy_opt.core.spec import JobSpec, TrainingConfig
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.models.catalog import load_catalog
from frenzy_opt.planning.problem import Option, OptionCache
from frenzy_opt.planning.scenario import Request, Scenario, ScenarioJob
from frenzy_opt.planning.workload import SIZE_CLASSES, TraceJob, WorkloadSpec, size_class, trace_of

# Default class -> model mix: parameters grow with the class (S: < 1 B, M: 1-3 B, L: 7-8 B, XL: 13-70 B).
DEFAULT_MIX: dict[str, dict[str, float]] = {
    "S": {"gpt3-125m": 1.0, "gpt3-350m": 1.0, "qwen2.5-0.5b": 1.0},
    "M": {"gpt3-1.3b": 1.0, "gpt3-2.7b": 1.0},
    "L": {"llama3-8b": 1.0, "mistral-7b": 1.0, "qwen2.5-7b": 1.0, "llama2-7b": 1.0},
    "XL": {"llama2-13b": 1.0, "gpt3-13b": 1.0, "llama3-70b": 1.0},
}
# Training settings per class: longer context and larger global batches for larger models (LLaMA-2 used
# 4,096 tokens x 4 M-token batches for 7-70 B, Touvron et al. 2023 §2.2; GPT-3 small models 2,048 tokens).
CLASS_TRAINING: dict[str, TrainingConfig] = {
    "S": TrainingConfig(seq_len=2048, global_batch_size=256, precision=Precision.BF16),
    "M": TrainingConfig(seq_len=2048, global_batch_size=512, precision=Precision.BF16),
    "L": TrainingConfig(seq_len=4096, global_batch_size=256, precision=Precision.BF16),
    "XL": TrainingConfig(seq_len=4096, global_batch_size=512, precision=Precision.BF16),
}


def default_request(per_count: dict[tuple[str, int], Option], topology: Topology, wanted: int) -> Request | None:
    """The request a user would make for ``wanted`` GPUs (module docstring, step 2), or None if the job
    fits no GPU type."""
    types = sorted(topology.gpu_types, key=lambda t: (-topology.num_gpus_of(t), t))
    for gpu_type in types:
        counts = _asked_counts(per_count, topology, gpu_type)
        if not counts:
            continue
        at_least = [n for n in counts if n >= wanted]
        return Request(gpu_type=gpu_type, num_gpus=at_least[0] if at_least else counts[-1], source="trace")
    return None


class TraceMapper:
    """Maps trace jobs to LLM jobs on one cluster (module docstring)."""

    def __init__(self, cache: OptionCache, model_mix: dict[str, dict[str, float]] | None = None) -> None:
        self.cache = cache
        catalog = load_catalog()
        mix = {cls: dict(models) for cls, models in DEFAULT_MIX.items()}
        if model_mix:
            if "*" in model_mix:
                mix = {cls: dict(model_mix["*"]) for cls in mix}
            mix.update({cls: dict(models) for cls, models in model_mix.items() if cls != "*"})
        self.templates: dict[str, list[tuple[JobSpec, float]]] = {}
        for cls, _, _ in SIZE_CLASSES:
            kept = []
            for name, weight in mix.get(cls, {}).items():
                if name not in catalog:
                    raise ValueError(
                        f"workload.model_mix.{cls}: unknown model {name!r}; catalogue: {', '.join(catalog)}"
                    )
                spec = JobSpec(name=name, model=catalog[name], training=CLASS_TRAINING[cls])
                if weight > 0 and cache.per_step(spec):
                    kept.append((spec, weight))
            self.templates[cls] = kept
        self._requests: dict[tuple[int, int], Request | None] = {}
        if not any(self.templates.values()):
            raise ValueError(f"workload: no model of the mix fits any GPU type of cluster {cache.cluster.name}")

    def _templates(self, cls: str) -> list[tuple[JobSpec, float]]:
        names = [name for name, _, _ in SIZE_CLASSES]
        i = names.index(cls)
        for candidate in [*reversed(names[: i + 1]), *names[i + 1 :]]:  # this class, then smaller, then larger
            if self.templates[candidate]:
                return self.templates[candidate]
        raise AssertionError("unreachable: some class has a model")

    def map(self, trace: list[TraceJob], seed: int) -> tuple[ScenarioJob, ...]:
        rng = random.Random(seed)
        jobs = []
        for tj in trace:
            templates = self._templates(size_class(tj.gpu_seconds))
            template = rng.choices([t for t, _ in templates], [w for _, w in templates])[0]
            per_count = self.cache.per_count(template)
            memo_key = (id(template), tj.num_gpus)
            request = self._requests.get(memo_key)
            if request is None:
                request = self._requests[memo_key] = default_request(per_count, self.cache.topology, tj.num_gpus)
            assert request is not None  # templates were kept only if some option exists
            step_s = per_count[(request.gpu_type, request.num_gpus)].plan.step_time_s or 1.0
            steps = max(1, round(tj.gpu_seconds / (request.num_gpus * step_s)))
            spec = replace(
                template, name=f"{template.name}-{tj.id}", training=replace(template.training, train_steps=steps)
            )
            jobs.append(ScenarioJob(id=tj.id, arrival_s=tj.submit_s, weight=1.0, spec=spec, request=request))
        return tuple(jobs)


def mix_of(spec: WorkloadSpec) -> dict[str, dict[str, float]]:
    return {cls: dict(models) for cls, models in spec.model_mix}


def expand(scenario: Scenario, cache: OptionCache | None = None) -> Scenario:
    """The scenario with its ``workload`` turned into jobs (unchanged if it lists jobs already)."""
    if scenario.workload is None:
        return scenario
    if cache is None:
        cache = OptionCache(scenario.cluster, Topology(scenario.cluster))
    trace = trace_of(scenario.workload, scenario.base_dir)
    jobs = TraceMapper(cache, mix_of(scenario.workload)).map(trace, scenario.workload.seed)
    return replace(scenario, jobs=jobs, workload=None)


def fastest_request(per_count: dict[tuple[str, int], Option], topology: Topology) -> Request | None:
    """What a user asks for a job written without a ``request:``: the fewest GPUs (among the counts users ask
    for, :func:`_asked_counts`) of the GPU type that runs the job fastest per GPU — the job's own predicted
    throughput per GPU at that count, so "fastest" is the job's, not a spec sheet's. This is the request
    Sia's and Gavel's evaluations give their baselines (a job names one GPU count on the best type it
    fits: Jayaram Subramanya et al. 2023 §6; Narayanan et al. 2020 §6.1). None if no type holds it."""
    best: tuple[float, str, int] | None = None
    for gpu_type in sorted(topology.gpu_types):
        counts = _asked_counts(per_count, topology, gpu_type)
        if not counts:
            continue
        option = per_count[(gpu_type, counts[0])]
        step_s = option.plan.step_time_s or math.inf
        gpu_seconds = step_s * counts[0]  # per step: lower is faster per GPU
        if best is None or gpu_seconds < best[0]:
            best = (gpu_seconds, gpu_type, counts[0])
    return None if best is None else Request(gpu_type=best[1], num_gpus=best[2], source="default")


def _asked_counts(per_count: dict[tuple[str, int], Option], topology: Topology, gpu_type: str) -> list[int]:
    """The counts of ``gpu_type`` a user would ask for that fit the job: powers of two inside a server, whole
    servers beyond, ascending."""
    size = max(topology.nodes[i].num_gpus for i in topology.nodes_of(gpu_type))
    return sorted(n for t, n in per_count if t == gpu_type and (n & (n - 1) == 0 or n % size == 0))


def with_requests(scenario: Scenario, cache: OptionCache) -> Scenario:
    """Every job with a request: explicit jobs without one get :func:`fastest_request`."""
    jobs = []
    for job in scenario.jobs:
        if job.request is None:
            job = replace(job, request=fastest_request(cache.per_count(job.spec), cache.topology))
        jobs.append(job)
    return replace(scenario, jobs=tuple(jobs))


REQUEST_POLICIES = ("fifo", "gavel")
"""The policies that run each job's request as given (they do not choose GPU types or counts)."""


def describe_requests(requests: Sequence[Request]) -> str:
    """One sentence on what the request-running baselines (``fifo``, ``gavel``) were given: how many jobs'
    requests came from where, and the GPU types they name."""
    if not requests:
        return "fifo and gavel run each job's request: no jobs"
    by_source = Counter(r.source for r in requests)
    names = {
        "scenario": "written in the scenario",
        "trace": "the trace's GPU count on the most common type that holds the model",
        "default": "none given: the fewest GPUs of the job's fastest type per GPU",
    }
    sources = "; ".join(f"{n} {names.get(k, k)}" for k, n in sorted(by_source.items()))
    by_type = Counter(r.gpu_type for r in requests)
    types = ", ".join(f"{t} {n}" for t, n in sorted(by_type.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"fifo and gavel run each job's request ({sources}); jobs per requested type: {types}"
