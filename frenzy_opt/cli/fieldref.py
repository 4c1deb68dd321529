"""The field reference of the input files, ``docs/reference.md``: ``frenzy reference > docs/reference.md``.

Every table comes from the parsers' own definitions: the dataclasses' fields (under the names the files spell
them, with their types and defaults), their attribute docstrings (read from the source with :mod:`ast`, the way
Sphinx reads them), the sets of values the parsers check (:mod:`frenzy_opt.core.enums` and the modules'
constants) and the catalogues. Where a parser's default is not the dataclass's (a cluster file's node group,
``parallel.zero_stage``) the row says the parser's, from the constants the parser uses.
``tests/test_reference.py`` checks that the committed page equals :func:`render` and lists every key the
parsers accept.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import re
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, asdict, dataclass, fields, is_dataclass
from typing import Any

from frenzy_opt.core.runtimes import capability_table
from frenzy_opt.core.spec import (
    ATTENTIONS,
    OPTIMIZERS,
    PRECISIONS,
    PRIORITY_RANGE,
    RECOMPUTES,
    RUNTIMES,
    ZERO_STAGES_BY_RUNTIME,
    JobSpec,
    ParallelConfig,
    SchedulingConfig,
    TrainingConfig,
    default_zero_stage,
)
from frenzy_opt.hardware import cluster as cluster_file
from frenzy_opt.hardware.gpus import KEY_OF_FIELD, GpuType, load_gpus
from frenzy_opt.models.arch import MLP_KINDS, NORM_KINDS, POSITION_KINDS, ModelArch
from frenzy_opt.models.catalog import REQUIRED_ARCH_FIELDS, catalog_names
from frenzy_opt.planning.scenario import ScenarioJob

COMMAND = "frenzy reference > docs/reference.md"


@dataclass(frozen=True, slots=True)
class Row:
    key: str
    type: str
    default: str
    allowed: str
    description: str


@dataclass(frozen=True, slots=True)
class Section:
    title: str
    intro: str
    rows: tuple[Row, ...]
    table: tuple[tuple[str, ...], ...] = ()
    """A table of its own (header first) instead of the field rows."""


def attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings of a class's annotated attributes: the string literal right after each one."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _markdown(text: str) -> str:
    """A docstring as one line of Markdown: ``code`` -> `code`, :role:`target` -> `target`, None -> null."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    text = re.sub(r"\bNone\b", "null", text.replace("``", "`"))  # the files' spelling
    return " ".join(text.split()).replace("|", "\\|")


_TYPE_WORDS = {
    "int": "integer",
    "float": "number",
    "str": "string",
    "bool": "boolean",
    "tuple[str, ...]": "list of strings",
    "GpuType": "string",
    "Precision": "string",  # the StrEnums of frenzy_opt.core.enums: the files hold their values
    "Runtime": "string",
    "Recompute": "string",
    "ModelArch": "string or mapping",
    "TrainingConfig": "mapping",
    "ParallelConfig": "mapping",
    "SchedulingConfig": "mapping",
    "Request": "mapping",
    "tuple[NodeGroup, ...]": "list of mappings",
}


def _type(annotation: object) -> str:
    parts = [p.strip() for p in str(annotation).split("|")]
    words = [_TYPE_WORDS.get(p, p) for p in parts if p != "None"]
    return " or ".join(words) + (" or null" if "None" in parts else "")


def _value(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return "[]" if not value else ", ".join(map(_value, value))
    if value == "":
        return '""'
    return str(value)


def _choices(values: Iterable[object]) -> str:
    return ", ".join(f"`{_value(v)}`" for v in values)


def rows_of(
    cls: type,
    keys: Iterable[str] | None = None,
    *,
    field_of_key: Mapping[str, str] | None = None,
    defaults: Mapping[str, str] | None = None,
    allowed: Mapping[str, str] | None = None,
    types: Mapping[str, str] | None = None,
    skip: Iterable[str] = (),
) -> tuple[Row, ...]:
    """One row per file key of ``cls`` (default: its fields, under ``field_of_key``'s inverse where the file
    names one differently). A key may name a property too (its docstring and return type)."""
    by_name = {f.name: f for f in fields(cls)} if is_dataclass(cls) else {}
    docs = attribute_docs(cls)
    key_of = {name: key for key, name in (field_of_key or {}).items()}
    if keys is None:
        keys = [key_of.get(name, name) for name in by_name if name not in set(skip)]
    rows = []
    for key in keys:
        name = (field_of_key or {}).get(key, key)
        f = by_name.get(name)
        if f is not None:
            annotation: object = f.type
            description = docs.get(name, "")
            if f.default is not MISSING:
                default = f"`{_value(f.default)}`"
            elif f.default_factory is not MISSING:
                default = "see below"
            else:
                default = "required"
        else:
            prop = getattr(cls, name)
            annotation = inspect.get_annotations(prop.fget).get("return", "")
            description, default = inspect.cleandoc(prop.__doc__ or ""), "—"
        if not description:
            raise ValueError(f"{cls.__name__}.{name} has no docstring: write one in the class")
        rows.append(
            Row(
                key=key,
                type=(types or {}).get(key, _type(annotation)),
                default=(defaults or {}).get(key, default),
                allowed=(allowed or {}).get(key, "`true`, `false`" if _type(annotation) == "boolean" else ""),
                description=_markdown(description),
            )
        )
    return tuple(rows)


def _zero_stage_default() -> str:
    parts = []
    for runtime in RUNTIMES:
        single, multi = default_zero_stage(runtime, 1), default_zero_stage(runtime, 2)
        parts.append(
            f"{runtime} `{single}`" if single == multi else f"{runtime} `{single}` (dp 1) / `{multi}` (dp > 1)"
        )
    return "per runtime: " + ", ".join(parts)


def job_sections() -> list[Section]:
    low, high = PRIORITY_RANGE
    return [
        Section(
            "Job spec: top level",
            "A job spec (contract 1) is a YAML or JSON mapping, a file for `frenzy predict` and `frenzy plan` or "
            "an entry of a scenario's `jobs`; it names no hardware.",
            rows_of(
                JobSpec,
                skip=("pinned",),
                defaults={"name": "`<model name>-job`", "training": "see below"},
                types={"training": "mapping", "parallel": "mapping", "scheduling": "mapping"},
            ),
        ),
        Section(
            "Job spec: `model`",
            "A catalogue name (`frenzy catalog models`: "
            + _choices(catalog_names())
            + ") or a mapping of these fields (an inline architecture).",
            rows_of(
                ModelArch,
                defaults={
                    **{key: "required" for key in REQUIRED_ARCH_FIELDS},
                    "num_kv_heads": "`num_attention_heads`",
                },
                allowed={
                    "mlp": _choices(MLP_KINDS),
                    "norm": _choices(NORM_KINDS),
                    "position_embedding": _choices(POSITION_KINDS),
                },
            ),
        ),
        Section(
            "Job spec: `training`",
            "Every field is optional.",
            rows_of(
                TrainingConfig,
                allowed={
                    "precision": _choices(PRECISIONS),
                    "optimizer": _choices(OPTIMIZERS),
                    "runtime": _choices(RUNTIMES),
                },
            ),
        ),
        Section(
            "Job spec: `parallel`",
            "Every field is optional. A field given is pinned: every plan keeps it, and the planner searches the "
            "fields left out; the default is the value the parsed spec holds when the field is absent.",
            rows_of(
                ParallelConfig,
                defaults={"zero_stage": _zero_stage_default()},
                allowed={
                    "zero_stage": "; ".join(f"{r}: {_choices(s)}" for r, s in ZERO_STAGES_BY_RUNTIME.items()),
                    "recompute": _choices(RECOMPUTES),
                    "attention": _choices(ATTENTIONS),
                },
            ),
        ),
        Section(
            "Job spec: `scheduling`",
            "Optional; what the scheduler does with the job.",
            rows_of(SchedulingConfig, allowed={"priority": f"integers `{low}` … `{high}`"}),
        ),
        Section(
            "Scenario job: keys beside the job spec",
            "An entry of a scenario file's `jobs` list is a job spec with these keys as well.",
            rows_of(
                ScenarioJob,
                skip=("spec",),
                defaults={"id": "`job-<index>`"},
                types={"request": "mapping {gpu_type, num_gpus}"},
            ),
        ),
    ]


_BOUNDS = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}


def api_section() -> Section:
    """The keys the HTTP API's submission (:class:`frenzy_opt.api.schemas.JobIn`) takes beside the spec."""
    from frenzy_opt.api.schemas import JobIn

    spec_keys = {f.name for f in fields(JobSpec)}
    rows = []
    for key, info in JobIn.model_fields.items():
        if key in spec_keys:
            continue
        bounds = [
            f"{sign} {_value(getattr(m, op))}"
            for m in info.metadata
            for op, sign in _BOUNDS.items()
            if getattr(m, op, None) is not None
        ]
        kind = getattr(info.annotation, "__name__", str(info.annotation))
        text = _markdown(info.description or "")
        text = text[:1].upper() + text[1:] + ("." if text and not text.endswith(".") else "")
        rows.append(Row(key, _type(kind), f"`{_value(info.default)}`", ", ".join(bounds), text))
    return Section(
        "API submission: keys beside the job spec",
        "`POST /v1/jobs` (and `frenzy submit`) takes a job spec with these keys as well; the API also bounds "
        "every number of the spec (`api/schemas.py`).",
        tuple(rows),
    )


def cluster_sections() -> list[Section]:
    node_group = cluster_file.NodeGroup
    network_defaults = {
        "nics_per_node": f"`{_value(cluster_file.DEFAULT_NETWORK[0])}`",
        "nic_gbps": f"`{_value(cluster_file.DEFAULT_NETWORK[1])}`",
        "inter_node_gbps": "—",
    }
    return [
        Section(
            "Cluster file: top level",
            "A cluster file (contract 2) is a YAML or JSON mapping, named by `--cluster` or a scenario's `cluster`.",
            rows_of(
                cluster_file.ClusterSpec,
                cluster_file.CLUSTER_FIELDS,
                field_of_key={"network": "inter_node_gbit_s"},
                defaults={"name": f"`{cluster_file.DEFAULT_NAME}`", "network": "see below", "storage": "see below"},
                types={"network": "mapping", "storage": "mapping"},
            ),
        ),
        Section(
            "Cluster file: `storage`",
            "Checkpoint storage, GB/s (decimal): what each move of a job (a checkpoint save and load) costs.",
            rows_of(cluster_file.Storage, cluster_file.STORAGE_FIELDS),
        ),
        Section(
            "Cluster file: `network`",
            "Give `nics_per_node` and `nic_gbps`, or the older `inter_node_gbps`, not both.",
            rows_of(
                node_group,
                cluster_file.NETWORK_FIELDS,
                field_of_key=cluster_file.FIELD_OF_KEY,
                defaults=network_defaults,
            ),
        ),
        Section(
            "Cluster file: `node_groups[]`",
            "Each entry is one group of nodes; `gpu` is required. The `network` keys set the group's own network.",
            rows_of(
                node_group,
                cluster_file.NODE_GROUP_FIELDS,
                field_of_key=cluster_file.FIELD_OF_KEY,
                defaults={
                    "num_nodes": f"`{cluster_file.DEFAULT_NUM_NODES}`",
                    "gpus_per_node": f"`{cluster_file.DEFAULT_GPUS_PER_NODE}`",
                    "intra_node": "the GPU type's `intra_node`",
                    "nvlink_domain": "`gpus_per_node`",
                    **{key: f"the `network` section's `{key}`" for key in cluster_file.NETWORK_FIELDS},
                    "inter_node_gbps": "—",
                },
                allowed={
                    "gpu": "a GPU type's name or alias (GPU types, below)",
                    "intra_node": _choices(cluster_file.INTRA_NODE_KINDS),
                },
            ),
        ),
    ]


def gpu_sections() -> list[Section]:
    gpus = load_gpus().values()
    names = tuple(Row(g.name, g.architecture, "", _choices(g.aliases), "") for g in gpus)
    return [
        Section(
            "GPU catalogue entry: `gpus[]` of `frenzy_opt/data/gpus.yaml`",
            "The catalogue `frenzy catalog gpus` prints; TFLOPs are dense peaks, bandwidths decimal GB/s.",
            rows_of(GpuType, field_of_key={key: name for name, key in KEY_OF_FIELD.items()}),
        ),
        Section(
            "GPU types",
            "The names and aliases a cluster file's `gpu`, a scenario's `request.gpu_type` and `--gpu` accept "
            "(case-insensitive; one resolver, `frenzy_opt.hardware.gpus.resolve_gpu`). Another name resolves "
            "when its words (split at spaces, `-`, `_`) match one type's name or alias; a family name several "
            "parts share (`v100`, `a100`, `h100`) is an error listing them.",
            names,
        ),
    ]


def runtime_section() -> Section:
    return Section(
        "Runtimes: what each one runs",
        "`training.runtime` bounds the plan space: the planner searches only what the runtime runs, and a pinned "
        "`parallel` field (or `training.precision: fp8`) outside its row is refused naming the runtime. The "
        "training worker runs a plan where both the job's runtime's row and its own allow it. Sources: "
        "`frenzy_opt/core/runtimes.py`.",
        (),
        tuple(capability_table()),
    )


def sections() -> list[Section]:
    return [*job_sections(), runtime_section(), api_section(), *cluster_sections(), *gpu_sections()]


def render(parts: list[Section] | None = None) -> str:
    """The reference page as Markdown."""
    lines = [
        "# Field reference",
        "",
        f"Generated by `{COMMAND}` from the parsers' dataclasses, their field docstrings and the sets of "
        "values they check (`frenzy_opt/cli/fieldref.py`); edit those, not this page. "
        "`tests/test_reference.py` fails when the page is stale.",
    ]
    for section in sections() if parts is None else parts:
        lines += ["", f"## {section.title}", "", section.intro, ""]
        if section.table:
            header, *body = section.table
            lines += ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
            lines += ["| " + " | ".join(row) + " |" for row in body]
            continue
        if section.title == "GPU types":
            lines += ["| name | architecture | aliases |", "| --- | --- | --- |"]
            lines += [f"| `{r.key}` | {r.type} | {r.allowed} |" for r in section.rows]
            continue
        lines += ["| key | type | default | allowed | description |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| `{r.key}` | {r.type} | {r.default} | {r.allowed} | {r.description} |" for r in section.rows]
    return "\n".join(lines) + "\n"


def payload() -> dict[str, Any]:
    """The sections as JSON (``frenzy reference --json``)."""
    return {
        "sections": [
            {
                "title": s.title,
                "intro": s.intro,
                "rows": [asdict(r) for r in s.rows],
                "table": [list(t) for t in s.table],
            }
            for s in sections()
        ]
    }
