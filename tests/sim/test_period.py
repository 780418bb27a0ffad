"""Skipping the replays' periodic steady state (sim/period.py) gives the times of full replay:
on random programs of random topologies at sizes of many iterations, and it does skip where
the steady state is reached."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hipipe_compiler.errors import PlanError
from hipipe_compiler.hardware import Latencies
from hipipe_compiler.lower import lower
from hipipe_compiler.msccl.runtime import SLICE_BYTES
from hipipe_compiler.optimizer import Knobs, build_plan
from hipipe_compiler.presets import preset
from hipipe_compiler.schedule.baselines import hierarchical_plan, nccl_plan, ring_plan
from hipipe_compiler.sim import period, simulate

from conftest import examples, c1p
from strategies import plans

#: The skipped periods may move the end by this fraction of the run (period.TOLERANCE per
#: value, summed over the periods), far below what the model resolves.
SAME = 1e-8


def same_result(fast, full) -> None:
    assert fast.time_us == pytest.approx(full.time_us, rel=SAME, abs=1e-9)
    for a, b in zip(fast.dims, full.dims):
        assert a.bytes_per_rank == pytest.approx(b.bytes_per_rank, rel=SAME)
        assert a.busy_fraction == pytest.approx(b.busy_fraction, rel=1e-6, abs=1e-9)


@settings(max_examples=examples(20))
@given(plan=plans(max_ranks=16, max_chunks=3), iterations=st.integers(12, 40), call=st.sampled_from([None, 5.0]),
       fraction=st.sampled_from([1.0, 0.7]))
def test_skipping_the_steady_state_gives_the_times_of_full_replay(plan, iterations, call, fraction):
    try:
        program = lower(plan)
    except PlanError:
        return
    topo = replace(plan.topology, call_latency=call)
    # a size that the runtime replays `iterations` times, the last slice `fraction` full
    size = math.ceil(program.nchunksperloop * SLICE_BYTES[program.protocol] * (iterations - 1 + fraction))
    fast, full = simulate(program, topo, size), simulate(program, topo, size, shortcut=False)
    assert fast.iterations == full.iterations == iterations
    same_result(fast, full)


@pytest.mark.parametrize("name,build,quotient", [
    ("torus two-chunk pipeline", lambda: build_plan(preset("torus-4x4"), "allreduce", 1 << 30, 1 << 30,
                                                    Knobs(2, mix=True, ag_lane=True)), True),
    ("hierarchical k4", lambda: hierarchical_plan(c1p(2), "allreduce", 4, max_bytes=1 << 30), True),
    ("NCCL's ring under LL", lambda: nccl_plan(c1p(2), "ring", "allreduce", "LL", 1 << 20, 1 << 20,
                                               1 << 20), False),
])
def test_a_steady_state_is_skipped_and_the_time_is_the_same(name, build, quotient):
    plan = build()
    program = lower(plan, ranks=[0] if quotient else None)
    topo = replace(plan.topology, call_latency=Latencies(6.6, 14.0, 8.4))
    size = program.nchunksperloop * SLICE_BYTES[program.protocol] * 48
    fast = simulate(program, topo, size, quotient=quotient)
    full = simulate(program, topo, size, quotient=quotient, shortcut=False)
    assert fast.skipped_iterations > 24 and full.skipped_iterations == 0
    same_result(fast, full)


def test_a_period_of_many_iterations_is_found():
    """A flat ring of 16 ranks repeats only every 8 of its iterations (it once replayed all
    32,768 of them at 1 TiB)."""
    topo = preset("torus-4x4")
    program = lower(ring_plan(topo, "allreduce", 1, "Simple", 1 << 30, 1 << 30, 1 << 30))
    size = program.nchunksperloop * SLICE_BYTES[program.protocol] * 64
    fast, full = simulate(program, topo, size), simulate(program, topo, size, shortcut=False)
    assert fast.skipped_iterations >= 32 and full.skipped_iterations == 0
    same_result(fast, full)


def test_components_that_drift_apart_each_keep_their_own_period(monkeypatch):
    """A both-way pipeline with lane groups on torus-4x4: some of rank 0's threadblocks replay
    faster than others that depend on them, so their offset grows and the whole state never
    repeats, yet each component's does (without components nothing is skipped)."""
    topo = preset("torus-4x4")
    plan = build_plan(topo, "allreduce", 1 << 30, 1 << 30, Knobs(8, mix=True, ag_lane=True, bidir=True, spread=2))
    program = lower(plan, ranks=[0])
    size = program.nchunksperloop * SLICE_BYTES[program.protocol] * 40
    fast = simulate(program, topo, size, quotient=True)
    full = simulate(program, topo, size, quotient=True, shortcut=False)
    assert fast.skipped_iterations > 0
    same_result(fast, full)
    original = period.components

    def one_component(sim):
        component, firsts, _crossing, _pairs = original(sim)
        return dict.fromkeys(component, 0), [min(firsts, key=lambda t: t.key)], {}, []
    monkeypatch.setattr(period, "components", one_component)
    assert simulate(program, topo, size, quotient=True).skipped_iterations == 0


def test_a_timeline_replays_every_iteration():
    plan = hierarchical_plan(preset("torus-4x4"), "allreduce", 2, max_bytes=1 << 30)
    program = lower(plan)
    size = program.nchunksperloop * SLICE_BYTES[program.protocol] * 20
    recorded = simulate(program, plan.topology, size, record=True)
    assert recorded.skipped_iterations == 0
    assert len({iv.iteration for iv in recorded.intervals}) == 20
