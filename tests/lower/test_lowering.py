"""Lowering: every program we emit verifies and stays within the runtime's limits."""

from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hipipe_compiler.errors import PlanError
from hipipe_compiler.lower import lower, lowering_key, same_schedule
from hipipe_compiler.msccl import Limits
from hipipe_compiler.msccl.runtime import piece_count
from hipipe_compiler.msccl.verify import verify
from hipipe_compiler.optimizer import Knobs
from hipipe_compiler.optimizer import build_plan as hipipe_build
from hipipe_compiler.schedule import ChunkPlan, Plan, hierarchical_plan, ring_plan
from hipipe_compiler.schedule.baselines import tree_plan
from hipipe_compiler.schedule.trees import nccl_tree, nccl_tree_fits
from hipipe_compiler.sim import simulate
from hipipe_compiler.topology import Dimension, Topology
from hipipe_compiler.presets import preset

from conftest import COLLECTIVES, examples, topologies, c1p
from strategies import WINDOWS, plans


def assert_within_limits(program, limits=Limits()):
    assert program.nchannels <= limits.max_channels
    assert program.nchunksperloop <= limits.max_offset + 1
    for gpu in program.gpus:
        assert len(gpu.threadblocks) <= limits.max_threadblocks
        nodes = 1 + program.ngpus + len(gpu.threadblocks) + sum(len(tb.steps) for tb in gpu.threadblocks)
        assert nodes <= limits.max_nodes
        for tb in gpu.threadblocks:
            assert len(tb.steps) <= limits.max_steps
            assert 0 <= tb.chan < program.nchannels
            for pos, step in enumerate(tb.steps):
                assert step.s == pos
                assert 0 <= step.depid <= limits.max_depid or step.depid == -1
                if step.type != "nop":
                    assert step.cnt >= 1 and step.cnt <= limits.max_count
                    assert max(step.srcoff, step.dstoff) <= limits.max_offset


@given(topologies(max_ranks=64), st.sampled_from(COLLECTIVES), st.integers(1, 3),
       st.sampled_from([1 << 20, 1 << 30]), st.booleans(), st.integers(1, 4))
def test_baselines_verify_for_random_topologies(topo, coll, chunks, max_bytes, flat, channels):
    if flat:  # rings side by side, each through another translation of the cycle (NCCL's channels)
        plan = ring_plan(topo, coll, chunks * channels, max_bytes=max_bytes, channels=channels)
    else:
        plan = hierarchical_plan(topo, coll, chunks, max_bytes=max_bytes)
    program = lower(plan)
    report = verify(program)
    assert report.ok, report.violations[:3]
    assert_within_limits(program)
    assert program.inplace and program.outofplace  # one program serves both kinds of call


@settings(max_examples=examples(60))
@given(plans())
def test_arbitrary_plans_lower_to_programs_that_verify(plan):
    """Chunk sizes, per-chunk orders, directions, lanes, algorithms, layouts, protocols and
    emission orders all vary; the lowering must still produce a correct program or say why not."""
    try:
        program = lower(plan)
    except PlanError as exc:
        assert any(word in str(exc) for word in ("threadblocks", "channels", "steps", "chunks per loop", "nodes")), exc
        return
    report = verify(program)
    assert report.ok, (plan, report.violations[:3])
    assert_within_limits(program)


def test_ring_programs_fuse_receives_with_sends():
    program = lower(ring_plan(c1p(2), "allreduce", max_bytes=1 << 20))
    types = Counter(st.type for _, _, st in program.steps())
    assert types["rrs"] and types["rrcs"] and types["rcs"]
    for _, _, step in program.steps():
        if step.type in ("rrc", "rrcs"):  # the local operand is the chunk being reduced
            assert (step.srcbuf, step.srcoff) in (("i", step.dstoff), ("o", step.dstoff))


def test_direct_exchange_reduces_in_a_dependency_chain():
    program = lower(hierarchical_plan(c1p(2), "allreduce", max_bytes=1 << 20))
    rank0 = program.gpus[0]
    rrc = [(tb.id, st) for tb in rank0.threadblocks for st in tb.steps if st.type == "rrc" and st.dstoff >= 0]
    # the reductions into the rank's own block, from 7 NVLink peers, are ordered by dependencies
    assert sum(1 for _, st in rrc if st.depid >= 0) >= 6


def test_fused_sends_fit_the_fifo_at_the_largest_size():
    small = lower(hierarchical_plan(preset("torus-4x4"), "allreduce", max_bytes=1 << 20))
    large = lower(hierarchical_plan(preset("torus-4x4"), "allreduce", max_bytes=1 << 30))
    assert max(st.cnt for _, _, st in small.steps()) > 1
    limit = piece_count("Simple", 1 << 30, large.nchunksperloop, ring=True)
    assert limit == 1
    for _, tb, step in large.steps():
        if step.type == "s" and tb.recv >= 0:  # a send-first step of a fused threadblock
            assert step.cnt <= limit


def test_split_layout_separates_send_and_receive_threadblocks():
    topo = c1p(2)
    plan = hierarchical_plan(topo, "allreduce", layouts=("split", "split"), max_bytes=1 << 30)
    program = lower(plan)
    for tb in program.gpus[0].threadblocks:
        assert tb.send == -1 or tb.recv == -1
    assert verify(program).ok


@pytest.mark.parametrize("name", ["dgx-h100-8x32", "pod-8x4x8x4"])
def test_large_hierarchical_allreduce_fits_the_runtime(name):
    """msccl-tools cannot produce a hierarchical all-reduce beyond 8x8; we do 256 and 1024 ranks."""
    topo = preset(name)
    program = lower(hierarchical_plan(topo, "allreduce", max_bytes=1 << 30))
    assert program.ngpus == topo.nranks
    assert_within_limits(program)
    report = verify(program)
    assert report.ok, report.violations[:3]


def test_too_many_chunks_is_refused_with_a_reason():
    plan = hierarchical_plan(preset("pod-8x4x8x4"), "allreduce", chunks=20, max_bytes=1 << 30)
    with pytest.raises(PlanError, match="int16"):
        lower(plan)


def test_unsplittable_threadblock_budget_is_refused_with_a_reason():
    plan = hierarchical_plan(c1p(4), "allreduce", chunks=2, lanes=2, max_bytes=1 << 20)
    from hipipe_compiler.msccl import Limits as L
    with pytest.raises(PlanError, match="threadblocks"):
        lower(plan, L(max_threadblocks=8))


def test_the_xml_reader_limit_refuses_one_node_too_many_and_no_fewer():
    plan = hierarchical_plan(c1p(4), "allreduce", chunks=8, max_bytes=1 << 30)
    program = lower(plan)
    nodes = 1 + program.ngpus + max(len(g.threadblocks) + sum(len(tb.steps) for tb in g.threadblocks) for g in program.gpus)
    with pytest.raises(PlanError, match="nodes"):
        lower(plan, replace(Limits(), max_nodes=nodes - 1))
    assert lower(plan, replace(Limits(), max_nodes=nodes)) == program


@settings(max_examples=examples(60), deadline=None)
@given(plans(max_ranks=16))
def test_the_early_footprint_never_exceeds_the_lowered_programs(plan):
    # lowering refuses a plan from this floor before its costly passes: it must be a floor
    from hipipe_compiler.lower.emission import footprint
    from hipipe_compiler.lower.generate import Generator
    from hipipe_compiler.lower.segments import segment_cuts
    try:
        program = lower(plan)
    except PlanError:
        return
    gen = Generator(plan, Limits())
    for gpu in program.gpus:
        ops = gen.generate(gpu.id)
        ntb, rank_nodes = footprint(gen, ops, segment_cuts(gen, [ops], {}, [[0] * len(ops)]))
        assert ntb <= len(gpu.threadblocks)
        assert rank_nodes <= len(gpu.threadblocks) + sum(len(tb.steps) for tb in gpu.threadblocks)


def test_lanes_run_chunks_on_separate_channels():
    topo = c1p(2)
    one = lower(hierarchical_plan(topo, "allreduce", chunks=2, lanes=1, max_bytes=1 << 20))
    two = lower(hierarchical_plan(topo, "allreduce", chunks=2, lanes=2, max_bytes=1 << 20))
    assert two.max_threadblocks == 2 * one.max_threadblocks
    assert two.nchannels == 2 and one.nchannels == 1
    assert verify(two).ok


def test_reducescatter_and_allgather_use_the_runtime_buffer_sizes():
    topo = c1p(2)
    rs = lower(hierarchical_plan(topo, "reducescatter", chunks=2))
    ag = lower(hierarchical_plan(topo, "allgather", chunks=2))
    assert (rs.gpus[0].i_chunks, rs.gpus[0].o_chunks) == (rs.nchunksperloop, rs.nchunksperloop // 16)
    assert (ag.gpus[0].i_chunks, ag.gpus[0].o_chunks) == (ag.nchunksperloop // 16, ag.nchunksperloop)
    assert rs.gpus[0].s_chunks > 0  # partial sums live in scratch, never in the user's send buffer


@pytest.mark.parametrize("n", [3, 4, 5, 8])
def test_both_way_rings_take_half_the_latencies_with_the_same_bytes(n):
    from dataclasses import replace

    from hipipe_compiler.sim import simulate
    from hipipe_compiler.topology import Dimension, Topology
    alpha = 10.0
    topo = Topology((Dimension(n, "ring", 100.0, alpha, "x"),), name=f"ring{n}")
    ring = hierarchical_plan(topo, "allreduce", 1, max_bytes=1 << 16)
    bidir = replace(ring, algorithms=("bidir",))
    programs = {p.algorithms[0]: lower(p) for p in (ring, bidir)}
    assert verify(programs["bidir"]).ok
    runs = {alg: simulate(prog, topo, 1 << 16) for alg, prog in programs.items()}
    wire = alpha * 1e-6 * 100e9 / 2  # bytes a link moves in one latency: the data is far smaller
    assert runs["bidir"].dims[0].bytes_per_rank == pytest.approx(runs["ring"].dims[0].bytes_per_rank)
    # reduce-scatter and all-gather: 2 (n - 1) latencies around a ring, 2 (n // 2) both ways
    for alg, rounds in (("ring", 2 * (n - 1)), ("bidir", 2 * (n // 2))):
        assert rounds * alpha <= runs[alg].time_us < rounds * alpha + 2 * (n - 1) * (1 << 16) / n / wire * alpha


def _random_unit_graph(rng, ntb=4, nunits=24):
    """A random dependency DAG of units on threadblocks, numbered so that some units come
    before units they wait for (as when a fused send waits for a later unit)."""
    from hipipe_compiler.lower.emission import _Graph, _Unit
    order = list(range(nunits))  # execution order; numbering below is a shuffle of it
    tb_of = [rng.randrange(ntb) for _ in order]
    number = list(range(nunits))
    rng.shuffle(number)
    units, tb_units, prev_in_tb = [None] * nunits, [[] for _ in range(ntb)], [-1] * nunits
    for k in order:
        ui, t = number[k], tb_of[k]
        units[ui] = _Unit(ui, [ui], t, len(tb_units[t]), "s", 1)
        prev_in_tb[ui] = tb_units[t][-1].index if tb_units[t] else -1
        tb_units[t].append(units[ui])
    deps = [set() for _ in range(nunits)]
    for k in order:
        for j in rng.sample(range(k), min(k, rng.randrange(4))):
            deps[number[k]].add(number[j])
    return _Graph(units, tb_units, deps, prev_in_tb, forward=False)


def test_prune_keeps_exactly_the_dependencies_nothing_else_implies():
    """Also for a unit numbering that is not a topological order (the Kahn path)."""
    import random

    from hipipe_compiler.lower.emission import _prune
    rng = random.Random(7)
    for _ in range(50):
        g = _random_unit_graph(rng)
        preds = [set(d) | ({p} if p >= 0 else set()) for d, p in zip(g.deps, g.prev_in_tb)]

        def ancestors(u, seen=None):  # u and everything it waits for, directly or not
            seen = set() if seen is None else seen
            if u not in seen:
                seen.add(u)
                for p in preds[u]:
                    ancestors(p, seen)
            return seen

        pruned = _prune(g, len(g.tb_units))
        for ui, deps in enumerate(g.deps):
            cands = [d for d in deps if g.units[d].tb != g.units[ui].tb]
            before = ancestors(g.prev_in_tb[ui]) if g.prev_in_tb[ui] >= 0 else set()
            want = {d for d in cands if d not in before and not any(o != d and d in ancestors(o) for o in cands)}
            assert set(pruned[ui]) == want


def test_prune_refuses_a_dependency_cycle():
    import random

    from hipipe_compiler.lower.emission import _prune
    g = _random_unit_graph(random.Random(3))
    first, last = g.tb_units[0][0].index, g.tb_units[0][-1].index
    g.deps[first].add(last)  # the first unit of a threadblock waits for its last
    with pytest.raises(PlanError, match="cycle"):
        _prune(g, len(g.tb_units))


@settings(max_examples=examples(60), deadline=None)
@given(plans(max_ranks=16), st.sampled_from(WINDOWS))
def test_plans_with_one_lowering_key_lower_to_one_program(plan, other_max):
    # the optimizer and the compiler share programs between windows by this key
    other = plan.with_window(other_max // 2, other_max)
    try:
        first, second = lower(plan), lower(other)
    except PlanError:
        return
    same_key = lowering_key(plan) == lowering_key(other)
    assert (first.with_window(0, 0) == second.with_window(0, 0)) or not same_key


def test_the_lowering_key_ignores_piece_limits_that_cut_nothing():
    plan = hierarchical_plan(preset("torus-4x4"), "allreduce", 1, max_bytes=1 << 14, nominal_bytes=1 << 20)
    # blocks of 4 cells: limits of 71 and 16 cells cut nothing, 1 or 2 cells do
    assert lowering_key(plan) == lowering_key(plan.with_window(1 << 21, 1 << 22))
    assert lowering_key(plan.with_window(1 << 23, 1 << 24)) != lowering_key(plan.with_window(1 << 25, 1 << 26))


@settings(max_examples=examples(60), deadline=None)
@given(plans(max_ranks=16))
def test_ranks_with_rank_0s_operations_get_rank_0s_program_shifted(plan):
    # the optimizer times rank 0 alone when same_schedule holds: that must be exact
    from hipipe_compiler.sim.simulate import probe_ranks, symmetric
    if plan.flat:
        return
    probes = probe_ranks(plan.topology)
    try:
        program = lower(plan, ranks=[0, *probes])
    except PlanError:
        return
    assert symmetric(program, plan.topology) or not same_schedule(plan, probes)


@given(topologies(max_ranks=32), st.integers(1, 3), st.sampled_from(["LL", "LL128", "Simple"]),
       st.sampled_from([64 << 10, 1 << 20, 64 << 20]), st.integers(1, 3))
def test_nccls_tree_verifies_where_its_links_exist(topo, chunks, protocol, size, channels):
    """A chain through each node, a double binary tree across the nodes' first ranks, and the
    trees of each further channel translated: each program verifies."""
    assume(nccl_tree_fits(topo))
    program = lower(tree_plan(topo, "allreduce", chunks * channels, protocol, max_bytes=size, channels=channels))
    report = verify(program)
    assert report.ok, report.violations[:3]
    counts = {len(g.threadblocks) for g in program.gpus}
    # on one channel a leaf has fewer threadblocks than an inner rank; translated channels
    # hand the roles round, so that the ranks may even out
    assert len(counts) > 1 or channels > 1 or topo.nranks <= 2 or len({len(c) for c in (nccl_tree(topo, 0)[1])}) == 1
    assert simulate(program, topo, size).time_us > 0


@given(topologies(max_ranks=64), st.integers(1, 4), st.sampled_from(["LL", "Simple"]))
def test_hipipe_trees_verify_over_switch_dimensions(topo, chunks, protocol):
    assume(any(d.kind == "switch" and d.size > 2 for d in topo.dimensions))
    plan = hipipe_build(topo, "allreduce", 1 << 20, 1 << 20, Knobs(chunks, ag_lane=True, tree=True, protocol=protocol))
    assert "tree" in plan.algorithms
    try:
        program = lower(plan)
    except PlanError:
        return
    assert verify(program).ok


@given(st.sampled_from([(5, 2), (4, 3), (3, 4)]), st.sampled_from(["fused", "split"]),
       st.sampled_from(["fused", "split"]), st.sampled_from(["LL", "Simple"]), st.integers(0, 1))
def test_a_tree_axis_that_other_chunks_reduce_scatter_over_receives_each_peer_in_one_threadblock(
        sizes, layout0, layout1, protocol, lane):
    """Chunks that end on a switch axis all-reduce over its tree; chunks that start there
    exchange directly with every peer. The two must not receive from one peer on one channel
    in two threadblocks (a connection the runtime gives one threadblock), as they once did."""
    topo = Topology((Dimension(sizes[0], "switch", 25.0, 0.5, "d0"), Dimension(sizes[1], "switch", 25.0, 0.0, "d1")))
    plan = Plan(topology=topo, collective="allreduce",
                chunks=(ChunkPlan(units=2, order=(0, 1), direction=1, lane=0),
                        ChunkPlan(units=1, order=(1, 0), direction=1, lane=lane)),
                algorithms=("tree", "tree"), layouts=(layout0, layout1), protocol=protocol,
                min_bytes=1 << 15, max_bytes=1 << 16, nominal_bytes=1 << 16, name="mixed")
    program = lower(plan)
    receivers = Counter((g.id, tb.chan, tb.recv) for g in program.gpus for tb in g.threadblocks if tb.recv >= 0)
    assert max(receivers.values()) == 1
    report = verify(program)
    assert report.ok, report.violations[:3]
    assert_within_limits(program)


@pytest.mark.parametrize("coll", ["reducescatter", "allgather"])
def test_a_block_of_adjacent_owners_is_one_message_on_every_rank(coll):
    """Rank 1 meets the owners of a block on the faster dimension in the order 3, 2, rank 0
    in the order 2, 3: their cells are one run either way, so every rank sends the block in
    one step, as rank 0 does (the search times rank 0 alone when the ranks agree)."""
    topo = Topology((Dimension(2, "ring", 12.5, 0.0, "d0"), Dimension(2, "ring", 25.0, 0.05, "d1")))
    program = lower(hierarchical_plan(topo, coll, 1, max_bytes=1 << 16))
    shapes = {gpu.id: sorted(Counter((st.type, st.cnt) for tb in gpu.threadblocks for st in tb.steps).items())
              for gpu in program.gpus}
    assert all(shape == shapes[0] for shape in shapes.values()), shapes
    assert simulate(program, topo, 1 << 16).time_us == pytest.approx(
        simulate(lower(hierarchical_plan(topo, coll, 1, max_bytes=1 << 16), ranks=[0]), topo, 1 << 16,
                 quotient=True).time_us)
    assert verify(program).ok


def test_a_plan_the_runtime_would_replay_too_often_is_refused_with_the_count():
    """MSCCL_MAX_ITER: 2 TiB in 16 chunks is 65,536 Simple slices of 2 MiB per chunk, one too many."""
    topo = preset("torus-4x4")
    ok = lower(ring_plan(topo, "allreduce", max_bytes=1 << 40))  # 16 chunks of 64 GiB: 32,768 slices
    assert ok.nchunksperloop == 16
    with pytest.raises(PlanError, match="needs 65536 iterations of the program .* runs at most 65535"):
        lower(ring_plan(topo, "allreduce", max_bytes=2 << 40))
