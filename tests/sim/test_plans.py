"""Plans timed under the cost model: what each operation costs, and agreement with the same
program as MSCCL XML where the two runtimes do the same work."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hipipe_compiler.plan_fitting import fit
from hipipe_compiler.sim.plans import time_plan
from hipipe_compiler.presets import preset
from hipipe_compiler.schedule import hierarchical_plan
from hipipe_compiler.sim import SimulationError, simulate_exact
from hipipe_compiler.topology import Dimension, Topology


@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather"])
def test_one_node_ll_plans_take_the_xml_programs_time(collective):
    # packets only: no signals, no handshake; each packet put is the XML send it comes from
    topo = preset("dgx-h100-8x1")
    program, plan = fit(hierarchical_plan(topo, collective, chunks=2, protocol="LL", max_bytes=1 << 20), topo, "t")
    assert plan.use_double_scratch_buffer
    for size in (1 << 16, 1 << 18):
        assert time_plan(plan, topo, size).time_us == pytest.approx(simulate_exact(program, topo, size).time_us, rel=1e-9)


def test_a_simple_plan_pays_one_closing_signal_more_than_xml():
    topo = Topology((Dimension(4, "switch", 100.0, 2.0),))
    program, plan = fit(hierarchical_plan(topo, "allgather", protocol="Simple", max_bytes=1 << 20), topo, "t")
    size = 1 << 20
    xml, ours = simulate_exact(program, topo, size).time_us, time_plan(plan, topo, size).time_us
    # a put moves its bytes, its signal pays the 2 us the XML send paid; the handshake adds one more
    assert ours == pytest.approx(xml + 2.0, rel=1e-6)


def test_time_is_bounded_below_and_grows_with_size():
    topo = preset("dgx-h100-8x2")
    _, plan = fit(hierarchical_plan(topo, "allreduce", chunks=4, max_bytes=1 << 30), topo, "t")
    times = [time_plan(plan, topo, s) for s in (1 << 20, 1 << 24, 1 << 28)]
    assert all(t.time_us >= t.lower_bound_us for t in times)
    assert times[0].time_us < times[1].time_us < times[2].time_us


def test_sizes_the_executor_refuses_are_named():
    topo = preset("dgx-h100-8x1")
    _, plan = fit(hierarchical_plan(topo, "allreduce", chunks=2, max_bytes=1 << 20), topo, "t")
    with pytest.raises(SimulationError, match="chunks") as err:
        time_plan(plan, topo, (1 << 20) + 4)
    assert err.value.exit_code == 2
    with pytest.raises(SimulationError, match="outside"):
        time_plan(plan, topo, 1 << 24)


def test_a_plan_that_never_signals_deadlocks():
    topo = preset("dgx-h100-8x1")
    _, plan = fit(hierarchical_plan(topo, "allreduce", chunks=2, protocol="Simple", max_bytes=1 << 20), topo, "t")
    gpus = tuple(replace(g, threadblocks=tuple(replace(tb, ops=tuple(o for o in tb.ops if o.name != "signal"))
                                                for tb in g.threadblocks)) for g in plan.gpus)
    with pytest.raises(SimulationError, match="deadlock"):
        time_plan(replace(plan, gpus=gpus), topo, 1 << 20)
