"""docs/reference.md is the generator's output, lists every key the parsers accept, and states the defaults the
parsers really apply."""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass, fields
from pathlib import Path

import pytest
import yaml

from frenzy_opt.api.schemas import JobIn
from frenzy_opt.cli import main
from frenzy_opt.cli.fieldref import render, rows_of
from frenzy_opt.core.spec import parse_job
from frenzy_opt.hardware.cluster import parse_cluster
from frenzy_opt.hardware.gpus import KEY_OF_FIELD, GpuType
from frenzy_opt.models.catalog import parse_model
from frenzy_opt.planning import scenario

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference.md"


def _tables() -> dict[str, dict[str, list[str]]]:
    """Per ``## `` heading of the committed page, its table rows by key (the cells after the key)."""
    tables: dict[str, dict[str, list[str]]] = {}
    title = ""
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            title = line[3:]
            tables[title] = {}
        match = re.match(r"\| `([^`]+)` \|(.*)\|$", line)
        if match and title:
            tables[title][match[1]] = [c.strip() for c in match[2].split(" | ")]
    return tables


def _allowed(call: object) -> set[str]:
    """The keys a parser lists when it refuses an unknown one (``...; allowed: a, b, c``)."""
    with pytest.raises(ValueError, match="unknown field") as err:
        call()  # type: ignore[operator]
    return set(str(err.value).split("allowed: ", 1)[1].split(", "))


def _keys_read(func: object, name: str) -> set[str]:
    """The string keys ``func`` reads from its mapping ``name``: ``name.get("k")``, ``name["k"]``, ``"k" in name``."""
    keys = set()
    for node in ast.walk(ast.parse(inspect.getsource(func))):  # type: ignore[arg-type]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            target, key = node.func.value, node.args[0] if node.args else None
        elif isinstance(node, ast.Subscript):
            target, key = node.value, node.slice
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In):
            target, key = node.comparators[0], node.left
        else:
            continue
        if isinstance(target, ast.Name) and target.id == name and isinstance(key, ast.Constant):
            keys.add(str(key.value))
    return keys


def test_the_committed_page_is_the_generators_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert PAGE.read_text(encoding="utf-8") == render(), "stale: run `frenzy reference > docs/reference.md`"
    capsys.readouterr()
    assert main(["reference"]) == 0
    assert capsys.readouterr().out == render()


def test_every_key_the_parsers_accept_is_in_its_table() -> None:
    tables = _tables()
    group = {"gpu": "T4"}
    accepted = {
        ("Job spec: top level", "Scenario job: keys beside the job spec"): _allowed(
            lambda: parse_job({"model": "llama3-8b", "zz": 1})
        ),
        ("Job spec: `model`",): _allowed(lambda: parse_model({"zz": 1})),
        **{
            (f"Job spec: `{section}`",): _allowed(lambda s=section: parse_job({"model": "llama3-8b", s: {"zz": 1}}))
            for section in ("training", "parallel", "scheduling")
        },
        ("Scenario job: keys beside the job spec",): _keys_read(scenario.parse_scenario, "raw"),
        ("Job spec: top level", "API submission: keys beside the job spec"): set(JobIn.model_fields),
        ("Cluster file: top level",): _allowed(lambda: parse_cluster({"zz": 1, "node_groups": [group]})),
        ("Cluster file: `network`",): _allowed(lambda: parse_cluster({"network": {"zz": 1}, "node_groups": [group]})),
        ("Cluster file: `node_groups[]`",): _allowed(lambda: parse_cluster({"node_groups": [{**group, "zz": 1}]})),
        # The catalogue loader hands every entry's keys to GpuType under KEY_OF_FIELD's names.
        ("GPU catalogue entry: `gpus[]` of `frenzy_opt/data/gpus.yaml`",): {
            KEY_OF_FIELD.get(f.name, f.name) for f in fields(GpuType)
        },
    }
    assert {"id", "arrival_s", "weight", "request"} <= accepted[("Scenario job: keys beside the job spec",)]
    assert {"name", "network", "node_groups"} <= accepted[("Cluster file: top level",)]
    for titles, keys in accepted.items():
        listed = set().union(*(tables[t] for t in titles))
        assert keys and keys <= listed, (titles, sorted(keys - listed))
    catalogue = yaml.safe_load((ROOT / "frenzy_opt" / "data" / "gpus.yaml").read_text(encoding="utf-8"))["gpus"]
    used = set().union(*(entry.keys() for entry in catalogue))
    assert used <= set(tables["GPU catalogue entry: `gpus[]` of `frenzy_opt/data/gpus.yaml`"])
    assert {entry["name"] for entry in catalogue} == set(tables["GPU types"])


def test_defaults_are_what_the_parsers_apply() -> None:
    tables = _tables()
    spec = parse_job({"model": "llama3-8b"})
    for section, parsed in (("training", spec.training), ("scheduling", spec.scheduling)):
        for f in fields(parsed):
            value = getattr(parsed, f.name)
            shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
            assert tables[f"Job spec: `{section}`"][f.name][1] == f"`{shown}`", (section, f.name)
    cluster = parse_cluster({"node_groups": [{"gpu": "T4"}]})
    node = cluster.node_groups[0]
    rows = tables["Cluster file: `node_groups[]`"]
    assert rows["num_nodes"][1] == f"`{node.num_nodes}`" and rows["gpus_per_node"][1] == f"`{node.gpus_per_node}`"
    network = tables["Cluster file: `network`"]
    assert network["nics_per_node"][1] == f"`{node.nics_per_node}`" and network["nic_gbps"][1] == f"`{node.nic_gbit_s}`"
    assert tables["Cluster file: top level"]["name"][1] == f"`{cluster.name}`"
    assert tables["Job spec: top level"]["name"][1] == "`<model name>-job`" and spec.name == "llama3-8b-job"
    dense = parse_model(
        {"num_layers": 2, "hidden_size": 8, "ffn_hidden_size": 8, "num_attention_heads": 2, "vocab_size": 8}
    )
    assert dense.num_kv_heads == dense.num_attention_heads
    assert tables["Job spec: `model`"]["num_kv_heads"][1] == "`num_attention_heads`"


def test_a_field_without_a_docstring_stops_the_generator() -> None:
    @dataclass
    class Undocumented:
        size: int = 1

    with pytest.raises(ValueError, match=r"Undocumented\.size has no docstring"):
        rows_of(Undocumented)
