"""In-switch plans (mscclpp/nvls.py): every one verifies, every breakage of its multimem
operations or of the signals around them is rejected with its rule, and its time answers to
the limit with in-switch reduction."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hipipe_compiler.bounds import lower_bound
from hipipe_compiler.errors import PlanError
from hipipe_compiler.mscclpp.nvls import nvls_allreduce_plan, switch_domain
from hipipe_compiler.mscclpp.nvls_pipeline import Shape, describe, nvls_pipeline_plan, pipeline_shape, staggered
from hipipe_compiler.mscclpp.plan import Channel, ExecutionPlan, Op, Operand
from hipipe_compiler.mscclpp.verify import layouts_of, verify_plan
from hipipe_compiler.presets import preset
from hipipe_compiler.sim.plans import time_plan
from hipipe_compiler.sim.simulate import SimulationError
from hipipe_compiler.topology import Dimension, Topology

from conftest import nvls_nodes as nodes
from plan_mutations import _drop_first, _edit_ops, _first_op


def node(n: int = 8, efficiency: float = 0.85) -> Topology:
    return Topology((Dimension(n, "switch", 370.8, {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
                               nvls={"efficiency": efficiency, "call_latency": 5.0}),), call_latency=4.0)


def proof(plan: ExecutionPlan) -> set[str]:
    return verify_plan(plan, layouts_of(plan, aliased=True)).rules()


@given(st.integers(2, 17), st.integers(1, 4), st.booleans(), st.floats(0.5, 1.0))
def test_every_in_switch_plan_verifies_and_answers_to_the_limit(n, threadblocks, inplace, efficiency):
    topo = node(n, efficiency)
    plan = nvls_allreduce_plan(topo, "p", inplace, threadblocks)
    assert proof(plan) == set()
    nbytes = 16 * n * threadblocks * 4096
    result = time_plan(plan, topo, nbytes)
    assert result.time_us >= lower_bound(topo, "allreduce", nbytes).total_us * (1 - 1e-9)


@pytest.mark.parametrize("nbytes", [64 << 20, 256 << 20, 1 << 30])
def test_one_h100_node_reaches_the_limit_with_in_switch_reduction(nbytes):
    """The NVLS issue's target: U at least 0.90 against the new limit from 64 MiB up."""
    topo = preset("dgx-h100-8x1")
    result = time_plan(nvls_allreduce_plan(topo, "p", False, 16), topo, nbytes)
    assert lower_bound(topo, "allreduce", nbytes).in_switch
    assert result.utilisation >= 0.90


def test_only_one_nvls_domain_gets_an_in_switch_plan():
    assert switch_domain(preset("dgx-h100-8x1")) == 0
    assert switch_domain(preset("dgx-h100-8x4")) is None
    assert switch_domain(preset("torus-4x4")) is None
    with pytest.raises(PlanError, match="nvls"):
        nvls_allreduce_plan(preset("dgx-h100-8x2"), "p", False, 4)
    with pytest.raises(PlanError, match="memory channels"):
        nvls_allreduce_plan(node(18), "p", False, 4)


def test_a_switch_group_the_topology_cannot_reduce_is_refused_when_timed():
    plan = nvls_allreduce_plan(node(8), "p", False, 2)
    with pytest.raises(SimulationError, match="not the group of a dimension"):
        time_plan(plan, Topology((Dimension(8, "switch", 370.8, 1.0),)), 1 << 20)


def _with_gpu0_channels(plan: ExecutionPlan, channels: tuple[Channel, ...]) -> ExecutionPlan:
    g = plan.gpus[0]
    return replace(plan, gpus=(replace(g, channels=channels), *plan.gpus[1:]))


def _member_missing(plan: ExecutionPlan) -> ExecutionPlan:
    channels = tuple(replace(c, rank_groups=(c.rank_groups[0][:-1],)) if c.channel_type == "switch" else c
                     for c in plan.gpus[0].channels)
    return _with_gpu0_channels(plan, channels)


def _groups_reordered(plan: ExecutionPlan) -> ExecutionPlan:
    channels = plan.gpus[0].channels
    memory = tuple(c for c in channels if c.channel_type != "switch")
    switch = tuple(c for c in channels if c.channel_type == "switch")
    return _with_gpu0_channels(plan, memory + tuple(reversed(switch)))


def _every_op(change) -> callable:
    def mutate(plan: ExecutionPlan) -> ExecutionPlan:
        gpus = tuple(replace(g, threadblocks=tuple(replace(tb, ops=tuple(change(op) for op in tb.ops))
                                                   for tb in g.threadblocks)) for g in plan.gpus)
        return replace(plan, gpus=gpus)
    return mutate


def _shift(side: str):
    def change(_plan, _rank, op: Op) -> Op:
        moved = tuple(replace(o, index=o.index + 1) for o in getattr(op, side))
        return replace(op, **{side: moved})
    return _first_op(lambda op: op.name == "glres", change)


def _drop_opening(plan: ExecutionPlan) -> ExecutionPlan | None:
    def edit(_r: int, _t: int, ops: list[Op]) -> bool:
        first = next(i for i, op in enumerate(ops) if op.name == "nop")
        del ops[:first]
        return True
    return _edit_ops(plan, edit)


#: name -> (mutation, rules of which at least one must be reported)
MUTATIONS = {
    "the source region shifted": (_shift("src"), {"semantics", "race", "operand-bounds"}),
    "the destination region shifted": (_shift("dst"), {"semantics", "race", "operand-bounds"}),
    "the opening handshake dropped": (_drop_opening, {"unsynchronised-peer", "deadlock"}),
    "the closing wait dropped": (_drop_first(lambda ops, i: ops[i].name == "wait" and i == len(ops) - 1),
                                 {"unfinished-access", "unfinished-write", "signal-balance"}),
    "the nop after the opening wait dropped": (
        _drop_first(lambda ops, i: ops[i].name == "nop" and i + 1 < len(ops) and ops[i + 1].name == "glres"),
        {"unsynchronised-peer", "unpublished-read"}),
    "the nop before the closing signal dropped": (
        _drop_first(lambda ops, i: ops[i].name == "nop" and i > 0 and ops[i - 1].name == "glres"),
        {"unfinished-access", "unfinished-write", "unpublished-read"}),
    "relaxed signals publish nothing": (
        _every_op(lambda op: replace(op, name="rlx" + op.name) if op.name in ("signal", "wait") else op),
        {"unsynchronised-peer"}),
    "a store without the reduce it depends on": (
        _first_op(lambda op: op.name == "glres",
                  lambda _plan, _rank, op: replace(op, name="gstore", src=(Operand("i", op.src[0].index, 1),))),
        {"semantics"}),
    "packet multicast, which is not modelled": (
        _first_op(lambda op: op.name == "glres", lambda _plan, _rank, op: replace(op, name="gstorepkt")),
        {"unsupported"}),
    "a multimem operation on a memory channel": (
        _first_op(lambda op: op.name == "glres", lambda _plan, _rank, op: replace(op, channel_type="memory")),
        {"operand"}),
    "a member missing from a group": (_member_missing, {"switch-group"}),
    "groups declared in another order": (_groups_reordered, {"switch-group", "semantics", "race"}),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
@pytest.mark.parametrize("inplace", [False, True])
def test_every_mutation_of_an_in_switch_plan_is_rejected(name, inplace):
    mutate, rules = MUTATIONS[name]
    if name == "groups declared in another order" and inplace:
        pytest.skip("an in-place plan declares one switch channel")
    plan = nvls_allreduce_plan(node(4), "p", inplace, 2)
    broken = mutate(plan)
    assert broken is not None and broken != plan
    found = proof(broken)
    assert found & rules, f"{name}: {sorted(found)}, expected one of {sorted(rules)}"


# -- pipelines across nodes ---------------------------------------------------------------------

@given(st.integers(2, 8), st.integers(2, 5), st.sampled_from([1, 2, 3, 7, 20, 40]), st.booleans(),
       st.sampled_from([1, 2, 3, 8]), st.booleans())
def test_every_in_switch_pipeline_verifies_and_answers_to_the_limit(n, k, chunks, inplace, lanes, stagger):
    topo = nodes(n, k)
    lanes = min(lanes, chunks // 2) or 1
    units = staggered(chunks, lanes) if stagger else ()
    plan = nvls_pipeline_plan(topo, "p", inplace, chunks, lanes, units)
    assert describe(plan) == (units or (1,) * chunks, lanes)
    assert proof(plan) == set()
    assert plan.max_ops <= 64
    nbytes = 16 * plan.gpus[0].input_chunks * 64
    assert time_plan(plan, topo, nbytes).time_us >= lower_bound(topo, "allreduce", nbytes).total_us * (1 - 1e-9)


def test_a_pipeline_needs_nvls_nodes_on_one_switch_network():
    for name in ("dgx-h100-8x1", "torus-4x4", "dgx-a100-8x2"):
        with pytest.raises(PlanError, match="in-switch pipelines"):
            pipeline_shape(preset(name), 4)
    assert pipeline_shape(preset("dgx-h100-8x4"), 4) == Shape(8, 4, 4)


def test_staggered_chunks_start_each_lane_a_fraction_of_a_chunk_later():
    assert staggered(8, 2) == (2, 1, 2, 2, 2, 2, 2, 3)
    assert staggered(8, 4) == (4, 1, 2, 3, 4, 7, 6, 5)
    assert staggered(5, 1) == (1,) * 5
    with pytest.raises(PlanError, match="at least 6"):
        staggered(5, 3)
    with pytest.raises(PlanError, match="lanes"):
        nvls_pipeline_plan(nodes(4, 2), "p", False, 2, 3)


def test_two_staggered_lanes_hide_the_switch_operations_latencies():
    """Four nodes of H100 at 256 MiB: two lanes whose chunks are staggered by half a chunk beat
    one lane at every chunk count the compiler tries."""
    topo = preset("dgx-h100-8x4")
    one_lane = min(time_plan(nvls_pipeline_plan(topo, "p", False, c), topo, 256 << 20).time_us for c in (16, 32, 64))
    two = time_plan(nvls_pipeline_plan(topo, "p", False, 64, 2, staggered(64, 2)), topo, 256 << 20).time_us
    assert two < 0.95 * one_lane


def test_eight_lanes_hide_more_latency_than_four_where_the_chunks_are_small():
    """Four nodes of H100 at 64 MiB, where a chunk's bytes take little longer than its
    latencies: eight staggered lanes of 128 chunks beat four lanes at every chunk count."""
    topo = preset("dgx-h100-8x4")
    four = min(time_plan(nvls_pipeline_plan(topo, "p", False, c, 4, staggered(c, 4)), topo, 64 << 20).time_us
               for c in (32, 64, 128))
    eight = time_plan(nvls_pipeline_plan(topo, "p", False, 128, 8, staggered(128, 8)), topo, 64 << 20).time_us
    assert eight < 0.97 * four


def test_more_chunks_overlap_the_switch_and_the_network():
    """The stages run at once: four nodes of H100 at 256 MiB take less time with 16 chunks than
    with 2, and less than the switch stages and the network stage would one after the other."""
    topo = preset("dgx-h100-8x4")
    few, many = (time_plan(nvls_pipeline_plan(topo, "p", False, c), topo, 256 << 20).time_us for c in (2, 16))
    assert many < 0.8 * few
    network = 2 * 3 / 4 * (256 << 20) / 8 / (topo.dimensions[1].bandwidth * 1e3)
    dim = topo.dimensions[0]
    switch = 1.25 * (256 << 20) / (dim.nvls.efficiency * dim.bandwidth * 1e3)
    assert many < 0.8 * (network + switch)


def _drop_in_stage(stage_op: str, name: str):
    """Drop the first `name` of the first threadblock that runs `stage_op`."""
    def mutate(plan: ExecutionPlan) -> ExecutionPlan | None:
        def edit(_r: int, _t: int, ops: list[Op]) -> bool:
            if not any(op.name == stage_op for op in ops):
                return False
            i = next(i for i, op in enumerate(ops) if op.name == name)
            del ops[i]
            return True
        return _edit_ops(plan, edit)
    return mutate


PIPELINE_MUTATIONS = {
    "a store before the reduce it depends on": (_drop_in_stage("gstore", "sem_acquire"),
                                                {"unpublished-read", "semantics", "deadlock", "semaphore-balance"}),
    "the network reads before the switch reduced": (_drop_in_stage("re", "sem_acquire"),
                                                    {"unpublished-read", "semantics", "semaphore-balance"}),
    "a network wait dropped": (_drop_in_stage("re", "wait"), {"unpublished-read", "signal-balance", "semantics"}),
    "the switch stage's release dropped": (_drop_in_stage("glres", "sem_release"), {"deadlock"}),
    "a multicast region shifted": (_first_op(lambda op: op.name == "gstore", lambda _p, _r, op: replace(
        op, dst=(replace(op.dst[0], index=op.dst[0].index + 1),))), {"semantics", "race", "operand-bounds"}),
    "a reduce into the node's group instead of the GPU alone": (
        _first_op(lambda op: op.name == "glres", lambda _p, _r, op: replace(
            op, dst=(replace(op.dst[0], switch_channel_id=0),))),
        {"semantics", "race", "unpublished-read", "operand-bounds"}),
    "the second exchange's put dropped": (_drop_in_stage("re", "pws"), {"deadlock", "signal-balance", "semantics"}),
}


@pytest.mark.parametrize("lanes", [1, 2])
@pytest.mark.parametrize("name", sorted(PIPELINE_MUTATIONS))
def test_every_mutation_of_a_pipeline_is_rejected(name, lanes):
    mutate, rules = PIPELINE_MUTATIONS[name]
    plan = (nvls_pipeline_plan(nodes(4, 3), "p", False, 3) if lanes == 1 else
            nvls_pipeline_plan(nodes(4, 3), "p", False, 4, 2, staggered(4, 2)))
    broken = mutate(plan)
    assert broken is not None and broken != plan
    found = proof(broken)
    assert found & rules, f"{name}: {sorted(found)}, expected one of {sorted(rules)}"


def test_no_network_latency_follows_the_last_multicast():
    """The network threadblocks close with no handshake (the collective's dependencies order
    the launches, and the plans verify): once the last multicast has landed, a call waits only
    for the node's closing handshake, not for a signal across the network."""
    topo = preset("dgx-h100-8x4")
    result = time_plan(nvls_pipeline_plan(topo, "p", False, 32), topo, 64 << 20, record=True)
    last_store = max(i.end_us for i in result.intervals if i.dim == 0 and i.reduce is False)
    assert result.time_us - last_store < topo.dimensions[1].latency.Simple


def test_the_sharing_rule_costs_a_pipeline_more_than_its_nvlink_bytes():
    """docs/mscclpp.md: with a network that never limits, a pipeline on four H100 nodes still
    takes longer than its 1.25 M per NVLink port need at the in-switch rate."""
    topo = preset("dgx-h100-8x4")
    fast = replace(topo, dimensions=(topo.dimensions[0], replace(topo.dimensions[1], bandwidth=5000)))
    dim = topo.dimensions[0]
    need = 1.25 * (1 << 30) / (dim.nvls.efficiency * dim.bandwidth * 1e3)
    assert time_plan(nvls_pipeline_plan(fast, "p", False, 32), fast, 1 << 30).time_us > 1.05 * need


def test_a_window_is_split_where_the_switch_starts_to_pay(monkeypatch):
    """The directory's windows stay contiguous, and every in-switch plan is about as fast as the
    plan the directory would serve without in-switch plans at both ends of what it serves, or
    faster. Windows are tried from the top down, until one where in-switch plans serve nothing.
    The NCCL hand-off finds both ends of every in-switch window simulated already, at the same
    times."""
    from hipipe_compiler import plan_compiler
    from hipipe_compiler.compiler import CompileOptions
    from hipipe_compiler.plan_compiler import compile_plans, size_multiple

    tried = []
    real = plan_compiler._in_switch

    def spy(topology, options, translated, lo, hi, watch, seen, max_scratch):
        tried.append((lo, hi, real(topology, options, translated, lo, hi, watch, seen, max_scratch)))
        return tried[-1][2]
    monkeypatch.setattr(plan_compiler, "_in_switch", spy)
    topo = preset("dgx-h100-8x1")
    lo, hi = 1 << 20, 1 << 30
    ours = compile_plans(topo, CompileOptions(), lo, hi)
    gpu = compile_plans(topo, CompileOptions(), lo, hi, in_switch=False)
    assert [t[1] for t in tried] == sorted((t[1] for t in tried), reverse=True) and tried[0][1] == hi
    assert all(any(build for _s, build, _k in got) for _lo, _hi, got in tried[:-1])
    assert tried[-1][0] == lo or not any(build for _s, build, _k in tried[-1][2])
    assert len(tried) < len(gpu)
    spans = [(cp.plans[0].min_message_size, cp.plans[0].max_message_size) for cp in ours]
    assert spans[0][0] == lo and spans[-1][1] == hi
    assert all(a[1] + 1 == b[0] for a, b in zip(spans, spans[1:]))
    switched = [cp for cp in ours if cp.details.get("choice", "").startswith("in-switch")]
    assert switched and len(ours) > len(gpu)
    for cp in switched:
        plan = cp.plans[0]
        for size in (plan.min_message_size + -plan.min_message_size % size_multiple(plan),
                     plan.max_message_size - plan.max_message_size % size_multiple(plan)):
            other = next(g.plans[0] for g in gpu if g.plans[0].min_message_size <= size <= g.plans[0].max_message_size)
            assert size % size_multiple(other) == 0
            assert time_plan(plan, topo, size).time_us < 1.01 * time_plan(other, topo, size).time_us
    # the NCCL hand-off times each window at both ends with what the search simulated already
    sims = []
    monkeypatch.setattr(plan_compiler, "time_plan", lambda *a: sims.append(a) or time_plan(*a))
    ours_at = plan_compiler.plan_timer(ours, topo)
    for cp in switched:
        for end in (cp.window.window.min_bytes, cp.window.window.max_bytes):
            at = plan_compiler.timed_size(cp.plans[0], end)
            assert ours_at(cp.window, end) == time_plan(cp.plans[0], topo, at).time_us
    assert not sims


def test_in_switch_plans_take_no_less_time_per_byte_as_the_message_grows_so_pruning_is_exact():
    """crossover.py skips a plan at a size where its time at a larger size, scaled down, cannot
    win: on the pipelines of two and four nodes, that finds the fastest plan at every size."""
    from hipipe_compiler.crossover import Timings

    for name in ("dgx-h100-8x2", "dgx-h100-8x4"):
        topo = preset(name)
        plans = [nvls_pipeline_plan(topo, "p", False, c, lanes, staggered(c, lanes) if lanes > 1 else ())
                 for c, lanes in ((4, 1), (16, 1), (16, 2), (64, 2), (32, 4))]
        sizes = [s << 20 for s in (512, 256, 96, 64, 16, 4)]
        times = {(i, s): time_plan(p, topo, s).time_us for i, p in enumerate(plans) for s in sizes}
        for i in range(len(plans)):
            per_byte = [times[(i, s)] / s for s in sizes]
            assert per_byte == sorted(per_byte), (name, i)
        own = len(plans) - 1  # the window's own plan: one of them, the others compete with it
        timings = Timings(own, lambda i, s: times[(own if i is None else i, s)], {})
        for s in sizes:
            best = min(times[(i, s)] for i in range(len(plans)))
            got = timings.winner(s)
            assert times[(own if got is None else got, s)] == best




def test_in_switch_plans_need_symmetric_memory_and_translated_ones_do_not():
    """Switch channels bound to the input or output address every member at this rank's own
    offset in its allocation; translated plans put into peers' scratch only."""
    from hipipe_compiler.lower import lower
    from hipipe_compiler.mscclpp.plan import RemoteBuffer
    from hipipe_compiler.mscclpp.translate import translate
    from hipipe_compiler.schedule import hierarchical_plan
    topo = preset("dgx-h100-8x2")
    assert nvls_allreduce_plan(node(), "p", False, 2).needs_symmetric_memory
    assert nvls_pipeline_plan(topo, "p", True, 4).needs_symmetric_memory
    translated = translate(lower(hierarchical_plan(topo, max_bytes=1 << 20)), topo, "t")
    assert not translated.needs_symmetric_memory
    g = translated.gpus[0]
    onto_output = replace(translated, gpus=(replace(g, remote_buffers=g.remote_buffers + (RemoteBuffer(1, "o", ("memory",)),)),
                                            *translated.gpus[1:]))
    assert onto_output.needs_symmetric_memory
