"""Estimates: the default list schedule and the time floor no run can beat."""

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hipipe_compiler.errors import PlanError
from hipipe_compiler.lower import lower
from hipipe_compiler.schedule import hierarchical_plan, time_floor_us
from hipipe_compiler.schedule.estimate import default_schedule
from hipipe_compiler.sim import simulate, simulate_exact
from hipipe_compiler.presets import preset

from conftest import examples, c1p
from strategies import plans


@given(plans())
def test_default_schedule_lists_each_stage_once_in_chunk_order(plan):
    sched = default_schedule(plan)
    assert sorted(sched) == sorted((k, j) for k in range(len(plan.chunks)) for j in range(len(plan.stages(k))))
    for k in range(len(plan.chunks)):
        js = [j for kk, j in sched if kk == k]
        assert js == sorted(js)


def test_default_schedule_pipelines_chunks_across_dimensions():
    plan = hierarchical_plan(c1p(4), "allreduce", chunks=4, max_bytes=1 << 28)
    sched = default_schedule(plan)
    # chunk 1 starts its first reduce-scatter before chunk 0 has finished all its stages
    assert sched.index((1, 0)) < sched.index((0, len(plan.stages(0)) - 1))
    # drain first: once chunk 0 can all-gather, it goes ahead of later chunks' first stages
    assert sched.index((0, 1)) < sched.index((3, 0))


@settings(max_examples=examples(80), deadline=None)
@given(plans(max_ranks=16), st.sampled_from([1 << 12, 1 << 20, 64 << 20]))
def test_no_run_of_a_plan_beats_its_time_floor(plan, nbytes):
    # the optimizer drops candidates by this floor, so it must never exceed a simulated time
    try:
        program = lower(plan)
    except PlanError:
        return
    nbytes -= nbytes % (program.nchunksperloop * 4)
    assume(nbytes > 0)
    assert time_floor_us(plan, nbytes) <= simulate(program, plan.topology, nbytes).time_us * (1 + 1e-9)


@pytest.mark.parametrize("name,chunks", [("torus-4x4", 4), ("dgx-h100-8x4", 8)])
def test_the_time_floor_is_close_for_a_large_pipelined_call(name, chunks):
    # not a vacuous floor: a bandwidth-bound hierarchical all-reduce runs within 25% of it
    topo = preset(name)
    plan = hierarchical_plan(topo, chunks=chunks, nominal_bytes=1 << 30, max_bytes=1 << 30)
    simulated = simulate_exact(lower(plan), topo, 1 << 30).time_us
    assert 0.75 * simulated <= time_floor_us(plan, 1 << 30) <= simulated
