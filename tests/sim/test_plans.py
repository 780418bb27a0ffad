"""Plans timed under the cost model: what each operation costs, and agreement with the same
program as MSCCL XML where the two runtimes do the same work."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hipipe_compiler.compiler import CompileOptions
from hipipe_compiler.errors import PlanError
from hipipe_compiler.mscclpp.nvls import nvls_allreduce_plan
from hipipe_compiler.mscclpp.nvls_pipeline import nvls_pipeline_plan, staggered
from hipipe_compiler.mscclpp.plan import ExecutionPlan
from hipipe_compiler.mscclpp.translate import translate
from hipipe_compiler.mscclpp.verify import verify_plan
from hipipe_compiler.plan_compiler import compile_plans, timed_size
from hipipe_compiler.plan_fitting import fit
from hipipe_compiler.sim.plans import symmetric, time_plan
from hipipe_compiler.presets import preset
from hipipe_compiler.schedule import hierarchical_plan
from hipipe_compiler.sim import SimulationError, simulate_exact
from hipipe_compiler.topology import Dimension, Topology

from conftest import nvls_nodes
from strategies import plans


@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather"])
def test_one_node_ll_plans_take_the_xml_programs_time(collective):
    # packets only: no signals, no handshake; each packet put is the XML send it comes from
    topo = preset("dgx-h100-8x1")
    program, plan = fit(hierarchical_plan(topo, collective, chunks=2, protocol="LL", max_bytes=1 << 20), topo, "t")
    assert plan.use_double_scratch_buffer
    for size in (1 << 16, 1 << 18):
        assert time_plan(plan, topo, size).time_us == pytest.approx(simulate_exact(program, topo, size).time_us, rel=1e-9)


@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather"])
def test_ll_across_nodes_puts_packets_through_the_proxy_and_takes_the_xml_programs_time(collective):
    """Every port send of an LL plan is an `rppkt` of packets, received or packed into the
    sender's own scratch; with local work free, the plan takes the XML program's time: LL's
    alpha per network send, and no closing handshake."""
    latency = {"LL": 1.0, "LL128": 2.0, "Simple": 3.0}
    topo = Topology((Dimension(4, "switch", 100.0, latency, link="nvlink"),
                     Dimension(2, "switch", 25.0, {"LL": 5.0, "LL128": 8.0, "Simple": 20.0}, link="network")))
    program, plan = fit(hierarchical_plan(topo, collective, chunks=2, protocol="LL", max_bytes=1 << 20), topo, "t")
    packed = 0
    for g in plan.gpus:
        for tb in g.threadblocks:
            for i, op in enumerate(tb.ops):
                if op.channel_type == "port" and (op.src or op.dst):
                    assert op.name == "rppkt" and op.src[0].buffer == "s"
                    packed += any(p.name in ("cpkt", "recpkt") and op.src[0] in p.dst for p in tb.ops[:i])
    assert packed and plan.use_double_scratch_buffer
    for size in (1 << 12, 1 << 16):
        xml, ours = simulate_exact(program, topo, size).time_us, time_plan(plan, topo, size).time_us
        assert ours == pytest.approx(xml, rel=1e-9)


def test_a_simple_plan_pays_one_closing_signal_more_than_xml():
    topo = Topology((Dimension(4, "switch", 100.0, 2.0),))
    program, plan = fit(hierarchical_plan(topo, "allgather", protocol="Simple", max_bytes=1 << 20), topo, "t")
    size = 1 << 20
    xml, ours = simulate_exact(program, topo, size).time_us, time_plan(plan, topo, size).time_us
    # a put moves its bytes, its signal pays the 2 us the XML send paid; the handshake adds one more
    assert ours == pytest.approx(xml + 2.0, rel=1e-6)


def test_a_simple_allreduce_whose_dependencies_order_every_slot_closes_nothing_and_takes_the_xml_time():
    """Every slot's next write follows its read through the all-reduce's own data (the sender
    waits for what the receiver sends after reading, or writes only after hearing from it):
    no connection closes with a handshake, and the plan pays exactly the XML program's time."""
    topo = Topology((Dimension(4, "switch", 100.0, 2.0), Dimension(2, "switch", 25.0, 5.0, link="network")))
    program, plan = fit(hierarchical_plan(topo, "allreduce", protocol="Simple", max_bytes=1 << 20), topo, "t")
    assert not any(tb.ops[-1].name == "wait" for g in plan.gpus for tb in g.threadblocks)
    for size in (1 << 12, 1 << 20):
        assert time_plan(plan, topo, size).time_us == pytest.approx(simulate_exact(program, topo, size).time_us, rel=1e-9)


@pytest.mark.parametrize("collective", ["reducescatter", "allgather"])
def test_a_plan_opens_or_closes_its_handshakes_whichever_is_faster(collective):
    """A reduce-scatter's network connections first send after the node's stage, so their
    handshakes open (their latency hides behind that stage); an all-gather's send at once, so
    theirs close. The compiled plan takes the faster, here the XML program's time; the other
    way pays the network's or NVLink's latency more."""
    topo = Topology((Dimension(4, "switch", 100.0, 2.0, link="nvlink"), Dimension(2, "switch", 25.0, 5.0, link="network")))
    options = CompileOptions(collective=collective, algorithm="hierarchical", protocol="Simple")
    [cp] = compile_plans(topo, options, 1 << 20, 1 << 20)
    ours, xml = time_plan(cp.plans[0], topo, 1 << 20).time_us, simulate_exact(cp.program, topo, 1 << 20).time_us
    assert ours == pytest.approx(xml, rel=1e-9)
    other = translate(cp.program, topo, "t", opening=collective != "reducescatter")
    assert verify_plan(other).ok
    assert time_plan(other, topo, 1 << 20).time_us > ours + 1.0


def test_time_is_bounded_below_and_grows_with_size():
    topo = preset("dgx-h100-8x2")
    _, plan = fit(hierarchical_plan(topo, "allreduce", chunks=4, max_bytes=1 << 30), topo, "t")
    times = [time_plan(plan, topo, s) for s in (1 << 20, 1 << 24, 1 << 28)]
    assert all(t.time_us >= t.lower_bound_us for t in times)
    assert times[0].time_us < times[1].time_us < times[2].time_us


def test_sizes_the_executor_refuses_are_named():
    topo = preset("dgx-h100-8x1")
    _, plan = fit(hierarchical_plan(topo, "allreduce", chunks=2, max_bytes=1 << 20), topo, "t")
    with pytest.raises(SimulationError, match="chunks") as err:
        time_plan(plan, topo, (1 << 20) + 4)
    assert err.value.exit_code == 2
    with pytest.raises(SimulationError, match="outside"):
        time_plan(plan, topo, 1 << 24)


def test_a_plan_that_never_signals_deadlocks():
    topo = preset("dgx-h100-8x1")
    _, plan = fit(hierarchical_plan(topo, "allreduce", chunks=2, protocol="Simple", max_bytes=1 << 20), topo, "t")
    gpus = tuple(replace(g, threadblocks=tuple(replace(tb, ops=tuple(o for o in tb.ops if o.name != "signal"))
                                                for tb in g.threadblocks)) for g in plan.gpus)
    with pytest.raises(SimulationError, match="deadlock"):
        time_plan(replace(plan, gpus=gpus), topo, 1 << 20)


# -- rank 0 alone, each resource standing for its orbit ------------------------------------------

def _same_times(plan: ExecutionPlan, topo: Topology, nbytes: int) -> None:
    alone, every = time_plan(plan, topo, nbytes, orbits=True), time_plan(plan, topo, nbytes, orbits=False)
    assert alone.time_us == pytest.approx(every.time_us, rel=1e-9)
    for a, b in zip(alone.dims, every.dims):
        assert a.bytes_per_rank == pytest.approx(b.bytes_per_rank, rel=1e-9)
        assert a.busy_fraction == pytest.approx(b.busy_fraction, rel=1e-6, abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 8), st.integers(2, 4), st.sampled_from([1, 2, 5, 12]), st.integers(1, 3), st.booleans(),
       st.booleans(), st.sampled_from([1, 64, 8192]))
def test_rank_0_alone_times_an_in_switch_pipeline_as_every_rank_does(n, k, chunks, lanes, stagger, inplace, per_chunk):
    topo = nvls_nodes(n, k)
    lanes = min(lanes, chunks // 2) or 1
    plan = nvls_pipeline_plan(topo, "p", inplace, chunks, lanes, staggered(chunks, lanes) if stagger else ())
    assert symmetric(plan, topo)
    _same_times(plan, topo, 16 * plan.gpus[0].input_chunks * per_chunk)


@given(plans(max_ranks=16, max_chunks=3), st.sampled_from(["Simple", "LL"]), st.data())
def test_rank_0_alone_times_any_plan_whose_ranks_are_shifts_of_it_as_every_rank_does(plan, protocol, data):
    topo = plan.topology
    node = data.draw(st.sampled_from([d for d in range(1, topo.nranks + 1) if topo.nranks % d == 0]))
    try:
        _, ep = fit(replace(plan, protocol=protocol), topo, "random", node_size=node)
    except PlanError:
        assume(False)
    assume(symmetric(ep, topo))
    nbytes = timed_size(ep, data.draw(st.sampled_from([1 << 16, 1 << 20, plan.max_bytes])))
    try:
        time_plan(ep, topo, nbytes, orbits=False)
    except SimulationError:  # a size outside the plan's window
        assume(False)
    _same_times(ep, topo, nbytes)


def test_one_node_in_switch_plans_are_seen_as_shifts_of_rank_0():
    topo = preset("dgx-h100-8x1")
    for threadblocks in (1, 3):
        plan = nvls_allreduce_plan(topo, "n", False, threadblocks)
        assert symmetric(plan, topo)
        _same_times(plan, topo, 16 * plan.gpus[0].input_chunks * 1024)


def test_a_rank_that_is_not_a_shift_of_rank_0_is_seen():
    topo = nvls_nodes(4, 3)
    plan = nvls_pipeline_plan(topo, "p", False, 4, 2)
    assert symmetric(plan, topo)

    def with_gpu(rank: int, **changes: object) -> ExecutionPlan:
        gpus = list(plan.gpus)
        gpus[rank] = replace(gpus[rank], **changes)
        return replace(plan, gpus=tuple(gpus))
    g = plan.gpus[5]
    # its peers across nodes in another order (each put then goes to another rank)
    reordered = tuple(replace(c, connected_to=c.connected_to[::-1]) if c.channel_type == "port" else c
                      for c in g.channels)
    assert not symmetric(with_gpu(5, channels=reordered), topo)
    # one operation a chunk longer
    tb = g.threadblocks[0]
    at = next(i for i, op in enumerate(tb.ops) if op.name == "glres")
    op = tb.ops[at]
    longer = replace(op, src=(replace(op.src[0], size=op.src[0].size + 1),))
    blocks = (replace(tb, ops=tb.ops[:at] + (longer,) + tb.ops[at + 1:]), *g.threadblocks[1:])
    assert not symmetric(with_gpu(5, threadblocks=blocks), topo)
    # the same operations on other data: the same time
    moved = replace(op, src=(replace(op.src[0], index=op.src[0].index + 1),))
    blocks = (replace(tb, ops=tb.ops[:at] + (moved,) + tb.ops[at + 1:]), *g.threadblocks[1:])
    assert symmetric(with_gpu(5, threadblocks=blocks), topo)
    assert not symmetric(replace(plan, gpus=plan.gpus[:1]), topo)


@pytest.mark.parametrize("name", ["dgx-h100-8x2", "torus-4x4"])
def test_channels_numbered_by_which_end_is_which_are_still_seen_as_shifts(name):
    """The t-th channel A->B pairs with the t-th B->A, so rank 0's channels to its left
    neighbour and rank 1's to rank 0 come in another order; their roles are the same."""
    topo = preset(name)
    _, plan = fit(hierarchical_plan(topo, chunks=2, max_bytes=1 << 20), topo, "h")
    ordinals = []
    for rank in (0, 1):  # each threadblock's channels: their peer's shift, and their place among that peer's
        g = plan.gpus[rank]
        peers = g.peers("memory")
        ordinals.append([(topo.offset(rank, peers[i]), peers[:i].count(peers[i]))
                         for tb in g.threadblocks for i in tb.channel_list("memory")])
    assert ordinals[0] != ordinals[1]
    assert symmetric(plan, topo)
    _same_times(plan, topo, timed_size(plan, 1 << 20))


def test_a_rank_whose_channels_swap_roles_is_not_a_shift_of_rank_0():
    topo = preset("dgx-h100-8x2")
    _, plan = fit(hierarchical_plan(topo, chunks=2, max_bytes=1 << 20), topo, "h")
    g = plan.gpus[5]
    peers = g.peers("memory")
    used = {i for tb in g.threadblocks for i in tb.channel_list("memory")}
    i, j = next((i, j) for i in sorted(used) for j in sorted(used) if i < j and peers[i] == peers[j])
    swap = {i: j, j: i}
    blocks = tuple(replace(tb, channels=tuple(replace(c, channel_ids=tuple(swap.get(x, x) for x in c.channel_ids))
                                              if c.channel_type == "memory" else c for c in tb.channels))
                   for tb in g.threadblocks)
    gpus = list(plan.gpus)
    gpus[5] = replace(g, threadblocks=blocks)
    assert symmetric(plan, topo)
    assert not symmetric(replace(plan, gpus=tuple(gpus)), topo)
