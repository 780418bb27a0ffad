"""Training planner: policies, the iteration simulator, plan documents, and the promise that
hipipe is never worse than any other policy."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hipipe_compiler.documents import validate_document
from hipipe_compiler.errors import InputError
from hipipe_compiler.presets import preset
from hipipe_compiler.training import POLICIES, AlphaBetaCost, LayerProfile, SimulatedCost, plan_training
from hipipe_compiler.training.buckets import Op, build_plan, uniform_schedule
from hipipe_compiler.training.commcost import COLLECTIVES
from hipipe_compiler.training.iteration import iteration_lower_bound_ms
from hipipe_compiler.training.planner import PolicyResult, plan_document, programs_needed
from hipipe_compiler.training.profiles import BUILTIN_PROFILES, builtin_profile
from hipipe_compiler.windows import window_of

from conftest import examples
from training_helpers import make_profile, needs_shared_data, one_ms_cost, zero_cost

EPS = 1e-6  # ms

#: 8 GPUs per node on NVSwitch (300 GB/s, 1 µs) x 4 nodes over IB (50 GB/s, 5 µs), like dgx-h100-8x4.
NVSWITCH_IB_8X4 = (AlphaBetaCost.hierarchical([(8, 300.0, 1.0), (4, 50.0, 5.0)], launch_us=10.0), 32, 32 * 8)
#: A 4x4 torus, 100 GB/s and 0.5 µs per dimension, like torus-4x4.
TORUS_4X4 = (AlphaBetaCost.hierarchical([(4, 100.0, 0.5), (4, 100.0, 0.5)], launch_us=10.0), 16, 16 * 4)
COST_MODELS = {"nvswitch-ib-8x4": NVSWITCH_IB_8X4, "torus-4x4": TORUS_4X4}


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


SETTINGS = settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])


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


@settings(max_examples=examples(25), deadline=None)
@given(profiles())
def test_free_communication_costs_nothing(profile):
    report = plan_training(profile, zero_cost(), 8, search_evals=40)
    for result in report.results:
        assert result.iteration_ms == pytest.approx(profile.compute_ms, abs=1e-9), result.policy
        assert result.exposed_comm_ms == pytest.approx(0.0, abs=1e-9)


@settings(max_examples=examples(25), deadline=None)
@given(profiles(max_layers=10), costs())
def test_simulation_is_deterministic_and_order_matters_only_through_the_plan(profile, cost_world):
    cost, world = cost_world
    first = plan_training(profile, cost, world, search_evals=60)
    second = plan_training(profile, cost, world, search_evals=60)
    for a, b in zip(first.results, second.results):
        assert a.plan == b.plan and a.simulation == b.simulation


# -- hand-checked simulator cases ---------------------------------------------------------


# -- policies -----------------------------------------------------------------------------


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
