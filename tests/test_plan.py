"""Plans: stages, checks, the default emission order and the baseline builders."""

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from conftest import topologies
from hipipe_compiler.errors import PlanError
from hipipe_compiler.plan import (
    ChunkPlan, Plan, bandwidth_order, check_plan, chunk_stages, default_schedule, hierarchical_plan, ring_plan,
    time_floor_us,
)
from hipipe_compiler.lowering import lower
from hipipe_compiler.simulate import simulate, simulate_exact
from hipipe_compiler.topology import preset
from strategies import plans


def test_stages_of_each_collective():
    assert [(s.kind, s.axis) for s in chunk_stages("allreduce", (0, 1, 2))] == [
        ("rs", 0), ("rs", 1), ("ar", 2), ("ag", 1), ("ag", 0)]
    assert [(s.kind, s.axis) for s in chunk_stages("reducescatter", (1, 0))] == [("rs", 1), ("rs", 0)]
    assert [(s.kind, s.axis) for s in chunk_stages("allgather", (1, 0))] == [("ag", 0), ("ag", 1)]
    assert [s.depth for s in chunk_stages("allgather", (1, 0))] == [1, 0]


@given(plans())
def test_default_schedule_lists_each_stage_once_in_chunk_order(plan):
    sched = default_schedule(plan)
    assert sorted(sched) == sorted((k, j) for k in range(len(plan.chunks)) for j in range(len(plan.stages(k))))
    for k in range(len(plan.chunks)):
        js = [j for kk, j in sched if kk == k]
        assert js == sorted(js)


def test_default_schedule_pipelines_chunks_across_dimensions():
    plan = hierarchical_plan(preset("dgx-h100-8x4"), "allreduce", chunks=4, max_bytes=1 << 28)
    sched = default_schedule(plan)
    # chunk 1 starts its first reduce-scatter before chunk 0 has finished all its stages
    assert sched.index((1, 0)) < sched.index((0, len(plan.stages(0)) - 1))
    # drain first: once chunk 0 can all-gather, it goes ahead of later chunks' first stages
    assert sched.index((0, 1)) < sched.index((3, 0))


@settings(max_examples=80, deadline=None)
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


def test_bandwidth_order_puts_the_fastest_dimension_first():
    assert bandwidth_order(preset("dgx-h100-8x4")) == (0, 1)
    assert bandwidth_order(preset("torus-4x4x4")) == (0, 1, 2)


@given(topologies(max_ranks=64))
def test_hierarchical_plan_uses_both_ring_directions(topo):
    plan = hierarchical_plan(topo, "allreduce", chunks=2)
    rings = any(d.kind == "ring" and d.size >= 3 for d in topo.dimensions)
    assert {c.direction for c in plan.chunks} == ({1, -1} if rings else {1})
    assert len(plan.chunks) == (4 if rings else 2)
    assert plan.nchunksperloop == plan.units * topo.nranks


def test_ring_plan_is_flat():
    plan = ring_plan(preset("torus-4x4"), "allreduce", chunks=3)
    assert plan.flat and plan.naxes == 1 and len(plan.chunks) == 3 and plan.algorithms == ("ring",)


def _plan(**kw):
    base = dict(topology=preset("torus-4x4"), collective="allreduce", chunks=(ChunkPlan(1, (0, 1)),),
                algorithms=("ring", "ring"), layouts=("fused", "fused"))
    base.update(kw)
    return Plan(**base)


@pytest.mark.parametrize("kw,match", [
    (dict(collective="alltoall"), "cannot plan"),
    (dict(protocol="Fast"), "protocol"),
    (dict(chunks=()), "at least one chunk"),
    (dict(chunks=(ChunkPlan(0, (0, 1)),)), "units"),
    (dict(chunks=(ChunkPlan(1, (0, 0)),)), "order"),
    (dict(chunks=(ChunkPlan(1, (0, 1), direction=2),)), "direction"),
    (dict(algorithms=("direct", "ring")), "direct exchange needs a switch"),
    (dict(algorithms=("ring",)), "one algorithm"),
    (dict(layouts=("fused", "sideways")), "layout"),
    (dict(schedule=((0, 1), (0, 0), (0, 2))), "before stage"),
    (dict(schedule=((0, 0),)), "every"),
])
def test_check_plan_rejects_malformed_plans(kw, match):
    with pytest.raises(PlanError, match=match):
        check_plan(_plan(**kw))
