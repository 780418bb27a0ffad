"""The policies the planner compares: WFBP, PyTorch DDP's buckets, DeAR and PipeDAP."""

from hipipe_compiler.training import AlphaBetaCost
from hipipe_compiler.training.buckets import build_plan
from hipipe_compiler.training.iteration import simulate
from hipipe_compiler.training.policies import MIB, ddp_schedule, dear_schedule, pipedap_schedule, wfbp_schedule
from hipipe_compiler.training.profiles import builtin_profile

from training_helpers import make_profile, needs_shared_data


def test_wfbp_is_one_allreduce_per_layer_in_backward_order():
    profile = make_profile([(10, 1.0, 1.0)] * 5)
    plan = build_plan(profile, wfbp_schedule(profile), "wfbp")
    assert [b.layers for b in plan.buckets] == [(4,), (3,), (2,), (1,), (0,)]
    assert [op.kind for op in plan.ops] == ["AR"] * 5 and {op.lane for op in plan.ops} == {0}


def test_ddp_buckets_close_at_one_mib_then_25_mib():
    profile = make_profile([(100_000, 0.1, 0.1)] * 200)  # 400 kB layers, 80 MB in all
    buckets = build_plan(profile, ddp_schedule(profile)).buckets
    assert buckets[0].bytes == 1_200_000  # three layers reach 1 MiB
    assert [b.bytes for b in buckets[1:-1]] == [26_400_000] * 2  # 66 layers reach 25 MiB
    assert buckets[0].layers[-1] == 199 and sum(len(b.layers) for b in buckets) == 200


def test_dear_groups_forward_layers_below_25_mib():
    profile = make_profile([(3_000_000, 0.1, 0.1)] * 10)  # 12 MB layers
    plan = build_plan(profile, dear_schedule(profile), "dear")
    assert [b.layers for b in plan.buckets] == [(8, 9), (6, 7), (4, 5), (2, 3), (0, 1)]
    assert all(b.bytes < 25 * MIB for b in plan.buckets)
    assert [op.phase for op in plan.ops if op.kind == "AG"] == ["forward"] * 5


def test_pipedap_moves_gathers_into_backward_but_never_the_first_layers():
    needs_shared_data()
    profile = builtin_profile("resnet50")
    testbed = AlphaBetaCost.ring(8, 1.25, 60.0)  # 10GbE-like: slow links, comm exceeds the gaps
    schedule = pipedap_schedule(profile, testbed, 8)
    moved = sum(d >= 0 for d in schedule.ag_delay)
    assert schedule.ag_delay[-1] == -1  # AG(0), of the input layer, stays in the forward phase
    assert 0 < moved < profile.nlayers
    assert set(schedule.ag_delay) <= {-1, 0, 1}
    plan = build_plan(profile, schedule, "pipedap", 8)
    sim = simulate(plan, profile, testbed)
    assert all(e.end_ms >= e.start_ms for e in sim.timeline)
