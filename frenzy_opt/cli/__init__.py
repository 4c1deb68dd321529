"""The ``frenzy`` command line (contract 3): ``catalog``, ``predict``, ``plan``, ``solve``, ``simulate``,
``compare``, ``serve``, ``demo`` and ``run``.

Human-readable tables by default, ``--json`` for one JSON object on stdout. Exit codes: 0 ok; 2 bad input
or a job that fits no GPU (message on stderr); 1 internal error."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from frenzy_opt import __version__, client
from frenzy_opt.cli.common import DEFAULT_REPORT
from frenzy_opt.cli.formats import cmd_import, cmd_reference
from frenzy_opt.cli.launch import cmd_export, cmd_launch
from frenzy_opt.cli.schedule import cmd_run, cmd_solve
from frenzy_opt.cli.serve import cmd_demo, cmd_serve
from frenzy_opt.cli.simulate import COMPARE_HELP, COMPARE_OPTIONS, _add_truth_args, cmd_compare, cmd_simulate
from frenzy_opt.cli.sizing import cmd_catalog, cmd_plan, cmd_predict
from frenzy_opt.cli.validate import cmd_calibrate, cmd_profile, cmd_validate
from frenzy_opt.planning.export import TARGETS as EXPORT_TARGETS
from frenzy_opt.planning.scenario import DEFAULT_SCENARIO
from frenzy_opt.research.experiment import (
    DEFAULT_COMPARE_SCENARIOS,
    DEFAULT_COMPARE_SEEDS,
    DEFAULT_COMPARE_TRUTH,
    DEFAULT_FAILURES,
    DEFAULT_PROFILED_SCENARIO,
)
from frenzy_opt.solvers.base import policy_names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="frenzy", description="Memory-aware scheduling of LLM training jobs.")
    parser.add_argument("--version", action="version", version=f"frenzy-opt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help_text: str, func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
        p.set_defaults(func=func)
        return p

    p = add("catalog", "list the GPU or model catalogue", cmd_catalog)
    p.add_argument("what", choices=("gpus", "models"))
    p = add("predict", "per-stage peak memory of a job on one GPU type", cmd_predict)
    p.add_argument("job", help="job spec file (YAML or JSON, contract 1) or a shipped job name")
    p.add_argument("--gpu", required=True, help="GPU type name or alias (see `frenzy catalog gpus`)")
    p.add_argument("--micro-batch-size", type=int, default=0, help="override training.micro_batch_size")
    p.add_argument("--trace", action="store_true", help="also run the trace path (real runtime, FakeTensorMode)")
    p = add("plan", "every memory-feasible plan of a job on a cluster, best first", cmd_plan)
    p.add_argument("job", help="job spec file (YAML or JSON, contract 1) or a shipped job name")
    p.add_argument("--cluster", required=True, help="cluster file or shipped cluster name (contract 2)")
    p.add_argument("--top", type=int, default=10, help="how many plans to show (default 10)")
    p.add_argument(
        "--per-type",
        type=int,
        help="also show the best N plans of each GPU type (default 1 on a cluster of several types, else 0)",
    )
    p.add_argument(
        "--headroom", type=float, help="fraction of GPU memory kept free above the upper bound (default: the fit's)"
    )
    p.add_argument("--calibration", help="step-time calibration profile (frenzy calibrate FILE --name NAME)")
    p.add_argument(
        "--export",
        choices=EXPORT_TARGETS,
        help="print the plan the scheduler takes on the empty cluster as a Slurm batch script or a Kubernetes "
        "manifest instead of the table (as `frenzy export` writes them)",
    )
    p.add_argument("--out", help="--export: write the script or manifest here and print the table")
    p = add(
        "validate",
        "score MARP or the step-time model on measured runs (calibration-format CSV), cross-validated",
        cmd_validate,
    )
    p.add_argument("what", choices=("memory", "steptime", "layers"))
    p.add_argument(
        "file",
        help="CSV in the format of ../shared/calibration/{memory,steptime}-measured.csv; layers: Sailor's profile "
        "folder or a calibration profile's JSON file",
    )
    p.add_argument(
        "--out", help="also write the Markdown report (docs/marp-validation.md, docs/steptime-validation.md)"
    )
    p.add_argument("--calibration", help="steptime: score a stored calibration profile instead of the shipped fit")
    p = add(
        "calibrate", "refit the shipped parameters, or store a calibration profile, from measured runs", cmd_calibrate
    )
    p.add_argument("file", help="calibration-format CSV (memory or steptime), or launcher JSON reports")
    p.add_argument("more", nargs="*", help="more launcher JSON reports or CSV files (profiles only)")
    p.add_argument(
        "--name",
        required=True,
        help="memory or steptime (refit the shipped fit), or a profile name for plan/solve/simulate/serve "
        "--calibration NAME",
    )
    p.add_argument(
        "--out", help="memory/steptime: where to write the fit; a profile: the profile directory instead of the default"
    )
    p = add("profile", "measure a job's layers on this machine's CUDA GPU into a calibration profile", cmd_profile)
    p.add_argument("job", nargs="?", help="job spec file or shipped job name (the shapes to measure)")
    p.add_argument("--name", required=True, help="calibration profile to add the measurements to")
    p.add_argument("--gpu", help="the GPU's catalogue type (default: from the CUDA device name)")
    p.add_argument("--micro-batches", help="comma-separated micro-batch sizes (default: the planner's choices)")
    p.add_argument("--tp", help="comma-separated tensor-parallel degrees (default: 1, 2, 4, 8 where they divide)")
    p.add_argument("--warmup", type=int, default=3, help="untimed repetitions first (default 3)")
    p.add_argument("--iters", type=int, default=10, help="timed repetitions, the median kept (default 10)")
    p.add_argument("--from-sailor", metavar="DIR", help="import Sailor's per-layer profiles (its artefact's folder)")
    p.add_argument("--dir", help="the calibration profile directory (default $FRENZY_CALIBRATIONS or ~/.frenzy)")
    p = add("solve", "schedule a scenario's jobs with the greedy HAS, CP-SAT, or both", cmd_solve)
    p.add_argument("scenario", help="scenario file or shipped name")
    p.add_argument("--calibration", help="step-time calibration profile (frenzy calibrate FILE --name NAME)")
    p.add_argument("--solver", choices=("greedy", "cpsat", "both"), default="both")
    p.add_argument("--time-limit", type=float, default=30.0, help="CP-SAT time limit in seconds (default 30)")
    p.add_argument("--workers", type=int, default=2, help="CP-SAT search workers (default 2)")
    p.add_argument("--seed", type=int, default=0, help="CP-SAT random seed (default 0)")
    p.add_argument("--plot", help="directory for a Gantt chart per solver (PNG)")
    p.add_argument(
        "--lp-bound",
        action="store_true",
        help="also prove a lower bound on the objective with the time-indexed LP (tens of seconds at 20 jobs)",
    )
    p.add_argument(
        "--lp-columns",
        type=int,
        help="the LP bound's start variables (default: solvers/lpbound.py's MAX_COLUMNS; fewer: faster, looser)",
    )
    p = add("simulate", "replay a scenario's workload under one or more scheduling policies", cmd_simulate)
    p.add_argument("scenario", help="scenario file or shipped name (jobs or a workload generator)")
    p.add_argument("--calibration", help="step-time calibration profile the policies plan with")
    p.add_argument("--policy", default="frenzy", help=f"comma-separated policies: {', '.join(policy_names())}")
    p.add_argument("--plot", help="directory for the JCT CDF, utilization and Gantt charts (PNG)")
    p.add_argument("--mtbf-h", type=float, help="inject node failures: mean time between failures per node (hours)")
    p.add_argument("--repair-s", type=float, default=1800.0, help="seconds a failed node stays down (default 1800)")
    p.add_argument("--checkpoint-s", type=float, default=1800.0, help="checkpoint interval of jobs (default 1800)")
    p.add_argument("--seed", type=int, default=0, help="seed of the failures and the noisy truth (default 0)")
    _add_truth_args(p, "model")
    p.add_argument("--seeds", type=int, help="run seeds SEED…SEED+N-1 (truth, failures, workload): means and 95 %% CIs")
    p.add_argument(
        "--workload-file", help="replay this workload file on the scenario's cluster (with --workload-format)"
    )
    p.add_argument("--workload-format", help="format of --workload-file: sia (name, time, application, ...)")
    p = add("compare", "run policies on scenarios and write the Markdown comparison report", cmd_compare)
    p.add_argument(
        "scenarios", nargs="*", help=f"llm section's scenarios (default: {' '.join(DEFAULT_COMPARE_SCENARIOS)})"
    )
    p.add_argument(
        "--sections",
        help="comma-separated: llm, failures, profiled, hours, sia-traces, sensitivity (default: all; with "
        "SCENARIOS: llm,failures,profiled)",
    )
    p.add_argument("--policy", default=COMPARE_OPTIONS["policy"], help="comma-separated policies")
    p.add_argument("--out", default=DEFAULT_REPORT, help=f"report path (default {DEFAULT_REPORT})")
    p.add_argument("--overwrite", action="store_true", help="replace the report at --out if it exists")
    p.add_argument("--no-failures", action="store_true", help=f"skip the failure experiment on {DEFAULT_FAILURES[0]}")
    _add_truth_args(p, DEFAULT_COMPARE_TRUTH)
    p.add_argument(
        "--seeds", type=int, default=DEFAULT_COMPARE_SEEDS, help=f"seeds per scenario (default {DEFAULT_COMPARE_SEEDS})"
    )
    p.add_argument(
        "--no-profiled", action="store_true", help=f"skip {DEFAULT_PROFILED_SCENARIO} under the profiled truth"
    )
    for dest, help_text in COMPARE_HELP.items():
        default = COMPARE_OPTIONS[dest]
        kind = int if isinstance(default, int) else str
        shown = f" (default {default})" if default is not None else ""
        p.add_argument("--" + dest.replace("_", "-"), type=kind, default=default, help=help_text + shown)
    p = add("serve", "run the HTTP service (FastAPI under uvicorn)", cmd_serve)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--calibration", help="step-time calibration profile to plan with; the closed loop learns into it")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--db",
        default="sqlite:///frenzy-opt.db",
        help="SQLAlchemy URL or a SQLite file path (default: SQLite file frenzy-opt.db)",
    )
    p.add_argument(
        "--create",
        action="store_true",
        help="create the job store if it does not exist (without it, a missing SQLite file or a database without "
        "the tables is refused: a volume not mounted must not start an empty store)",
    )
    p.add_argument("--cluster", default="paper-3type", help="cluster file or shipped name (default paper-3type)")
    p.add_argument("--executor", default="simulated", help="simulated, local (torchrun) or ray (RAY_ADDRESS)")
    p.add_argument("--workdir", default="frenzy-runs", help="local/ray executors: where runs keep their files")
    p.add_argument("--tokens", help="tokens/tenants/quotas file (YAML or JSON); none: single-tenant local mode")
    p.add_argument("--time-scale", type=float, default=1.0, help="simulated executor: cluster seconds per second")
    p.add_argument("--fail-rate", type=float, default=0.0, help="simulated executor: fraction of attempts that fail")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="API worker processes in front of the scheduler (1: the scheduler's process serves the API)",
    )
    p.add_argument(
        "--decision-wait-s",
        type=float,
        default=0.0,
        help="how long a submission without ?wait waits for its first decision (0: answered once stored)",
    )
    from frenzy_opt.api.httplimits import DEFAULT_LIMITS as HTTP  # HTTP limits: docs/service.md

    p.add_argument(
        "--max-header-bytes",
        type=int,
        default=HTTP.max_header_bytes,
        help=f"request line plus headers, bytes; over it: 431 (default {HTTP.max_header_bytes})",
    )
    p.add_argument(
        "--header-timeout-s",
        type=float,
        default=HTTP.header_timeout_s,
        help="a connection whose request line and headers are not complete this long after it opened (or after "
        f"the request's first byte) is closed (default {HTTP.header_timeout_s:g})",
    )
    p.add_argument(
        "--keep-alive-s",
        type=int,
        default=HTTP.keep_alive_s,
        help="idle keep-alive between requests; behind a proxy: longer than its idle timeout "
        f"(default {HTTP.keep_alive_s})",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=HTTP.max_connections,
        help="open connections; one more is closed at once, and a request is answered 503 while this many are open "
        f"or in progress (default {HTTP.max_connections})",
    )
    p = add(
        "launch", "plan, place and really run one job (torch.distributed) and compare with the prediction", cmd_launch
    )
    p.add_argument("job", help="job spec file (YAML or JSON, contract 1) or a shipped job name")
    p.add_argument("--cluster", default="local-4slot", help="cluster file or shipped name (default local-4slot)")
    p.add_argument("--executor", default="local", help="local (torchrun on this machine) or ray (RAY_ADDRESS)")
    p.add_argument("--steps", type=int, help="train at most this many steps (default: the spec's train_steps)")
    p.add_argument("--workdir", default="frenzy-runs", help="where runs keep their files (default frenzy-runs)")
    p = add("export", "a placement as a Slurm batch script or a Kubernetes manifest", cmd_export)
    p.add_argument("placement", help="placement file (JSON/YAML: job, plan, placement; e.g. frenzy launch --json)")
    p.add_argument("--to", required=True, choices=EXPORT_TARGETS)
    p.add_argument("--out", help="write here instead of stdout")
    p.add_argument("--steps", type=int, help="train at most this many steps")
    p.add_argument("--partition", help="slurm: the partition to submit to")
    p.add_argument("--image", default="frenzy-opt:latest", help="k8s: the container image with frenzy-opt")
    add("reference", "the field reference of job specs, cluster files and the GPU catalogue (Markdown)", cmd_reference)
    p = add("import", "a job spec (contract 1) from a HF config.json, a torchtitan TOML or Megatron args", cmd_import)
    p.add_argument("format", choices=("hf", "torchtitan", "megatron"))
    p.add_argument("file", nargs="?", help="the file to read (local files only)")
    p.add_argument("--args", help="megatron: the argument list as a string (--args='--num-layers 32 ...')")
    p.add_argument("--out", help="write the spec here instead of stdout")
    p.add_argument("--name", help="the job's name (default: from the source)")
    p.add_argument("--runtime", help="hf: training.runtime of the spec (default: contract 1's)")
    p.add_argument("--global-batch-size", type=int, help="training.global_batch_size (torchtitan's -1 needs it)")
    p.add_argument("--vocab-size", type=int, help="megatron, torchtitan: the tokenizer's vocabulary size")
    p = add("demo", "the serverless flow in a minute: service, HTTP submissions, live decisions", cmd_demo)
    p.add_argument("scenario", nargs="?", default=DEFAULT_SCENARIO, help="scenario file or shipped name")
    p.add_argument("--time-scale", type=float, default=3600.0, help="cluster seconds per wall second (default 3600)")
    p = add("run", "plan every job of a scenario (default: the embedded default scenario)", cmd_run)
    p.add_argument("scenario", nargs="?", default=DEFAULT_SCENARIO, help="scenario file or shipped name")
    p.add_argument("--top", type=int, default=3, help="plans kept per job in --json output (default 3)")
    client.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "top", 1) < 1:
        print("frenzy: --top must be a positive integer", file=sys.stderr)
        return 2
    try:
        code: int = args.func(args)
        return code
    except ValueError as err:  # bad input, infeasible job: the message names the field or the memory needed
        print(f"frenzy: {err}", file=sys.stderr)
        return 2
