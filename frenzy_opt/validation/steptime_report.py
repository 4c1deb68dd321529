"""``docs/steptime-validation.md``: a step-time :class:`~frenzy_opt.validation.steptime_validation.Validation`
as Markdown.
"""

from __future__ import annotations

import math
from typing import Any

from frenzy_opt.prediction.steptime import MIN_BAND_RUNS
from frenzy_opt.validation.steptime_validation import Validation


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.1f} %"


def _signed(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:+.1f} %"


def render_markdown(result: Validation, command: str, refusals: dict[str, str | None] | None = None) -> str:
    """``docs/steptime-validation.md``: targets, per source and per GPU type (in sample, leave one source
    out, leave one GPU type out), the fitted parameters, every row, the skipped rows."""
    payload = result.to_dict()
    cv = payload["cross_validated"]
    loso, logo = cv["leave_one_source_out"], cv["leave_one_gpu_type_out"]
    lines = [
        "# Step-time model against published measured runs",
        "",
        f"- Command: `{command}`",
        "- Data: the calibration file's rows (one published run each; sources and locators in its README).",
        "- Model: `frenzy_opt/prediction/steptime.py`; parameters fitted by "
        "`frenzy_opt/validation/steptime_fit.py` on the",
        "  homogeneous rows (heterogeneous rows are priced on each of their GPU types, the slowest step kept, and",
        "  only scored).",
        "- Error = predicted / measured - 1; tables give the mean |error| (signed mean in brackets).",
        "- In sample = the parameters fitted on every row; leave one source out (LOSO) = each source's rows",
        "  predicted by parameters fitted without that source; leave one GPU type out (LOGO) likewise by the",
        "  file's `gpu_class`.",
        "",
        "## Targets",
        "",
        "| target | figure | met |",
        "|---|---:|---|",
    ]
    lo, lg = loso["overall"]["mean_abs_error"], logo["overall"]["mean_abs_error"]
    lines.append(f"| LOSO mean error <= 12 % | {_pct(lo)} | {'yes' if lo <= 0.12 else 'no'} |")
    lines.append(f"| LOGO mean error <= 15 % | {_pct(lg)} | {'yes' if lg <= 0.15 else 'no'} |")
    worst_gpu = max(
        ((k, v["mean_abs_error"]) for k, v in logo["by_gpu_type"].items() if not k.startswith("mixed")),
        key=lambda kv: kv[1],
        default=("-", math.nan),
    )
    worst_loso_gpu = max(
        ((k, v["mean_abs_error"]) for k, v in loso["by_gpu_type"].items() if not k.startswith("mixed")),
        key=lambda kv: kv[1],
        default=("-", math.nan),
    )
    lines.append(
        f"| every GPU type <= 20 % (LOSO), worst | {worst_loso_gpu[0]} {_pct(worst_loso_gpu[1])} | "
        f"{'yes' if worst_loso_gpu[1] <= 0.2 else 'no'} |"
    )
    lines.append(
        f"| every GPU type <= 20 % when left out (LOGO), worst | {worst_gpu[0]} {_pct(worst_gpu[1])} | "
        f"{'yes' if worst_gpu[1] <= 0.2 else 'no'} |"
    )
    if refusals is not None:
        bad = {k: v for k, v in refusals.items() if v}
        lines.append(
            f"| no published configuration refused as infeasible | {len(bad)} of {len(refusals)} refused | "
            f"{'yes' if not bad else 'no'} |"
        )
    split = payload.get("profile_guided")
    if split:
        lines += [
            "",
            f"Measured layer profiles price {len(split['rows'])} rows (ids {', '.join(split['rows'])}); their errors",
            "apart from the others':",
            "",
            "| rows | in sample | LOSO | LOGO |",
            "|---|---:|---:|---:|",
        ]
        for kind in ("profile_guided", "unprofiled"):
            cells = [split[k][kind] for k in ("in_sample", "leave_one_source_out", "leave_one_gpu_type_out")]
            lines.append(
                f"| {kind.replace('_', '-')} ({cells[0]['rows']}) | "
                + " | ".join(f"{_pct(c['mean_abs_error'])} ({_signed(c['mean_signed_error'])})" for c in cells)
                + " |"
            )
    lines += [
        "",
        f"Overall: in sample {_pct(payload['overall']['mean_abs_error'])}, LOSO {_pct(lo)} (median "
        f"{_pct(loso['overall']['median_abs_error'])}, worst {_pct(loso['overall']['max_abs_error'])}), LOGO "
        f"{_pct(logo['overall']['mean_abs_error'])}; {payload['overall']['rows']} rows scored, "
        f"{payload['skipped']} skipped.",
        "",
        "## By source",
        "",
        "| source | rows | in sample | LOSO | LOGO |",
        "|---|---:|---:|---:|---:|",
    ]

    def cell(table: dict[str, Any], key: str) -> str:
        v = table.get(key)
        if not v:
            return "-"
        return f"{_pct(v['mean_abs_error'])} ({_signed(v['mean_signed_error'])})"

    for source, v in payload["by_source"].items():
        lines.append(
            f"| {source} | {v['rows']} | {cell(payload['by_source'], source)} | {cell(loso['by_source'], source)} | "
            f"{cell(logo['by_source'], source)} |"
        )
    lines += ["", "## By GPU type", "", "| GPU type | rows | in sample | LOSO | LOGO |", "|---|---:|---:|---:|---:|"]
    for gpu, v in payload["by_gpu_type"].items():
        lines.append(
            f"| {gpu} | {v['rows']} | {cell(payload['by_gpu_type'], gpu)} | {cell(loso['by_gpu_type'], gpu)} | "
            f"{cell(logo['by_gpu_type'], gpu)} |"
        )
    params = payload["parameters"]
    lines += ["", "## Fitted parameters (in sample, shipped in `frenzy_opt/data/steptime-fit.json`)", ""]
    for key, value in sorted(params.items()):
        if key in ("residuals", "residuals_by_architecture") or value == {}:
            continue  # an empty table is not fitted (its defaults apply)
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v:.4g}" for k, v in sorted(value.items()))
        elif isinstance(value, float):
            value = f"{value:.4g}"
        lines.append(f"- `{key}`: {value}")
    if result.model.residuals:
        p10, p90 = result.model.band(1.0)
        lines.append(
            f"- prediction band from the {len(result.model.residuals)} LOSO residuals: p10 x{p10:.2f}, p90 x{p90:.2f}"
        )
        for arch, pool in sorted(result.model.residuals_by_architecture.items()):
            lo, hi = result.model.band(1.0, arch)
            own = "its own" if len(pool) >= MIN_BAND_RUNS else "all runs' (too few of its own)"
            lines.append(f"  - {arch}: {len(pool)} runs, {own} band p10 x{lo:.2f}, p90 x{hi:.2f}")
    lines += [
        "",
        "## Rows",
        "",
        "| id | source | GPU | measured s | in sample | LOSO | LOGO | assumptions |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for row in payload["rows"]:
        if "skipped" in row:
            continue
        c = row["cross_validated"]
        lines.append(
            f"| {row['id']} | {row['source'][:40]} | {row['gpu_type']} | {row['measured_s']:.4g} | "
            f"{_signed(row['error'])} | {_signed(c['leave_one_source_out']['error'])} | "
            f"{_signed(c['leave_one_gpu_type_out']['error'])} | {'; '.join(row['assumptions'])} |"
        )
    skipped = [row for row in payload["rows"] if "skipped" in row]
    if skipped:
        lines += ["", "## Skipped rows", "", "| id | source | reason |", "|---|---|---|"]
        lines += [f"| {r['id']} | {r['source'][:50]} | {r['skipped']} |" for r in skipped]
    if refusals:
        bad = {k: v for k, v in refusals.items() if v}
        if bad:
            lines += ["", "## Configurations the planner refuses", "", "| id | reason |", "|---|---|"]
            lines += [f"| {k} | {v} |" for k, v in bad.items()]
    return "\n".join(lines) + "\n"
