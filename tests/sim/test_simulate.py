"""The simulator follows cost-model.md section 3 exactly: hand-computed cases, properties
over random topologies, and the real 8-GPU files."""

import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hipipe_compiler.errors import PlanError
from hipipe_compiler.lower import lower, same_schedule
from hipipe_compiler.msccl import Gpu, Program, Step, Threadblock, read_program
from hipipe_compiler.optimizer import Knobs
from hipipe_compiler.optimizer import build_plan as hipipe_build
from hipipe_compiler.schedule import hierarchical_plan, ring_plan, themis_plan
from hipipe_compiler.sim import SimulationError, simulate, simulate_exact
from hipipe_compiler.sim.simulate import probe_ranks, symmetric
from hipipe_compiler.topology import Dimension, Topology
from hipipe_compiler.presets import preset

from conftest import COLLECTIVES, real_xml_params, topologies, c1p

MB = 1_000_000


def switch(n, bw=100.0, alpha=2.0, g=None):
    return Topology((Dimension(n, "switch", bw, alpha),), reduce_bandwidth=g)


def ring(n, bw=100.0, alpha=2.0):
    return Topology((Dimension(n, "ring", bw, alpha),))


def program(ranks, tbs_by_rank, nchunks=1, protocol="Simple", coll="allreduce"):
    """A program from {rank: [(send, recv, chan, [steps...])]}; steps are (type, cnt[, depid, deps, hasdep])."""
    gpus = []
    for r in range(ranks):
        tbs = []
        for i, (send, recv, chan, steps) in enumerate(tbs_by_rank.get(r, [])):
            built = []
            for pos, spec in enumerate(steps):
                t, cnt, *dep = spec
                depid, deps, hasdep = dep + [-1, -1, False][len(dep):]
                src = ("i", 0) if t in ("s", "rrs", "rrc", "rrcs", "cpy", "re") else ("i", -1)
                dst = ("o", 0) if t in ("r", "rcs", "rrc", "rrcs", "cpy", "re") else ("o", -1)
                built.append(Step(pos, t, *src, *dst, cnt, depid, deps, hasdep))
            tbs.append(Threadblock(i, send, recv, chan, tuple(built)))
        gpus.append(Gpu(r, nchunks, nchunks, 0, tuple(tbs)))
    return Program("hand", coll, protocol, 4, nchunks, ranks, True, True, 0, 0, tuple(gpus))


def test_one_message_over_one_link_is_alpha_plus_size_over_bandwidth():
    p = program(2, {0: [(1, -1, 0, [("s", 1)])], 1: [(-1, 0, 0, [("r", 1)])]})
    result = simulate(p, switch(2, bw=100, alpha=2), MB)
    assert result.time_us == pytest.approx(2 + MB / 100e3)  # 12 us
    assert result.iterations == 1


def test_two_messages_sharing_a_port_split_it_equally():
    # rank 0 sends 1 MB to rank 1 and 2 MB to rank 2 at once: each gets half of rank 0's port
    # until the small one ends; then the big one has the port to itself
    p = program(3, {0: [(1, -1, 0, [("s", 1)]), (2, -1, 0, [("s", 2)])],
                    1: [(-1, 0, 0, [("r", 1)])], 2: [(-1, 0, 0, [("r", 2)])]}, nchunks=2)
    result = simulate(p, switch(3, bw=100, alpha=2), 2 * MB)
    chunk = MB  # 2 MB over two chunks
    small_end = 2 + chunk / 50e3
    assert result.time_us == pytest.approx(small_end + (2 * chunk - chunk) / 100e3)


def test_a_ring_dimension_has_two_directed_links_of_half_the_bandwidth():
    # both neighbours at once: each message has its own directed link of B/2
    p = program(4, {0: [(1, -1, 0, [("s", 1)]), (3, -1, 0, [("s", 1)])],
                    1: [(-1, 0, 0, [("r", 1)])], 3: [(-1, 0, 0, [("r", 1)])]})
    result = simulate(p, ring(4, bw=100, alpha=2), MB)
    assert result.time_us == pytest.approx(2 + MB / 50e3)
    # two messages to the same neighbour (two channels) share that one link
    p2 = program(4, {0: [(1, -1, 0, [("s", 1)]), (1, -1, 1, [("s", 1)])],
                     1: [(-1, 0, 0, [("r", 1)]), (-1, 0, 1, [("r", 1)])]}, nchunks=2)
    assert simulate(p2, ring(4, bw=100, alpha=2), 2 * MB).time_us == pytest.approx(2 + 2 * MB / 50e3)
    # a ring of two: one directed link each way with the whole bandwidth
    p3 = program(2, {0: [(1, -1, 0, [("s", 1)])], 1: [(-1, 0, 0, [("r", 1)])]})
    assert simulate(p3, ring(2, bw=100, alpha=2), MB).time_us == pytest.approx(2 + MB / 100e3)


def test_illegal_links_are_errors_not_numbers():
    p = program(4, {0: [(2, -1, 0, [("s", 1)])], 2: [(-1, 0, 0, [("r", 1)])]})
    with pytest.raises(SimulationError, match="no link between rank 0 and rank 2"):
        simulate(p, ring(4), MB)


def test_deadlock_is_an_error():
    p = program(2, {0: [(1, 1, 0, [("r", 1), ("s", 1)])], 1: [(0, 0, 0, [("r", 1), ("s", 1)])]})
    with pytest.raises(SimulationError, match="deadlock"):
        simulate(p, switch(2), MB)


@pytest.mark.parametrize("protocol,window", [("Simple", 2), ("LL", 8), ("LL128", 8)])
def test_window_backpressure(protocol, window):
    """Three sends on one connection while the receiver is busy with a slow local copy: with
    W=2 the third waits until the receiver consumes the first; with W=8 it does not."""
    g = 0.1  # GB/s of local work: the receiver's copy of one chunk takes 10 us
    sends = [("s", 1)] * 3
    recvs = [("cpy", 1), ("r", 1), ("r", 1), ("r", 1)]
    p = program(2, {0: [(1, -1, 0, sends)], 1: [(-1, 0, 0, recvs)]}, nchunks=4, protocol=protocol)
    nbytes = 4 * 1000  # small: one iteration for every protocol
    result = simulate(p, switch(2, bw=100, alpha=2, g=g), nbytes)
    eff = {"Simple": 1.0, "LL": 0.5, "LL128": 120 / 128}[protocol]
    copy = 1000 / (g * 1e3)
    msg = 2 + 1000 / eff / 100e3
    if window == 2:
        # messages 1 and 2 go at once; message 3 waits until the receiver consumes message 1
        expected = copy + msg
    else:
        # each send completes on arrival, back to back; the receiver drains them after its copy
        expected = max(3 * msg, copy)
    assert copy > 3 * msg  # the case distinguishes the two windows
    assert result.time_us == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("protocol,nbytes,nchunks,iterations", [
    ("Simple", 1 << 30, 32, 16), ("Simple", 1 << 20, 32, 1), ("LL", 1 << 20, 8, 4),
    ("LL128", 64 << 20, 64, 2), ("LL128", 1 << 20, 1, 2), ("Simple", 3 << 20, 1, 2),
])
def test_iterations_per_protocol(protocol, nbytes, nchunks, iterations):
    p = program(2, {0: [(1, -1, 0, [("s", 1)])], 1: [(-1, 0, 0, [("r", 1)])]}, nchunks=nchunks, protocol=protocol)
    assert simulate(p, switch(2), nbytes).iterations == iterations


def test_iterations_repeat_the_program_and_pipeline_across_threadblocks():
    # 2 MiB slices: a 4 MiB call of one chunk runs the program twice; one send per iteration
    p = program(2, {0: [(1, -1, 0, [("s", 1)])], 1: [(-1, 0, 0, [("r", 1)])]})
    result = simulate(p, switch(2, bw=100, alpha=2), 4 << 20)
    assert result.iterations == 2
    assert result.time_us == pytest.approx(2 * (2 + (2 << 20) / 100e3))


def test_a_long_run_of_steps_that_complete_at_once_does_not_recurse():
    """Thousands of copies with no reduction cost, over LL iterations: each step ends the
    moment it starts, so the next one starts in the same instant."""
    copies = [("cpy", 1)] * 2000
    p = program(2, {0: [(1, -1, 0, [*copies, ("s", 1)])], 1: [(-1, 0, 0, [("r", 1), *copies])]}, protocol="LL")
    result = simulate(p, switch(2), 128 << 10)  # 128 KiB in 32 KiB LL slices: 4 iterations
    assert result.iterations == 4 and result.time_us > 0


def test_dependencies_wait_in_the_same_iteration():
    # tb1 waits for tb0's copy; local work takes bytes / G
    p2 = program(2, {0: [(-1, -1, 0, [("cpy", 1, -1, -1, True)]), (-1, -1, 0, [("cpy", 1, 0, 0)])]})
    timed = simulate(p2, switch(2, g=10.0), 20_000)
    assert timed.time_us == pytest.approx(2 * 20_000 / 10e3)


def test_fused_receive_reduce_send_chain():
    # 0 -> 1 -> 2 along a switch: rank 1's rrs receives, reduces (time at G) and forwards
    p = program(3, {0: [(1, -1, 0, [("s", 1)])], 1: [(2, 0, 0, [("rrs", 1)])], 2: [(-1, 1, 0, [("r", 1)])]})
    free = simulate(p, switch(3, bw=100, alpha=2), MB)
    assert free.time_us == pytest.approx(2 * (2 + MB / 100e3))
    slow = simulate(p, switch(3, bw=100, alpha=2, g=50.0), MB)
    assert slow.time_us == pytest.approx(free.time_us + MB / 50e3)


@given(topologies(max_ranks=32), st.sampled_from(COLLECTIVES), st.integers(1, 3),
       st.sampled_from([1 << 16, 1 << 20, 16 << 20, 256 << 20]), st.sampled_from(["ring", "hier", "themis"]))
def test_no_schedule_beats_the_physical_limit(topo, coll, chunks, nbytes, algo):
    build = {"ring": ring_plan, "hier": hierarchical_plan, "themis": themis_plan}[algo]
    plan = build(topo, coll, chunks, max_bytes=nbytes) if algo != "themis" else themis_plan(topo, coll, chunks, max_bytes=nbytes)
    result = simulate(lower(plan), topo, nbytes)
    assert result.time_us >= result.lower_bound_us * (1 - 1e-9), "a time below T_LB is a simulator bug"
    assert 0 < result.utilisation <= 1 + 1e-9


@given(topologies(max_ranks=32), st.sampled_from(COLLECTIVES), st.integers(1, 2), st.sampled_from([1 << 20, 64 << 20]))
def test_halving_every_bandwidth_never_makes_a_program_faster(topo, coll, chunks, nbytes):
    program_ = lower(hierarchical_plan(topo, coll, chunks, max_bytes=nbytes))
    slow = Topology(tuple(Dimension(d.size, d.kind, d.bandwidth / 2, d.latency, d.name) for d in topo.dimensions))
    assert simulate(program_, slow, nbytes).time_us >= simulate(program_, topo, nbytes).time_us * (1 - 1e-9)


def test_reference_values_of_the_unpipelined_hierarchical_all_reduce():
    """algorithms.md 6.2 'hierSeq': one chunk, fastest dimension first, with a single
    iteration it is exactly the sum of the four stages."""
    c1 = Topology((Dimension(8, "switch", 300, 1.0), Dimension(4, "switch", 50, 5.0)))  # C1
    result = simulate(lower(hierarchical_plan(c1, max_bytes=1 << 20)), c1, 1 << 20)
    assert result.time_us == pytest.approx(22.05, abs=0.01)


@pytest.mark.parametrize("protocol,alphas", [("LL", 0.6 + 2 * 2.7 + 0.6), ("LL128", 1.9 + 2 * 4.0 + 1.9),
                                              ("Simple", 3.4 + 2 * 14.0 + 3.4)])
def test_a_message_waits_the_alpha_of_the_programs_protocol(protocol, alphas):
    """On C1p one byte per rank pays only latencies: reduce-scatter on NVLink, an IB all-reduce
    (two exchanges), all-gather on NVLink, each at its protocol's alpha (cost-model.md 1)."""
    topo = c1p(4)
    program = lower(hierarchical_plan(topo, protocol=protocol, max_bytes=1 << 10))
    assert simulate(program, topo, program.nchunksperloop * 4).time_us == pytest.approx(alphas, abs=0.01)


@pytest.mark.parametrize("path", real_xml_params(lambda p: read_program(p).ngpus == 8))
def test_real_8_gpu_files_simulate_on_an_8_rank_switch(path):
    prog = read_program(path)
    topo = switch(8, bw=300, alpha=1)
    size = prog.max_bytes or (1 << 20)
    size -= size % (prog.nchunksperloop * 4 * (8 if prog.collective in ("allgather", "alltoall") else 1)) or 0
    result = simulate(prog, topo, max(size, prog.nchunksperloop * 4))
    assert result.time_us > 0 and math.isfinite(result.time_us)
    if result.lower_bound_us is not None:
        assert result.time_us >= result.lower_bound_us


def test_report_has_the_documented_fields():
    topo = c1p(2)
    result = simulate(lower(hierarchical_plan(topo, max_bytes=1 << 24)), topo, 1 << 24)
    d = result.to_dict()
    for key in ("time_us", "lower_bound_us", "utilisation", "algbw_GBps", "busbw_GBps", "iterations"):
        assert key in d
    assert d["busbw_GBps"] == pytest.approx(d["algbw_GBps"] * 2 * 15 / 16)
    nv, ib = result.dims
    assert nv.bytes_per_rank == pytest.approx(2 * 7 / 8 * (1 << 24))
    assert ib.bytes_per_rank == pytest.approx(2 * 1 / 2 * (1 << 24) / 8)
    assert 0 < ib.busy_fraction < 1 and 0 < nv.busy_fraction < 1


@given(topologies(max_ranks=32), st.sampled_from(COLLECTIVES), st.integers(1, 3),
       st.sampled_from([1 << 16, 1 << 20, 64 << 20]), st.booleans(), st.booleans(), st.integers(1, 2))
def test_quotient_simulation_of_rank_0_equals_the_full_simulation(topo, coll, chunks, nbytes, themis, lanes_split, lanes):
    """Every rank of a hierarchical plan runs rank 0's schedule shifted by its coordinates, so
    simulating rank 0 alone, fed by the mirror images of its own sends, gives the same time."""
    plan = (themis_plan(topo, coll, chunks, max_bytes=nbytes) if themis
            else hierarchical_plan(topo, coll, chunks, max_bytes=nbytes, lanes=lanes))
    full = simulate(lower(plan), topo, nbytes)
    quotient = simulate(lower(plan, ranks=[0]), topo, nbytes, quotient=True)
    assert quotient.time_us == pytest.approx(full.time_us, rel=1e-9)
    for a, b in zip(quotient.dims, full.dims):
        assert a.bytes_per_rank == pytest.approx(b.bytes_per_rank)


def test_one_shot_all_reduce_costs_one_latency():
    """n ranks on a switch each send their whole block to every peer at once: alpha + (n-1) s / B
    on the shared port, against 2 alpha + 2 (n-1)/n s / B for reduce-scatter + all-gather."""
    topo = switch(4, bw=100, alpha=5)
    nbytes = 400_000
    one = simulate(lower(hierarchical_plan(topo, algorithms=("oneshot",), max_bytes=nbytes)), topo, nbytes)
    two = simulate(lower(hierarchical_plan(topo, algorithms=("direct",), max_bytes=nbytes)), topo, nbytes)
    assert one.time_us == pytest.approx(5 + 3 * nbytes / 100e3)
    assert two.time_us == pytest.approx(2 * (5 + 3 / 4 * nbytes / 100e3))


knob_sets = st.builds(
    Knobs, chunks=st.integers(1, 6), mix=st.booleans(), ag_lane=st.booleans(), granularity=st.sampled_from([1, 2, 4, 8]),
    lanes=st.integers(1, 3), ramp=st.integers(0, 2), split=st.booleans(), fan=st.booleans(), oneshot=st.booleans(),
)


@given(topologies(max_ranks=32), knob_sets, st.sampled_from([1 << 20, 64 << 20]))
def test_hipipe_all_reduces_are_the_same_on_every_rank_where_the_probes_say_so(topo, knobs, nbytes):
    """Blocks too big for one step are cut relative to each rank's position, so every rank
    runs rank 0's schedule shifted and simulating rank 0 alone is exact. A one-shot stage
    whose owned range spans several steps is cut at fixed offsets and may differ per rank
    (a 2 x 9 torus with 8 units per chunk does): the search then takes the probe ranks'
    word (same_schedule), which must never claim a symmetry the program lacks."""
    plan = hipipe_build(topo, "allreduce", nbytes, nbytes, knobs, nbytes)
    try:
        program = lower(plan)
    except PlanError:
        return  # does not fit the runtime: the optimizer skips it
    if not any(a == "oneshot" for a in plan.algorithms):
        assert symmetric(program, topo)
    if same_schedule(plan, probe_ranks(topo)):
        assert symmetric(program, topo)
    if symmetric(program, topo):
        assert simulate_exact(program, topo, nbytes).time_us == pytest.approx(simulate(program, topo, nbytes).time_us,
                                                                              rel=1e-9)


def test_symmetric_sees_a_rank_that_runs_a_different_schedule():
    topo = preset("torus-4x4")
    program = lower(hierarchical_plan(topo, chunks=2, max_bytes=1 << 20))
    assert symmetric(program, topo)
    gpu = program.gpus[5]
    tb = gpu.threadblocks[0]
    steps = (tb.steps[1], tb.steps[0], *tb.steps[2:])  # two steps swapped on rank 5 only
    changed = replace(gpu, threadblocks=(replace(tb, steps=steps), *gpu.threadblocks[1:]))
    broken = replace(program, gpus=(*program.gpus[:5], changed, *program.gpus[6:]))
    assert not symmetric(broken, topo)
    assert not symmetric(lower(ring_plan(topo, max_bytes=1 << 20)), topo)  # one ring through every rank
    assert not symmetric(lower(hierarchical_plan(topo, max_bytes=1 << 20), ranks=[0]), topo)  # nothing to compare


def test_probe_ranks_differ_from_rank_zero_in_every_dimension():
    topo = preset("torus-4x4x4")
    for r in probe_ranks(topo):
        assert all(c != 0 for c in topo.coords(r))
