"""NCCL as it really runs, timed by our simulator: its pick, its channels, its pipelines and its
channels' throughput, and the in-switch reduction's cost."""

from __future__ import annotations

from dataclasses import replace

import pytest

import hipipe_compiler.nccl.timing as timing
from hipipe_compiler.errors import PlanError
from hipipe_compiler.hardware import Latencies
from hipipe_compiler.nccl.setup import channels_for
from hipipe_compiler.nccl.timing import NcclTimer
from hipipe_compiler.sim.dag import Task, run_dag
from hipipe_compiler.topology import Dimension, Topology

CALL = Latencies(6.6, 14.0, 8.4)


def h100(nodes: int, **kw) -> Topology:
    dims = [Dimension(8, "switch", 370.8, link="nvlink", nvls={"efficiency": 0.85})]
    if nodes > 1:
        dims.append(Dimension(nodes, "switch", 50.0, link="network"))
    return Topology(tuple(dims), gpu="H100", call_latency=CALL, **kw)


def test_the_pick_is_nccls_and_the_channels_are_its_own():
    timer = NcclTimer(h100(2), "allreduce")
    for size in (8, 64 << 10, 1 << 20, 64 << 20):
        run = timer.pick(size)
        assert (run.algorithm, run.protocol) == timer.model.pick(size)
        assert run.channels == channels_for(timer.system, timer.model.graphs, run.algorithm, run.protocol, "allreduce", size)
        assert run.model_us == pytest.approx(timer.model.time_us(run.algorithm, run.protocol, size))


def test_a_per_call_cost_adds_to_every_time_of_its_protocol():
    base = NcclTimer(h100(2), "allreduce")
    dearer = NcclTimer(replace(h100(2), call_latency=Latencies(6.6, 14.0, 18.4)), "allreduce")
    for algorithm, protocol, size in (("ring", "Simple", 1 << 20), ("nvlstree", "Simple", 64 << 20), ("tree", "LL", 4096)):
        delta = dearer.run(size, algorithm, protocol).time_us - base.run(size, algorithm, protocol).time_us
        assert delta == pytest.approx(10.0 if protocol == "Simple" else 0.0, abs=1e-6)


def test_nccls_ring_reaches_the_networks_bound_across_two_nodes():
    # 16 channels, two per NIC: each GPU's NIC carries 1/8 of the ring's bytes; its posted
    # sends hide each hop's latency, as NCCL's FIFOs do
    run = NcclTimer(h100(2), "allreduce").run(4 << 30, "ring", "Simple")
    assert 0.97 * 400 < run.busbw_GBps <= 400.0 + 1e-6


def test_its_channels_cap_what_its_own_model_caps():
    timer = NcclTimer(h100(2), "allreduce")
    size = 16 << 20
    for algorithm, protocol in (("ring", "LL"), ("tree", "LL128"), ("nvlstree", "Simple")):
        run = timer.run(size, algorithm, protocol)
        assert run.time_us >= size / (timer.model.algbw_GBps[algorithm][protocol] * 1e3) * 0.999, algorithm
    slower = NcclTimer(h100(2, nccl_channel_scale=0.5), "allreduce")
    assert slower.run(size, "tree", "LL128").time_us > 1.5 * timer.run(size, "tree", "LL128").time_us


def test_nvls_on_one_node_runs_at_the_switchs_pace():
    run = NcclTimer(h100(1), "allreduce").run(16 << 30, "nvls", "Simple")
    bound = 2 * 7 / 9 * 0.85 * 370.8  # each port carries (1 + 1/8) M each way, at e B
    assert 0.9 * bound < run.busbw_GBps < bound


def test_nvlstree_timed_by_its_first_loops_is_within_a_percent_of_all_of_them(monkeypatch):
    timer = NcclTimer(h100(2), "allreduce")
    monkeypatch.setattr(timing, "STEADY_LOOPS", 16)  # 1 GiB runs 64 loops a channel: 33 of them simulated
    short = timer.run(1 << 30, "nvlstree", "Simple").time_us
    monkeypatch.setattr(timing, "STEADY_LOOPS", 10 ** 6)
    full = timer.run(1 << 30, "nvlstree", "Simple").time_us
    assert short == pytest.approx(full, rel=0.01)


def test_a_switch_reduce_and_a_multicast_store_move_at_the_in_switch_efficiency():
    topo = Topology((Dimension(8, "switch", 100.0, 2.0, nvls={"efficiency": 0.5}),))
    share = 1e6  # bytes each of the 8 ranks reduces, then stores
    tasks = [Task("reduce", r, dim=0, nbytes=share) for r in range(8)]
    tasks += [Task("store", r, dim=0, nbytes=share, deps=tuple(range(8))) for r in range(8)]
    # every port carries the 8 reduces' reads out (then the 8 stores in) at half its 100 GB/s
    assert run_dag(tasks, topo).time_us == pytest.approx(2 * (2.0 + 8 * share / 50e3))


def test_a_ring_too_large_to_lower_is_named_as_hipipes_limit_not_nccls(monkeypatch):
    monkeypatch.setattr(timing, "NCCL_LIMITS", replace(timing.NCCL_LIMITS, max_nodes=64))
    with pytest.raises(PlanError, match=r"NCCL's ring on \d+ channel\(s\) of .* is too large for hipipe to simulate"):
        NcclTimer(h100(2), "allreduce").run(1 << 20, "ring", "Simple")
