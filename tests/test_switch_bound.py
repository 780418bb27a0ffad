"""The limit with in-switch reduction (switch_bound.py, docs/limits.md): the GPU-side limit
where no dimension reduces in the switch, never above it where one does, and never above any
schedule of a family that mixes GPU-side and in-switch stages (switch_schedules.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hipipe_compiler.bounds import bandwidth_bound_us, lower_bound, lower_bound_us
from hipipe_compiler.presets import preset
from hipipe_compiler.sim.dag import run_dag
from hipipe_compiler.switch_bound import in_switch_bandwidth_us
from hipipe_compiler.topology import Dimension, Topology

from conftest import topologies
from switch_schedules import allreduce_tasks, family

COLLECTIVES = ("allreduce", "reducescatter", "allgather")
NV = {"efficiency": 0.85}


def without_nvls(topology: Topology) -> Topology:
    return replace(topology, dimensions=tuple(replace(d, nvls=None) for d in topology.dimensions))


@given(topologies(max_ranks=256), st.sampled_from(COLLECTIVES))
def test_without_in_switch_reduction_the_program_gives_the_closed_form(topo, collective):
    topo = without_nvls(topo)
    lp, k = in_switch_bandwidth_us(topo, collective, 1 << 30)
    closed, closed_k = bandwidth_bound_us(topo, collective, 1 << 30)
    assert lp == pytest.approx(closed, rel=1e-7)
    assert lower_bound(topo, collective, 1 << 30) == lower_bound(topo, collective, 1 << 30, in_switch=False)


@given(topologies(max_ranks=256), st.sampled_from(COLLECTIVES), st.data())
def test_in_switch_reduction_never_raises_the_limit_and_more_efficiency_never_hurts(topo, collective, data):
    switches = [d for d, dim in enumerate(topo.dimensions) if dim.kind == "switch"]
    if not switches:
        return
    chosen = data.draw(st.sets(st.sampled_from(switches), min_size=1))
    low, high = sorted(data.draw(st.lists(st.floats(0.3, 1.0), min_size=2, max_size=2)))

    def with_nvls(e: float) -> Topology:
        return replace(topo, dimensions=tuple(replace(dim, nvls={"efficiency": e}) if d in chosen else dim
                                              for d, dim in enumerate(topo.dimensions)))
    gpu_side = bandwidth_bound_us(without_nvls(topo), collective, 1 << 30)[0]
    slow, fast = (in_switch_bandwidth_us(with_nvls(e), collective, 1 << 30)[0] for e in (low, high))
    assert fast <= slow * (1 + 1e-7) and slow <= gpu_side * (1 + 1e-7)


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
@pytest.mark.parametrize("efficiency", [0.5, 0.85, 1.0])
def test_one_switch_has_the_closed_form_of_the_docs(n, efficiency):
    """An all-reduce on one switch: (1 + 1/n) M / (e B) in the switch or 2 (n-1)/n M / B on
    the GPUs, whichever is less; a reduce-scatter or all-gather gains nothing from the switch
    (a switch reduce reads n bytes to merge n - 1, so the senders' ports bind)."""
    topo = Topology((Dimension(n, "switch", 300, 1.0, nvls={"efficiency": efficiency}),))
    m, b = 1 << 30, 300e3
    want = min((1 + 1 / n) / efficiency, 2 * (n - 1) / n) * m / b
    assert in_switch_bandwidth_us(topo, "allreduce", m)[0] == pytest.approx(want, rel=1e-7)
    for collective in ("reducescatter", "allgather"):
        assert in_switch_bandwidth_us(topo, collective, m)[0] == pytest.approx((n - 1) / n * m / b, rel=1e-7)


def test_the_h100_machines_are_limited_as_the_issue_estimates():
    """cost-model.md section 5 and the NVLS issue: 4 nodes are limited by the network alone (the
    suffix of nodes binds), and a node's NVLink limit falls with the switch's reduction."""
    four = preset("dgx-h100-8x4")
    bound = lower_bound(four, "allreduce", 1 << 30)
    assert bound.in_switch and bound.binding_from == 1
    network = four.dimensions[1]
    assert bound.bandwidth_us == pytest.approx(2 * 3 * (1 << 30) / (32 * network.bandwidth * 1e3), rel=1e-7)
    one = preset("dgx-h100-8x1")
    dim = one.dimensions[0]
    assert lower_bound(one, "allreduce", 1 << 30).bandwidth_us == pytest.approx(
        9 / 8 * (1 << 30) / (dim.nvls.efficiency * dim.bandwidth * 1e3), rel=1e-7)


def test_the_limit_pays_the_in_switch_call_cost_only_where_the_switch_is_worth_it():
    topo = Topology((Dimension(8, "switch", 300, 1.0, nvls={"efficiency": 0.85, "call_latency": 10}),),
                    call_latency=5)
    small, large = lower_bound(topo, "allreduce", 1 << 16), lower_bound(topo, "allreduce", 1 << 30)
    assert not small.in_switch and small.call_us == 5
    assert large.in_switch and large.call_us == 15
    assert lower_bound_us(topo, "allreduce", 1 << 30) < lower_bound_us(topo, "allreduce", 1 << 30, in_switch=False)
    assert not lower_bound(topo, "reducescatter", 1 << 30).in_switch


def _small_topologies() -> dict[str, Topology]:
    sw, ring = "switch", "ring"
    low = {"efficiency": 0.5}
    calls = {"efficiency": 0.85, "call_latency": 4.0}
    return {
        "switch-2-nvls": Topology((Dimension(2, sw, 300, 0.5, nvls=NV),)),
        "switch-3-nvls-e1": Topology((Dimension(3, sw, 300, 0.5, nvls={"efficiency": 1.0}),)),
        "switch-4-nvls": Topology((Dimension(4, sw, 300, 0.5, nvls=NV),)),
        "switch-8-nvls": Topology((Dimension(8, sw, 300, 0.5, nvls=NV),)),
        "switch-8-nvls-calls": Topology((Dimension(8, sw, 300, 0.5, nvls=calls),), call_latency=3.0),
        "switch-4-low-efficiency": Topology((Dimension(4, sw, 300, 0.5, nvls=low),)),
        "switch-4": Topology((Dimension(4, sw, 300, 0.5),)),
        "ring-4": Topology((Dimension(4, ring, 100, 0.5),)),
        "4x2-nvls": Topology((Dimension(4, sw, 300, 0.5, nvls=NV), Dimension(2, sw, 50, 2.0))),
        "4x2": Topology((Dimension(4, sw, 300, 0.5), Dimension(2, sw, 50, 2.0))),
        "2x4-nvls": Topology((Dimension(2, sw, 300, 0.5, nvls=NV), Dimension(4, sw, 50, 2.0))),
        "4x3-nvls-ring": Topology((Dimension(4, sw, 300, 0.5, nvls=NV), Dimension(3, ring, 50, 2.0))),
        "3x3-nvls": Topology((Dimension(3, sw, 200, 0.5, nvls=NV), Dimension(3, sw, 100, 1.0))),
        "2x2-both-nvls": Topology((Dimension(2, sw, 300, 0.5, nvls=NV), Dimension(2, sw, 100, 1.0, nvls=low))),
        "4x4-outer-nvls": Topology((Dimension(4, ring, 100, 0.5), Dimension(4, sw, 200, 1.0, nvls=NV))),
        "4x2-fast-network": Topology((Dimension(4, sw, 100, 0.5, nvls=NV), Dimension(2, sw, 400, 2.0))),
        "3x2-low-efficiency": Topology((Dimension(3, sw, 300, 0.5, nvls=low), Dimension(2, sw, 50, 2.0))),
        "2x3-nvls-outer": Topology((Dimension(2, ring, 100, 0.5), Dimension(3, sw, 300, 1.0, nvls=NV))),
        "2x2x2-nvls": Topology((Dimension(2, sw, 300, 0.5, nvls=NV), Dimension(2, sw, 100, 1.0),
                                Dimension(2, sw, 25, 3.0))),
        "2x2x2": Topology((Dimension(2, sw, 300, 0.5), Dimension(2, ring, 100, 1.0), Dimension(2, sw, 25, 3.0))),
        "4x2-calls": Topology((Dimension(4, sw, 300, 0.5, nvls=calls), Dimension(2, sw, 50, 2.0)),
                              call_latency={"LL": 2.0, "LL128": 3.0, "Simple": 4.0}),
        "8x2-h100-like": Topology((Dimension(8, sw, 370.8, 0.6, nvls=NV), Dimension(2, sw, 50, 3.0))),
    }


SMALL = _small_topologies()


def _time(topology: Topology, nbytes: float, schedule: dict) -> float:
    """A family schedule's time, after the per-call cost of Simple and, where it reduces in the
    switch, the cheapest in-switch call cost."""
    switched = any(w in ("switch", "multicast") for w in (*schedule["scatter"].values(), *schedule["gather"].values()))
    start = topology.call_cost("Simple")
    if switched:
        start += min(topology.dimensions[d].nvls.call_latency for d in topology.nvls_dimensions)
    return run_dag(allreduce_tasks(topology, nbytes, **schedule), topology, start_us=start).time_us


@pytest.mark.parametrize("name", sorted(SMALL))
def test_no_schedule_of_the_family_beats_the_limit(name):
    """Every schedule of the family, at a latency-bound and a bandwidth-bound size: at or
    above T_LB. Where the switch reduces, the best one beats the GPU-side limit, which
    therefore is no limit there."""
    topo = SMALL[name]
    for nbytes in (64 << 10, 64 << 20):
        bound = lower_bound_us(topo, "allreduce", nbytes)
        times = {label: _time(topo, nbytes, schedule) for label, schedule in family(topo)}
        best = min(times, key=times.get)
        assert times[best] >= bound * (1 - 1e-9), (nbytes, best, times[best], bound)
        gpu_side = lower_bound_us(topo, "allreduce", nbytes, in_switch=False)
        if nbytes > 1 << 20 and name.startswith("switch-8-nvls"):
            assert times[best] < gpu_side, (best, times[best], gpu_side)


@pytest.mark.parametrize("name,within", [("switch-8-nvls", 1.08), ("switch-3-nvls-e1", 1.08),
                                         ("4x2-nvls", 1.15), ("8x2-h100-like", 1.15)])
def test_pipelined_in_switch_schedules_come_close_to_the_limit(name, within):
    """The limit is not loose: with 16 chunks a schedule of the family comes within 8 % of it
    at 256 MiB on one switch, and within 15 % on two dimensions (pipeline fill, and the
    sharing rule of cost-model.md section 2: a multicast store behind eight switch reduces on
    a port gets a ninth of it)."""
    topo, nbytes = SMALL[name], 256 << 20
    best = min(_time(topo, nbytes, schedule) for _label, schedule in family(topo, chunk_counts=(16,)))
    bound = lower_bound_us(topo, "allreduce", nbytes)
    assert bound <= best <= within * bound, best / bound
