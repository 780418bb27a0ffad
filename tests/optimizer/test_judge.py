"""The search's judge (optimizer/judge.py): plans of one shape share one simulation, which is
exact only if they really run in the same time, and the budget still counts each lowering."""

from dataclasses import replace

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hipipe_compiler.errors import PlanError
from hipipe_compiler.lower import lower, lowering_key
from hipipe_compiler.optimizer import Knobs, Search, build_plan
from hipipe_compiler.optimizer.judge import program_key
from hipipe_compiler.presets import preset
from hipipe_compiler.schedule.plan import plan_shape
from hipipe_compiler.sim import simulate_exact

from conftest import examples, topologies

BASES = (Knobs(4, fan=True), Knobs(4, mix=True, ag_lane=True, fan=True), Knobs(8, mix=True, ag_lane=True, lanes=2),
         Knobs(6, mix=True, lanes=3, arrange="lanes", protocol="LL"))
CHANGES = ({"spread": 2}, {"spread": 3}, {"ag_lane": True}, {"ag_lane": False}, {"ramp": 1}, {"tilt": 1},
           {"arrange": "lanes"}, {"lanes": 2})


@settings(max_examples=examples(25), deadline=None)
@given(topologies(max_dims=3, max_ranks=32, max_size=8), st.sampled_from(BASES), st.sampled_from(CHANGES),
       st.sampled_from((64 << 10, 1 << 20)))
def test_plans_of_one_shape_share_one_simulation_and_run_in_the_same_time(topo, base, change, size):
    """Knobs that only relabel lanes build plans of one shape: the judge simulates the first
    and hands its time to the second (counted against the budget as before, so the search's
    picks do not change), and every rank's full simulation agrees."""
    try:
        first = build_plan(topo, "allreduce", size, size, base)
        second = build_plan(topo, "allreduce", size, size, replace(base, **change))
    except PlanError:
        assume(False)
    assume(plan_shape(first) == plan_shape(second) and lowering_key(first) != lowering_key(second))
    assert program_key(first) == program_key(second)
    search = Search(topo, "allreduce")
    one = search.judge(first, (size,), base)
    assume(one is not None)
    two = search.judge(second, (size,), replace(base, **change))
    assert len(search.times) == 1 and search.simulations == 1 and search.evaluations == 2
    assert two is not None and two.times_us == one.times_us
    exact = [simulate_exact(lower(p), topo, size).time_us for p in (first, second)]
    assert abs(exact[0] - exact[1]) <= 1e-9 * exact[0]


def test_plans_of_different_shapes_are_simulated_apart():
    """The shared key never merges plans of different shapes (two chunk counts here), and
    judging one plan again costs nothing."""
    topo = preset("torus-4x4")
    search = Search(topo, "allreduce")
    for chunks in (2, 4, 2):
        search.judge(build_plan(topo, "allreduce", 1 << 20, 1 << 20, Knobs(chunks, fan=True)), (1 << 20,), Knobs(chunks))
    assert search.evaluations == 2 and len(search.times) == 2
