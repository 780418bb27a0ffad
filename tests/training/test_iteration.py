"""The iteration simulator, on cases checked by hand: lanes, prefetch, the step barrier."""

from dataclasses import replace

import pytest

from hipipe_compiler.errors import PlanError
from hipipe_compiler.training.buckets import Schedule, TrainingPlan, build_plan, uniform_schedule
from hipipe_compiler.training.iteration import simulate

from training_helpers import make_profile, one_ms_cost


def two_layer_plan(profile, ag_lane: int = 1) -> TrainingPlan:
    # bucket 0 = l1 (ready at 1 ms), bucket 1 = l0 (ready at 2 ms); both all-gathers right after their own RS
    return build_plan(profile, Schedule((0, 1), ("rs+ag", "rs+ag"), (0, 0), ag_lane=ag_lane, barrier=False), "custom")


def test_two_lanes_share_bandwidth_and_overlap_latency():
    profile = make_profile([(250_000, 1.0, 1.0), (250_000, 1.0, 1.0)])  # 1 MB buckets
    sim = simulate(two_layer_plan(profile), profile, one_ms_cost(0.5))
    span = {(e.kind, e.bucket): (e.start_ms, e.end_ms) for e in sim.timeline if e.seq is not None}
    assert span[("RS", 0)] == pytest.approx((1.0, 2.0))
    # AG(0) and RS(1) both start at 2: latencies overlap (to 2.5), then 0.5 ms of work each at half rate
    assert span[("AG", 0)] == pytest.approx((2.0, 3.5))
    assert span[("RS", 1)] == pytest.approx((2.0, 3.5))
    assert span[("AG", 1)] == pytest.approx((3.5, 4.5))
    assert sim.iteration_ms == pytest.approx(4.5 + 2.0)
    assert sim.link_busy_ms == pytest.approx(0.5 + 1.0 + 0.5)
    # one lane: the same ops strictly one after another
    serial = simulate(two_layer_plan(profile, ag_lane=0), profile, one_ms_cost(0.5))
    assert serial.iteration_ms == pytest.approx(5.0 + 2.0)
    # pure bandwidth (no latency): sharing gains nothing over one lane
    assert simulate(two_layer_plan(profile), profile, one_ms_cost(0.0)).iteration_ms == pytest.approx(7.0)


def test_dear_prefetches_one_bucket_ahead_after_the_step():
    profile = make_profile([(250_000, 1.0, 1.0)] * 3)
    plan = build_plan(profile, uniform_schedule((0, 1, 2), "rs+ag", -1, barrier=True, prefetch=1), "dear")
    sim = simulate(plan, profile, one_ms_cost(0.0))
    ag = {op.bucket: op for op in plan.ops if op.kind == "AG"}
    # forward order: bucket 2 (l0) first, issued after the last RS; then bucket 1 when l0's forward starts
    assert [op.bucket for op in plan.ops] == [0, 1, 2, 2, 1, 0]
    assert ag[2].forward_start is None and ag[1].forward_start == 0 and ag[0].forward_start == 1
    # RS at 1-2, 2-3, 3-4; AG(l0) 4-5, forward l0 5-6; AG(l1) issued at 5: 5-6; l1 6-7; AG(l2) 6-7; l2 7-8
    assert sim.iteration_ms == pytest.approx(8.0)
    eager = simulate(build_plan(profile, replace(plan.schedule, prefetch=0)), profile, one_ms_cost(0.0))
    assert eager.iteration_ms == pytest.approx(8.0)  # forward is as slow as the gathers here


def test_barrier_holds_deferred_gathers_until_every_reduce_is_done():
    profile = make_profile([(250_000, 1.0, 1.0), (250_000, 1.0, 1.0)])
    mixed = Schedule((0, 1), ("rs+ag", "allreduce"), (-1, -1), barrier=True, prefetch=0)  # l1 RS+AG, l0 AR
    cost = one_ms_cost(0.0)
    # RS(l1) 1-2, AR(l0) 2-3; with the step barrier AG(l1) runs 3-4: l0 3-4, l1 4-5
    assert simulate(build_plan(profile, mixed), profile, cost).iteration_ms == pytest.approx(5.0)
    # without it AG(l1) starts at 2 and shares the network with AR(l0): both end at 4
    assert simulate(build_plan(profile, replace(mixed, barrier=False)), profile, cost).iteration_ms == pytest.approx(6.0)
    plan = build_plan(profile, mixed)
    assert plan.ops[-1].after == (0, 1) and plan.forward_waits[0] == (1,)


def test_a_plan_that_waits_on_itself_is_reported():
    profile = make_profile([(100, 1.0, 1.0)])
    plan = build_plan(profile, uniform_schedule((0,), "rs+ag", -1))
    ops = (plan.ops[0], replace(plan.ops[1], forward_start=0))
    with pytest.raises(PlanError, match="deadlocks"):
        simulate(replace(plan, ops=ops), profile, one_ms_cost(0.5))
