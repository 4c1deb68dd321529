"""One resolver for GPU names (issue 28 item 7): ``--gpu``, a cluster file's ``gpu`` and a scenario's
``request.gpu_type`` resolve alike, and a family name several parts share is an error listing them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frenzy_opt.cli import main
from frenzy_opt.hardware.cluster import parse_cluster
from frenzy_opt.hardware.gpus import _tokens, gpu_candidates, load_gpus, resolve_gpu
from frenzy_opt.planning.scenario import load_cluster_ref, load_scenario
from frenzy_opt.scenarios import __path__ as scenario_dirs

FAMILIES = {
    "v100": {"V100-PCIE-16GB", "V100-SXM2-16GB", "V100-SXM2-32GB", "V100-SXM3-32GB"},
    "a100": {"A100-PCIE-40GB", "A100-SXM4-40GB", "A100-PCIE-80GB", "A100-SXM4-80GB"},
    "h100": {"H100-PCIE-80GB", "H100-SXM5-80GB"},
    "a100-80gb": {"A100-PCIE-80GB", "A100-SXM4-80GB"},
    "v100-32gb": {"V100-SXM2-32GB", "V100-SXM3-32GB"},
    "gh200": {"GH200-96GB", "GH200-144GB"},
}
# Products whose whole name is a prefix of another product's (the RTX 2080 and the RTX 2080 Ti): exact aliases.
PREFIX_PRODUCTS = {"2080", "rtx 2080", "geforce rtx 2080", "nvidia geforce rtx 2080"}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_family_name_is_ambiguous_in_a_cluster_file_and_on_the_cli(
    family: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = {"name": "c", "node_groups": [{"gpu": family, "num_nodes": 1, "gpus_per_node": 8}]}
    with pytest.raises(ValueError, match="ambiguous") as err:
        parse_cluster(cluster)
    assert str(err.value).startswith(f"node_groups[0].gpu: {family!r} is ambiguous")
    assert all(name in str(err.value) for name in FAMILIES[family])
    assert main(["predict", "job-llama3-8b", "--gpu", family]) == 2
    message = capsys.readouterr().err
    assert "ambiguous" in message and all(name in message for name in FAMILIES[family])


def test_every_alias_names_one_part() -> None:
    """An alias whose words another part's names also hold would be a family name in disguise."""
    gpus = load_gpus()
    for gpu in gpus.values():
        for alias in gpu.aliases:
            others = [
                o.name
                for o in gpus.values()
                if o is not gpu and any(_tokens(alias) <= _tokens(n) for n in (o.name, *o.aliases))
            ]
            assert not others or alias in PREFIX_PRODUCTS, (gpu.name, alias, others)


def test_the_same_name_resolves_alike_everywhere(tmp_path: Path) -> None:
    for name in ("a100-sxm4-80g", "V100 SXM2 32GB", "h100 pcie", "RTX4090"):
        expected = resolve_gpu(name)
        cluster = parse_cluster({"name": "c", "node_groups": [{"gpu": name, "num_nodes": 1, "gpus_per_node": 4}]})
        assert cluster.gpu_types() == [expected]
        assert gpu_candidates(name) == [expected]
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        json.dumps(
            {
                "name": "s",
                "cluster": {
                    "name": "c",
                    "node_groups": [{"gpu": "V100-SXM2-32GB", "num_nodes": 1, "gpus_per_node": 8}],
                },
                "jobs": [{"model": "gpt3-125m", "request": {"gpu_type": "v100 sxm2 32gb", "num_gpus": 2}}],
            }
        )
    )
    assert load_scenario(str(scenario)).jobs[0].request.gpu_type == "V100-SXM2-32GB"  # type: ignore[union-attr]
    scenario.write_text(scenario.read_text().replace("v100 sxm2 32gb", "v100"))
    with pytest.raises(ValueError, match=r"jobs\[0\]\.request\.gpu_type: 'v100' is ambiguous"):
        load_scenario(str(scenario))


def test_every_shipped_cluster_and_scenario_still_loads() -> None:
    folder = Path(scenario_dirs[0])
    for path in sorted(folder.glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        if "node_groups" in text and "jobs" not in text and "workload" not in text:
            assert load_cluster_ref(str(path)).gpu_types(), path
        elif "cluster" in text and ("jobs:" in text or "workload:" in text):
            assert load_scenario(str(path)).cluster.gpu_types(), path
