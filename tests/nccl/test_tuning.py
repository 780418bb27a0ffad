"""NCCL's own model (nccl/tuning.py) gives the numbers of nccl-tuning.md's worked examples:
8 x H100 on one node (2.4), the 3 x 8 Tree/LL latency of a real log (3), and the multi-node
tables read from NCCL 2.30.7."""

from __future__ import annotations

import pytest

from hipipe_compiler.nccl.tuning import Model, System, graphs, runtime_channels
from hipipe_compiler.topology import Dimension, Topology


def h100(nodes: int, nvls: bool = True, cpu: str | None = None) -> Topology:
    dims = [Dimension(8, "switch", 370.8, link="nvlink", nvls={"efficiency": 0.85} if nvls else None)]
    if nodes > 1:
        dims.append(Dimension(nodes, "switch", 50.0, link="network"))
    return Topology(tuple(dims), gpu="H100", cpu=cpu)


def model(nodes: int, **kw) -> Model:
    return Model.of(System.of(h100(nodes, **kw)), "allreduce")


def test_one_h100_node_has_the_worked_examples_bandwidths_and_latencies():
    m = model(1)
    algbw = {(a, p): round(m.algbw_GBps[a][p], 1) for a in ("ring", "tree") for p in ("LL", "LL128", "Simple")}
    assert algbw == {("ring", "LL"): 80.6, ("ring", "LL128"): 189.3, ("ring", "Simple"): 205.7,
                     ("tree", "LL"): 43.6, ("tree", "LL128"): 128.8, ("tree", "Simple"): 165.6}
    lat = {(a, p): round(m.latency_us[a][p], 1) for a in ("ring", "tree") for p in ("LL", "LL128", "Simple")}
    assert lat == {("ring", "LL"): 15.0, ("ring", "LL128"): 40.6, ("ring", "Simple"): 56.0,
                   ("tree", "LL"): 15.2, ("tree", "LL128"): 31.5, ("tree", "Simple"): 64.4}
    assert round(m.busbw_GBps("nvls", "Simple"), 1) == 476.0
    assert round(m.algbw_GBps["nvls"]["Simple"], 1) == 272.0
    assert m.latency_us["nvls"]["Simple"] == 25.0


def test_one_h100_node_picks_ring_ll_then_nvls_from_about_1_1_mb():
    m = model(1)
    lo, hi = 1 << 10, 1 << 24
    assert m.pick(lo) == ("ring", "LL") and m.pick(hi) == ("nvls", "Simple")
    while hi - lo > 1:  # the crossover, by bisection: "Ring/LL up to about 1.1 MB, NVLS/Simple above"
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if m.pick(mid) == ("ring", "LL") else (lo, mid)
    # where the worked example's lines cross: 15.0 us + n / 80.6 GB/s = 25.0 us + n / 272 GB/s
    # (nccl-tuning.md 2.4; its "about 1.1 MB"), within the rounding of 80.6
    assert hi == pytest.approx((25.0 - 15.0) / (1 / 80.6e3 - 1 / 272.0e3), rel=1e-3)
    picks = {m.pick(1 << k) for k in range(3, 35)}
    assert picks == {("ring", "LL"), ("nvls", "Simple")}  # LL128 and Simple never win here


def test_tree_ll_on_3_by_8_h100_takes_the_latency_of_the_real_log():
    # NVIDIA/nccl#1453: "4 Bytes -> Algo 0 proto 0 time 25.200462" on 3 x 8 H100
    m = model(3)
    assert m.latency_us["tree"]["LL"] == pytest.approx(25.2, abs=1e-6)
    assert m.time_us("tree", "LL", 4) == pytest.approx(25.2, abs=1e-3)


@pytest.mark.parametrize("nodes,tree,ring,nvlstree", [
    (2, ((16.6, 25.2), (124.8, 48.5), (140.8, 92.4)), ((20.8, 40.0), (156.6, 75.2), (204.8, 131.6)), (246.2, 66.8)),
    (4, ((8.7, 35.2), (98.6, 65.5), (122.4, 120.4)), ((10.5, 78.8), (151.5, 144.4), (198.2, 282.8)), (187.9, 108.6)),
    (8, ((8.7, 45.2), (98.6, 82.5), (122.4, 148.4)), ((10.4, 156.4), (149.1, 282.8), (195.0, 585.2)), (184.9, 150.4)),
])
def test_h100_across_nodes_has_nccls_algorithm_bandwidths_and_latencies(nodes, tree, ring, nvlstree):
    m = model(nodes)
    for a, want in (("tree", tree), ("ring", ring)):
        got = tuple((round(m.algbw_GBps[a][p], 1), round(m.latency_us[a][p], 1)) for p in ("LL", "LL128", "Simple"))
        assert got == want, a
    assert (round(m.algbw_GBps["nvlstree"]["Simple"], 1), round(m.latency_us["nvlstree"]["Simple"], 1)) == nvlstree
    assert m.algbw_GBps["nvls"]["Simple"] == 0  # NVLS across nodes needs CollNet


def test_graphs_and_channels_are_nccls_on_h100():
    one, two = System.of(h100(1)), System.of(h100(2))
    g1, g2 = graphs(one), graphs(two)
    assert (g1["ring"].channels, g1["ring"].bw_intra) == (12, 30.0)
    assert (g1["nvls"].channels, g1["nvls"].bw_intra, g1["nvls"].bw_inter) == (8, 40.0, 60.0)
    assert (g2["ring"].channels, g2["ring"].bw_intra, g2["tree"].pattern) == (8, 48.0, "tree")
    assert runtime_channels(one, g1) == 24 and runtime_channels(two, g2) == 16


def test_nvls_needs_the_switch_to_reduce_and_ll_caps_depend_on_the_cpu():
    assert model(1, nvls=False).algbw_GBps["nvls"]["Simple"] == 0
    intel, amd = model(2, cpu="intel"), model(2, cpu="amd")
    assert intel.algbw_GBps["ring"]["LL"] != amd.algbw_GBps["ring"]["LL"]  # llMaxBw rows 0 and 1
    only_ring = Model.of(System.of(h100(2)), "allreduce", algorithms=("ring",))
    assert {only_ring.pick(1 << k)[0] for k in range(3, 33)} == {"ring"}
