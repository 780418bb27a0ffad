"""Folding inner dimensions into one switch axis: where it is legal, that offsets on the
folded axis are translations of the network, that a folded plan's time floor holds on the
network, and that an illegal fold is caught."""

import math
from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hipipe_compiler.bench import load_grid
from hipipe_compiler.errors import PlanError
from hipipe_compiler.lower import lower, same_schedule
from hipipe_compiler.optimizer.knobs import Knobs, build_plan
from hipipe_compiler.schedule import check_plan, time_floor_us
from hipipe_compiler.schedule.fold import fold_add, fold_depth, fold_sub, fold_topology
from hipipe_compiler.sim import SimulationError, simulate, simulate_exact
from hipipe_compiler.sim.simulate import probe_ranks, symmetric
from hipipe_compiler.topology import Dimension, Topology
from hipipe_compiler.presets import preset

from conftest import REPO, examples, topologies

C6P = load_grid(REPO / "benchmarks" / "grid.yaml").topologies["C6p"]


def topo(*dims: tuple[int, str]) -> Topology:
    return Topology(tuple(Dimension(n, kind, 100.0, 1.0, f"d{i}") for i, (n, kind) in enumerate(dims)))


@pytest.mark.parametrize("dims,depth", [
    (((2, "ring"), (8, "switch"), (4, "switch")), 2),  # C6's shape: the pair ring folds into the switch
    (((3, "ring"), (4, "switch")), 2),  # three ranks on a ring are all neighbours
    (((8, "switch"), (4, "switch")), 2),
    (((4, "ring"), (4, "switch")), 0),  # ranks two apart on a ring of four have no link
    (((2, "switch"), (2, "ring"), (4, "switch")), 0),  # a ring above another dimension: no link across both
    (((4, "ring"), (4, "ring")), 0),  # no switch to fold into
    (((8, "switch"),), 0),
])
def test_fold_depth_says_which_dimensions_can_act_as_one_switch(dims, depth):
    assert fold_depth(topo(*dims)) == depth


def test_the_folded_topology_keeps_the_outer_switch_and_every_rank_number():
    folded, radices = fold_topology(C6P)
    assert radices == (2, 8)
    assert [d.size for d in folded.dimensions] == [16, 4]
    assert folded.dimensions[0].latency == C6P.dimensions[1].latency
    assert folded.dimensions[0].bandwidth == C6P.dimensions[1].bandwidth
    assert all(folded.coords(r)[1] == C6P.coords(r)[2] for r in range(C6P.nranks))
    with pytest.raises(ValueError, match="no inner dimensions can fold"):
        fold_topology(preset("torus-4x4"))


def digits(x: int, radices: tuple[int, ...]) -> list[int]:
    out = []
    for n in radices:
        x, d = divmod(x, n)
        out.append(d)
    return out


@given(st.lists(st.integers(2, 5), min_size=1, max_size=3), st.data())
def test_offsets_on_a_folded_axis_translate_every_folded_dimension(radices, data):
    """Adding an offset moves each folded coordinate by its own digit, with no carry (a
    translation of the real dimensions, so every rank's peer lies in the same direction);
    it permutes the positions, and fold_sub undoes it, so a message's two ends agree."""
    radices = tuple(radices)
    n = math.prod(radices)
    a, p = (data.draw(st.integers(0, n - 1)) for _ in range(2))
    moved = fold_add(p, a, radices)
    assert digits(moved, radices) == [(x + y) % r for x, y, r in zip(digits(p, radices), digits(a, radices), radices)]
    assert sorted(fold_add(q, a, radices) for q in range(n)) == list(range(n))
    assert fold_sub(moved, p, radices) == a and fold_add(fold_sub(p, a, radices), a, radices) == p


FOLDABLE = topologies(max_ranks=16).filter(lambda t: fold_depth(t) > 0)


@settings(max_examples=examples(15), deadline=None)
@given(FOLDABLE, st.integers(1, 4), st.integers(1, 3), st.booleans(), st.booleans(), st.sampled_from(["LL", "Simple"]))
def test_folded_all_reduces_run_rank_0s_schedule_shifted_on_every_rank(topo, chunks, lanes, mix, oneshot, protocol):
    """Folded all-reduce pipelines like the search's, mixed orders too, are the same on every
    rank up to a translation of the real network, so rank 0 alone times them exactly."""
    knobs = Knobs(chunks, mix=mix, ag_lane=True, lanes=lanes, ramp=1, oneshot=oneshot, fan=True, protocol=protocol,
                  fold=True)
    plan = build_plan(topo, "allreduce", 1 << 20, 1 << 20, knobs)
    try:
        program = lower(plan)
    except PlanError:
        return  # too large for the runtime
    assert symmetric(program, topo), knobs
    assert same_schedule(plan, probe_ranks(topo))
    rank0 = simulate(lower(plan, ranks=[0]), topo, 1 << 20, quotient=True).time_us
    assert rank0 == pytest.approx(simulate(program, topo, 1 << 20).time_us)


@settings(max_examples=examples(15), deadline=None)
@given(FOLDABLE, st.integers(1, 4), st.integers(1, 2), st.booleans(), st.sampled_from(["LL", "Simple"]),
       st.sampled_from([1 << 12, 1 << 20, 64 << 20]))
def test_no_run_of_a_folded_plan_beats_its_time_floor_on_the_network(topo, chunks, lanes, oneshot, protocol, nbytes):
    """The search drops folded candidates by this floor too, so it must hold on the real links."""
    knobs = Knobs(chunks, ag_lane=True, lanes=lanes, oneshot=oneshot, fan=True, protocol=protocol, fold=True)
    plan = build_plan(topo, "allreduce", nbytes, nbytes, knobs)
    try:
        program = lower(plan)
    except PlanError:
        return  # too large for the runtime
    nbytes -= nbytes % (program.nchunksperloop * 4)
    assume(nbytes > 0)
    assert time_floor_us(plan, nbytes, topo) <= simulate_exact(program, topo, nbytes).time_us * (1 + 1e-9)


def test_a_folded_axis_is_charged_the_bandwidth_of_every_folded_dimension():
    """The folded topology alone gives the axis one dimension's bandwidth, and a floor above a
    real run (C6p at 16 MiB, two chunks: 314.6 us against 307.2 simulated); the network's ring
    and switch together give a floor below it."""
    size = 16 << 20
    plan = build_plan(C6P, "allreduce", size, size, Knobs(2, fold=True))
    simulated = simulate_exact(lower(plan), C6P, size).time_us
    assert time_floor_us(plan, size, C6P) <= simulated < time_floor_us(replace(plan, fold=()), size)
    with pytest.raises(ValueError, match="needs the network it runs on"):
        time_floor_us(plan, size)
    with pytest.raises(ValueError, match="does not fold into dimensions of sizes"):
        time_floor_us(plan, size, preset("torus-4x4"))


def test_only_an_all_reduce_folds():
    """Reduce-scatter and all-gather lay their cells out by owner rank, and a digit-wise
    order breaks those runs differently on different ranks."""
    for collective in ("reducescatter", "allgather"):
        with pytest.raises(PlanError, match="only an all-reduce folds"):
            build_plan(C6P, collective, 1 << 20, 1 << 20, Knobs(1, fold=True))


def test_c6p_folds_its_ring_and_switch_into_one_hop_and_gains_at_64kib():
    """The folded one-shot pipeline runs on C6p's links, every rank rank 0's schedule shifted
    (so rank 0 alone times it), and beats the same knobs unfolded."""
    size = 64 << 10
    knobs = Knobs(3, ag_lane=True, lanes=2, ramp=1, oneshot=True, fan=True, protocol="LL", fold=True)
    plan = build_plan(C6P, "allreduce", size, size, knobs)
    assert plan.fold == (2, 8) and same_schedule(plan, probe_ranks(C6P))
    program = lower(plan)
    assert symmetric(program, C6P)
    folded = simulate(program, C6P, size).time_us
    assert simulate_exact(program, C6P, size).time_us == pytest.approx(folded)
    plain = simulate_exact(lower(build_plan(C6P, "allreduce", size, size, replace(knobs, fold=False))), C6P, size).time_us
    assert folded < 0.95 * plain


def test_a_fold_over_a_ring_of_four_needs_links_the_network_lacks():
    """Why fold_depth refuses a ring of four: a plan on the folded axis sends to ranks two
    apart on the ring, and the simulator finds no link."""
    network = topo((4, "ring"), (2, "switch"))
    fake = Topology((Dimension(8, "switch", 100.0, 1.0, "d0+d1"),))
    plan = replace(build_plan(fake, "allreduce", 1 << 20, 1 << 20, Knobs(1)), fold=(4, 2))
    with pytest.raises(SimulationError, match="no link"):
        simulate(lower(plan), network, 1 << 20)


def test_a_folded_axis_must_match_its_radices_and_exchange_directly():
    plan = build_plan(C6P, "allreduce", 1 << 20, 1 << 20, Knobs(2, fold=True))
    check_plan(plan)
    with pytest.raises(PlanError, match="it has 16 ranks"):
        check_plan(replace(plan, fold=(2, 4)))
    with pytest.raises(PlanError, match="needs direct or one-shot exchange, not ring"):
        check_plan(replace(plan, algorithms=("ring", *plan.algorithms[1:])))
