"""Training planner: policies, the iteration simulator, plan documents, and the promise that
hipipe is never worse than any other policy."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hipipe_compiler.training as training
from hipipe_compiler.buckets import Op, Schedule, TrainingPlan, build_plan, uniform_schedule
from hipipe_compiler.commcost import COLLECTIVES, AlphaBetaCost, SimulatedCost
from hipipe_compiler.compiler import window_of
from hipipe_compiler.documents import validate_document
from hipipe_compiler.errors import InputError, PlanError
from hipipe_compiler.iteration import iteration_lower_bound_ms, simulate
from hipipe_compiler.policies import MIB, dear_schedule, ddp_schedule, pipedap_schedule, wfbp_schedule
from hipipe_compiler.profiles import BUILTIN_PROFILES, LayerProfile, builtin_profile, profile_from_document, shared_data_path
from hipipe_compiler.topology import preset
from hipipe_compiler.training import POLICIES, PolicyResult, plan_document, plan_training, programs_needed

EPS = 1e-6  # ms

#: 8 GPUs per node on NVSwitch (300 GB/s, 1 µs) x 4 nodes over IB (50 GB/s, 5 µs), like dgx-h100-8x4.
NVSWITCH_IB_8X4 = (AlphaBetaCost.hierarchical([(8, 300.0, 1.0), (4, 50.0, 5.0)], launch_us=10.0), 32, 32 * 8)
#: A 4x4 torus, 100 GB/s and 0.5 µs per dimension, like torus-4x4.
TORUS_4X4 = (AlphaBetaCost.hierarchical([(4, 100.0, 0.5), (4, 100.0, 0.5)], launch_us=10.0), 16, 16 * 4)
COST_MODELS = {"nvswitch-ib-8x4": NVSWITCH_IB_8X4, "torus-4x4": TORUS_4X4}


def make_profile(layers, dtype_bytes: int = 4, name: str = "p") -> LayerProfile:
    """layers: (params, fwd_ms, bwd_ms) or (params, fwd_ms, bwd_ms, ready_after)."""
    doc = {"model": name, "dtype_bytes": dtype_bytes, "layers": []}
    for i, spec in enumerate(layers):
        layer = {"name": f"l{i}", "params": spec[0], "fwd_ms": spec[1], "bwd_ms": spec[2]}
        if len(spec) > 3 and spec[3] is not None:
            layer["ready_after"] = f"l{spec[3]}"
        doc["layers"].append(layer)
    return profile_from_document(doc, f"{name}.yaml")


def zero_cost() -> AlphaBetaCost:
    return AlphaBetaCost({c: 0.0 for c in COLLECTIVES}, {c: 0.0 for c in COLLECTIVES})


# -- invariants every plan must satisfy ---------------------------------------------------


def check_plan(result: PolicyResult, profile: LayerProfile, cost, pad: int) -> None:
    """Coverage, op structure, dependencies, lanes and the timing bounds of one policy."""
    plan, sim = result.plan, result.simulation
    L = profile.nlayers
    # every parameter exactly once
    covered = sorted(i for b in plan.buckets for i in b.layers)
    assert covered == list(range(L))
    assert sum(b.params for b in plan.buckets) == profile.params
    for b in plan.buckets:
        assert list(b.layers) == list(range(b.layers[0], b.layers[-1] + 1))
        assert b.bytes == b.params * profile.dtype_bytes
        assert b.padded_bytes >= b.bytes and (b.padded_bytes // profile.dtype_bytes) % pad == 0
        if isinstance(cost, AlphaBetaCost):  # no program to pad for: the least multiple of pad elements
            assert b.padded_bytes - b.bytes < pad * profile.dtype_bytes
    # every op of a bucket is called with the bucket's size, which each op's program accepts:
    # reduce-scatter and all-gather cut the bucket into the same shards
    for op in plan.ops:
        assert result.call_bytes[op.seq] == plan.buckets[op.bucket].padded_bytes
        assert cost.call_bytes(op.collective, result.call_bytes[op.seq]) == result.call_bytes[op.seq]
    first_wait: dict[int, int] = {}
    for j, waits in enumerate(plan.forward_waits):
        for seq in waits:
            first_wait.setdefault(seq, j)
    # one AR, or one RS then one AG, per bucket; seq is the issue order
    assert [op.seq for op in plan.ops] == list(range(len(plan.ops)))
    kinds: dict[int, list[Op]] = {}
    for op in plan.ops:
        kinds.setdefault(op.bucket, []).append(op)
        assert all(dep < op.seq for dep in op.after)
    done = {e.seq: e for e in sim.timeline if e.seq is not None}
    fwd_start = {e.layer: e.start_ms for e in sim.timeline if e.kind == "forward"}
    ready = profile.grad_ready_ms
    for b, prim in zip(plan.buckets, plan.primitives):
        ops = kinds[b.id]
        bucket_ready = max(ready[i] for i in b.layers)
        if prim == "allreduce":
            assert [op.kind for op in ops] == ["AR"]
            final = ops[0]
        else:
            assert [op.kind for op in ops] == ["RS", "AG"]
            rs, final = ops
            assert rs.seq in final.after
            assert done[final.seq].start_ms >= done[rs.seq].end_ms - EPS
        assert ops[0].grad_ready and done[ops[0].seq].start_ms >= bucket_ready - EPS
        # every forward layer waits, directly or through an earlier layer, for its own parameters
        for layer in b.layers:
            assert first_wait[final.seq] <= layer
            assert fwd_start[layer] >= done[final.seq].end_ms - EPS
    # each lane runs FIFO in issue order
    for lane in {op.lane for op in plan.ops}:
        events = [done[op.seq] for op in plan.ops if op.lane == lane]
        for first, second in zip(events, events[1:]):
            assert second.start_ms >= first.end_ms - EPS
    # forward is sequential and starts after backward
    starts = [fwd_start[i] for i in range(L)]
    assert starts[0] >= profile.bwd_ms - EPS
    for i in range(1, L):
        assert starts[i] >= starts[i - 1] + profile.layers[i - 1].fwd_ms - EPS
    # timing bounds
    assert sim.iteration_ms >= profile.compute_ms - EPS
    assert sim.iteration_ms >= iteration_lower_bound_ms(profile, cost) - EPS
    assert sim.iteration_ms >= sim.link_busy_ms - EPS
    assert sim.exposed_comm_ms == pytest.approx(sim.iteration_ms - profile.compute_ms)
    assert all(e.end_ms >= e.start_ms for e in sim.timeline)
    # programs cover every call, each in the compiler's size window of its size
    sizes = {(n.collective, s) for n in result.programs for s in n.sizes}
    assert sizes == {(op.collective, result.call_bytes[op.seq]) for op in plan.ops}
    assert all(result.call_bytes[op.seq] >= plan.buckets[op.bucket].padded_bytes for op in plan.ops)
    for need in result.programs:
        assert all(window_of(s) == window_of(need.min_bytes) == window_of(need.max_bytes) for s in need.sizes)


def check_report(report, cost) -> None:
    for result in report.results:
        check_plan(result, report.profile, cost, report.pad_multiple)
    ours = report["hipipe"].iteration_ms
    for result in report.results:
        assert ours <= result.iteration_ms + EPS, f"hipipe {ours} > {result.policy} {result.iteration_ms}"


# -- random profiles and costs ------------------------------------------------------------

params = st.one_of(st.integers(1, 2000), st.integers(1, 4_000_000), st.integers(1_000_000, 30_000_000))
times = st.one_of(st.just(0.0), st.floats(0.0, 5.0, allow_nan=False))


@st.composite
def profiles(draw, max_layers: int = 18) -> LayerProfile:
    n = draw(st.integers(1, max_layers))
    specs = [[draw(params), draw(times), draw(times), None] for _ in range(n)]
    if n > 1 and draw(st.booleans()):
        specs[draw(st.integers(1, n - 1))][3] = draw(st.integers(0, n - 1))  # a tied weight
    return make_profile(specs, dtype_bytes=draw(st.sampled_from([2, 4])))


@st.composite
def costs(draw):
    """(cost, world size): ring or hierarchical α-β, or independent α and β per collective."""
    world = draw(st.sampled_from([2, 4, 8, 16, 32]))
    latency, launch = draw(st.floats(0.0, 200.0)), draw(st.floats(0.0, 100.0))
    gbps = draw(st.floats(0.5, 400.0))
    kind = draw(st.sampled_from(["ring", "two-level", "free-form"]))
    if kind == "ring":
        return AlphaBetaCost.ring(world, gbps, latency, launch), world
    if kind == "two-level":
        return AlphaBetaCost.hierarchical([(world, gbps * 6, latency / 5), (2, gbps, latency)], launch), world * 2
    alpha = {c: draw(st.floats(0.0, 2000.0)) for c in COLLECTIVES}
    beta = {c: draw(st.floats(0.0, 1e-3)) for c in COLLECTIVES}
    return AlphaBetaCost(alpha, beta), world


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(profiles(), costs(), st.sampled_from([1, 4, 8]))
def test_every_policy_keeps_every_invariant(profile, cost_world, chunks):
    """Random profiles (tied weights included) and α-β costs: `check_plan` for every policy.

    Its timing bound is `iteration_lower_bound_ms`: T >= max(T_b + F, max over layers l of
    max(T_b + F_<l, r_l + c_l) + F_>=l, min_l r_l + W + f_last), where r_l is layer l's
    gradient-ready time, c_l the cheaper of AR or RS-then-AG on its bytes alone, W the
    cheapest bandwidth work of all layers and f_last the last layer's forward time.
    """
    cost, world = cost_world
    report = plan_training(profile, cost, world, pad_multiple=world * chunks, search_evals=120)
    assert report.policies == POLICIES
    check_report(report, cost)
    for policy in POLICIES:
        doc = plan_document(report, policy)
        assert doc["predicted"]["iteration_ms"] == report[policy].iteration_ms


@settings(max_examples=25, deadline=None)
@given(profiles())
def test_free_communication_costs_nothing(profile):
    report = plan_training(profile, zero_cost(), 8, search_evals=40)
    for result in report.results:
        assert result.iteration_ms == pytest.approx(profile.compute_ms, abs=1e-9), result.policy
        assert result.exposed_comm_ms == pytest.approx(0.0, abs=1e-9)


@settings(max_examples=25, deadline=None)
@given(profiles(max_layers=10), costs())
def test_simulation_is_deterministic_and_order_matters_only_through_the_plan(profile, cost_world):
    cost, world = cost_world
    first = plan_training(profile, cost, world, search_evals=60)
    second = plan_training(profile, cost, world, search_evals=60)
    for a, b in zip(first.results, second.results):
        assert a.plan == b.plan and a.simulation == b.simulation


# -- hand-checked simulator cases ---------------------------------------------------------


def one_ms_cost(latency_ms: float) -> AlphaBetaCost:
    """Every collective on 1 MB takes 1 ms, `latency_ms` of it startup."""
    return AlphaBetaCost({c: latency_ms * 1000 for c in COLLECTIVES},
                         {c: (1 - latency_ms) * 1000 / 1e6 for c in COLLECTIVES})


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


# -- policies -----------------------------------------------------------------------------


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


def test_program_needs_follow_the_compiler_size_windows():
    profile = make_profile([(1000, 1.0, 1.0), (1013, 1.0, 1.0), (300_000, 1.0, 1.0)])
    needs = programs_needed(build_plan(profile, uniform_schedule((0, 1, 2), "rs+ag", 0), pad_multiple=8), one_ms_cost(0.5))
    # 1013 elements pad to 1016 (4064 bytes): same octave as 4000 bytes
    assert [(n.collective, n.sizes) for n in needs] == [("reducescatter", (4000, 4064)), ("reducescatter", (1_200_000,)),
                                                       ("allgather", (4000, 4064)), ("allgather", (1_200_000,))]
    assert [n.id for n in needs[:2]] == ["reducescatter-2KiB-4KiB", "reducescatter-1MiB-2MiB"]


def test_plan_training_rejects_bad_arguments():
    profile = make_profile([(10, 1.0, 1.0)])
    cost = one_ms_cost(0.5)
    assert pytest.raises(InputError, plan_training, profile, cost, 8, ["wfbp", "fifo"]).value.field == "policy"
    assert pytest.raises(InputError, plan_training, profile, cost, 0).value.field == "world_size"
    report = plan_training(profile, cost, 8, ["wfbp"])
    assert report.policies == ("wfbp",)
    assert pytest.raises(InputError, plan_document, report, "hipipe").value.field == "policy"


def test_plan_schema_rejects_broken_plans():
    profile = make_profile([(5_000_000, 1.0, 1.0), (5_000_000, 1.0, 1.0)])  # 20 MB each: two DeAR groups
    doc = plan_document(plan_training(profile, one_ms_cost(0.5), 4, search_evals=20), "dear")
    # AG(l1) is prefetched when l0's forward starts, after its own RS and (step barrier) the last RS
    assert [op["after"] for op in doc["ops"]] == [[{"grad_ready": 0}], [{"grad_ready": 1}], [{"op_done": 1}],
                                                  [{"forward_start": "l0"}, {"op_done": 0}, {"op_done": 1}]]
    assert doc["forward_waits"] == {"l0": [{"op_done": 1}, {"op_done": 2}], "l1": [{"op_done": 3}]}
    bad = json.loads(json.dumps(doc))
    bad["ops"][0]["op"] = "AR+"
    assert pytest.raises(InputError, validate_document, bad, "plan.schema.json", "plan.json").value.field == "ops[0].op"
    bad = json.loads(json.dumps(doc))
    bad["ops"][1]["after"] = [{"op_done": 0, "grad_ready": 1}]
    assert pytest.raises(InputError, validate_document, bad, "plan.schema.json", "plan.json").value.field.startswith("ops[1].after[0]")
    bad = json.loads(json.dumps(doc))
    del bad["predicted"]
    assert pytest.raises(InputError, validate_document, bad, "plan.schema.json", "plan.json").value.field == "predicted"


# -- the five built-in profiles on two networks -------------------------------------------


def needs_shared_data() -> None:
    if not shared_data_path().is_file():
        pytest.skip(f"built-in profiles need {shared_data_path()} (the shared data checkout), which is absent")


@pytest.fixture(scope="module")
def builtin_reports():
    needs_shared_data()
    return {(name, net): plan_training(builtin_profile(name), cost, world, pad_multiple=pad)
            for name in BUILTIN_PROFILES for net, (cost, world, pad) in COST_MODELS.items()}


@pytest.mark.parametrize("net", COST_MODELS)
@pytest.mark.parametrize("name", BUILTIN_PROFILES)
def test_builtin_profiles_hipipe_is_never_worse(builtin_reports, name, net):
    report = builtin_reports[(name, net)]
    check_report(report, COST_MODELS[net][0])
    for policy in POLICIES:
        doc = json.loads(json.dumps(plan_document(report, policy, topology=net)))
        validate_document(doc, "plan.schema.json", "plan.json")
        assert len(doc["buckets"]) == len(report[policy].plan.buckets)
        assert {op["program"] for op in doc["ops"]} <= {p["id"] for p in doc["programs"]}
    assert report["hipipe"].iteration_ms <= min(r.iteration_ms for r in report.results) + EPS


@pytest.fixture(scope="module")
def simulated_costs():
    # hierarchical programs keep the suite fast; `hipipe plan` compiles HiPIPE ones the same way
    return {name: SimulatedCost(preset(name), algorithm="hierarchical") for name in ("dgx-h100-8x4", "torus-4x4")}


@pytest.mark.parametrize("topo", ["dgx-h100-8x4", "torus-4x4"])
@pytest.mark.parametrize("name", BUILTIN_PROFILES)
def test_builtin_profiles_with_simulated_costs(simulated_costs, name, topo):
    """Costs from the simulator on our compiled programs: every invariant holds, hipipe is
    never worse, and each call is padded to a size its program's window serves."""
    needs_shared_data()
    cost = simulated_costs[topo]
    profile = builtin_profile(name)
    report = plan_training(profile, cost, cost.topology.nranks)
    check_report(report, cost)
    for result in report.results:
        for op, call in zip(result.plan.ops, result.call_bytes):
            program = cost.compiled(op.collective, call).program
            assert call % (program.nchunksperloop * profile.dtype_bytes) == 0
            assert program.min_bytes <= call <= program.max_bytes


def test_builtin_plans_are_deterministic(builtin_reports):
    cost, world, pad = TORUS_4X4
    again = plan_training(builtin_profile("bert_base"), cost, world, pad_multiple=pad)
    assert again.results == builtin_reports[("bert_base", "torus-4x4")].results
