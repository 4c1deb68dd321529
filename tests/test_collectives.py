"""Collectives priced at the bus bandwidth nccl-tests measured per link class (data/collectives.yaml)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from frenzy_opt.hardware import collectives
from frenzy_opt.hardware.gpus import load_gpus, lookup_gpu
from frenzy_opt.hardware.topology import HOST_STAGED_FRACTION, Links
from frenzy_opt.prediction.comms import collective_s, latency_s
from frenzy_opt.prediction.steptime import StepTimeModel, shipped_model

GIB = 2**30


def _busbw_time_s(nbytes: float, ranks: int, bus_gbyte_s: float) -> float:
    """Seconds of an all-reduce that reached ``bus_gbyte_s`` of nccl-tests bus bandwidth (PERFORMANCE.md:
    busbw = bytes / time x 2 (n-1)/n)."""
    return nbytes * 2 * (ranks - 1) / ranks / (bus_gbyte_s * 1e9)


def test_the_loader_returns_the_cited_figures() -> None:
    a100 = collectives.measurements("nvlink3_a100_nvswitch")
    assert a100["all_reduce"].bus_gbyte_s == 234.89  # ml-engineering network/README.md, 8 x A100, 16 GiB
    assert a100["all_reduce"].wire_gbyte_s == 300.0  # NVLink3: 600 GB/s bidirectional (gpus.yaml)
    assert a100["sendrecv"].bus_gbyte_s == 195.10
    staged = collectives.measurements("pcie_gen3_no_p2p")
    assert (staged["all_reduce"].bus_gbyte_s, staged["all_to_all"].bus_gbyte_s) == (4.00, 4.61)
    assert collectives.share("ib_edr_100g").share == pytest.approx(12.2 / 12.5)  # nccl-tests issue #29
    assert collectives.share("ib_hdr_200g_4nic").share == pytest.approx(96 / 100)  # 4 x 200 Gb/s, issue #119


def test_nvlink_sharp_is_not_a_wire_rate_the_ring_figure_is_used() -> None:
    """NVLS reduces in the switch (478.9 GB/s busbw on H100's 450 per direction); the ring figure is the link's."""
    h100 = collectives.measurements("nvlink4_h100_nvswitch")["all_reduce"]
    assert h100.bus_gbyte_s == 367.2 and h100.algo == "Ring"
    assert "ml-engineering" in h100.citation and "SHARP" in h100.locator
    assert collectives.measurements("nvlink5_b200_nvswitch")["all_reduce"].bus_gbyte_s == 682.2
    # Every link a catalogue GPU or an InfiniBand network maps to reaches at most its wire.
    for gpu in load_gpus().values():
        for gbit_s in (50.0, 200.0, 400.0, 800.0):
            links = Links.for_gpu(gpu, inter_node_gbit_s=8 * gbit_s, nics_per_node=8)
            assert 0 < links.intra_node_share <= 1 and 0 < links.nic_share <= 1, gpu.name


def test_the_figures_the_step_time_docstring_quotes() -> None:
    """frenzy_opt/prediction/steptime.py's module docstring quotes these shares."""
    assert round(collectives.share("nvlink3_a100_nvswitch").share, 2) == 0.78
    assert round(collectives.share("nvlink4_h100_nvswitch").share, 2) == 0.82
    assert collectives.share("pcie_gen3_no_p2p").share == HOST_STAGED_FRACTION == 0.25
    infiniband = [collectives.share(c).share for c in ("ib_edr_100g", "ib_hdr_200g_4nic", "ib_ndr_400g_8nic")]
    assert min(infiniband) >= 0.96 and max(infiniband) <= 0.98


def test_an_h100_node_all_reduce_takes_the_measured_busbw_time() -> None:
    """1 GiB over the 8 GPUs of an H100 NVSwitch node: the model's time (bytes and call latency) is within 2 % of
    the time the measured ring busbw gives (367.2 GB/s, data/collectives.yaml)."""
    h100 = lookup_gpu("H100-SXM5-80GB")
    links = Links.for_gpu(h100)
    assert links.intra_node_class == "nvlink4_h100_nvswitch"
    model = shipped_model()
    seconds = collective_s(links, GIB, 8, 1, model.link_efficiency) + latency_s(links, 8, 1)
    assert seconds == pytest.approx(_busbw_time_s(GIB, 8, 367.2), rel=0.02)


@pytest.mark.parametrize(
    ("gpu", "link_class", "busbw"),
    [("B200-SXM-180GB", "aws_efa_p6_b200_3200g", 381.80), ("H200-SXM-141GB", "aws_efa_p5en_3200g", 364.87)],
)
def test_four_node_all_reduces_within_5_percent_of_measured(gpu: str, link_class: str, busbw: float) -> None:
    """A cross-check on measurements no share comes from: 32 ranks on 4 nodes of 8 GPUs with 3200 Gb/s per node
    (AWS p6-b200 and p5en, data/collectives.yaml), priced with InfiniBand's measured share (NDR falls back to
    HDR's), at the measured message size."""
    entry = collectives.measurements(link_class)["all_reduce"]
    assert entry.bus_gbyte_s == busbw and entry.ranks == 32
    links = Links.for_gpu(lookup_gpu(gpu), inter_node_gbit_s=3200)
    nbytes = 16 * GIB if gpu.startswith("B200") else 4 * GIB
    seconds = collective_s(links, nbytes, 32, 1, 1.0) + latency_s(links, 32, 1)
    assert seconds == pytest.approx(_busbw_time_s(nbytes, 32, busbw), rel=0.05)


def test_pcie_boards_without_p2p_keep_the_host_staged_share() -> None:
    for name in ("RTX-2080Ti", "RTX-3090", "RTX-4090"):
        links = Links.for_gpu(lookup_gpu(name), gpus_per_node=4)
        assert links.host_staged and links.intra_node_share == HOST_STAGED_FRACTION, name
    assert Links.for_gpu(lookup_gpu("RTX-2080Ti")).intra_node_class == "pcie_gen3_no_p2p"  # measured on this board
    # A P2P board is not staged; an NVLink bridge stated for the server is priced as a bridge.
    assert not Links.for_gpu(lookup_gpu("A10G"), gpus_per_node=4).host_staged
    bridged = Links.for_gpu(lookup_gpu("RTX-3090"), intra_node="pcie", intra_node_spec_gbyte_s=112.5)
    assert not bridged.host_staged and bridged.intra_node_class == "nvlink_bridge_turing_2gpu"
    assert bridged.intra_node_share == pytest.approx(21.40 / 50)  # 2 x RTX 2080 Ti on a bridge, issue #44


def test_an_unmeasured_class_falls_back_to_its_sibling_flagged() -> None:
    """V100's NVLink2, a data-centre PCIe board with P2P, an RTX 4090 node, GB200 NVL72 and InfiniBand NDR have no
    all-reduce measurement of their own (data/collectives.yaml): each takes FALLBACK's sibling, flagged."""
    cases = {
        "nvlink2_v100_dgx1": "nvlink3_a100_nvswitch",
        "pcie_gen4_datacenter_p2p": "pcie_gen5_consumer_8gpu",
        "pcie_gen4_consumer_8gpu": "pcie_gen3_no_p2p",
        "nvlink5_gb200_nvl72": "nvlink5_gb200_4gpu_tray",
        "ib_ndr_400g_8nic": "ib_hdr_200g_4nic",
        "ib_xdr_800g": "ib_hdr_200g_4nic",
    }
    for name, sibling in cases.items():
        fallback = collectives.share(name)
        assert fallback.fallback and fallback.measured_class == sibling, name
        assert fallback.share == collectives.share(sibling).share and not collectives.share(sibling).fallback
    assert Links.for_gpu(lookup_gpu("V100-SXM2-32GB")).intra_node_class == "nvlink2_v100_dgx1"
    assert Links.for_gpu(lookup_gpu("T4"), gpus_per_node=4).intra_node_class == "pcie_gen4_datacenter_p2p"
    gb200 = Links.for_gpu(lookup_gpu("GB200-186GB"), gpus_per_node=4, nvlink_domain=72)
    assert gb200.intra_node_class == "nvlink5_gb200_nvl72"
    with pytest.raises(ValueError, match="no all-reduce measurement"):
        collectives.share("azure_nd_ib_multinode")
    with pytest.raises(ValueError, match="unknown link class"):
        collectives.share("nvlink9")


def test_the_network_class_follows_the_speed_of_one_nic() -> None:
    h100 = lookup_gpu("H100-SXM5-80GB")
    assert Links.for_gpu(h100, inter_node_gbit_s=8 * 400, nics_per_node=8).nic_class == "ib_ndr_400g_8nic"
    assert Links.for_gpu(h100, inter_node_gbit_s=8 * 200).nic_class == "ib_hdr_200g_4nic"  # one NIC per GPU
    assert Links.for_gpu(h100, inter_node_gbit_s=400, nics_per_node=1).nic_class == "ib_ndr_400g_8nic"
    assert Links.for_gpu(h100, inter_node_gbit_s=50, nics_per_node=1).nic_class == "ib_edr_100g"
    assert collectives.network_class(1600) == "ib_xdr_800g"


def test_link_efficiency_multiplies_the_measured_share() -> None:
    assert StepTimeModel().link_efficiency == 1.0 == shipped_model().link_efficiency
    links = Links.for_gpu(lookup_gpu("A100-SXM4-80GB"), inter_node_gbit_s=8 * 200)
    assert collective_s(links, GIB, 16, 1, 0.5) == pytest.approx(2 * collective_s(links, GIB, 16, 1, 1.0))
    assert links.intra_node_bytes_s() == pytest.approx(300e9 * 234.89 / 300)
    slower = replace(links, nic_share=links.nic_share / 2)
    assert collective_s(slower, GIB, 16, 1, 1.0) > collective_s(links, GIB, 16, 1, 1.0)
