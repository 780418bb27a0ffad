"""Plans: stages, checks, the default emission order and the baseline builders."""

import pytest

from hipipe_compiler.errors import PlanError
from hipipe_compiler.schedule import ChunkPlan, Plan, check_plan
from hipipe_compiler.schedule.plan import chunk_stages, plan_shape
from hipipe_compiler.presets import preset


def test_stages_of_each_collective():
    assert [(s.kind, s.axis) for s in chunk_stages("allreduce", (0, 1, 2))] == [
        ("rs", 0), ("rs", 1), ("ar", 2), ("ag", 1), ("ag", 0)]
    assert [(s.kind, s.axis) for s in chunk_stages("reducescatter", (1, 0))] == [("rs", 1), ("rs", 0)]
    assert [(s.kind, s.axis) for s in chunk_stages("allgather", (1, 0))] == [("ag", 0), ("ag", 1)]
    assert [s.depth for s in chunk_stages("allgather", (1, 0))] == [1, 0]


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


def test_a_plans_shape_forgets_its_name_and_lane_numbers_only():
    topo = preset("torus-4x4")

    def plan(lanes, order=(0, 1), flat=False, name="a"):
        chunks = tuple(ChunkPlan(1, order if not flat else (0,), 1, lane) for lane in lanes)
        return Plan(topo, "allreduce", chunks, ("ring",) if flat else ("ring", "ring"),
                    ("fused",) if flat else ("fused", "fused"), flat=flat, name=name)
    assert plan_shape(plan((0, 1), name="a")) == plan_shape(plan((5, 3), name="b"))  # renumbered lanes
    assert plan_shape(plan((0, 1))) != plan_shape(plan((0, 0)))  # one lane is not two
    assert plan_shape(plan((0, 1))) != plan_shape(plan((0, 1), order=(1, 0)))
    assert plan_shape(plan((0, 1), flat=True)) != plan_shape(plan((5, 3), flat=True))  # a flat lane is a channel
