"""Folding inner dimensions into one switch axis: where it is legal, that offsets on the
folded axis are translations of the network, and that an illegal fold is caught."""

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hipipe_compiler.bench import load_grid
from hipipe_compiler.errors import PlanError
from hipipe_compiler.lower import lower, same_schedule
from hipipe_compiler.optimizer.knobs import Knobs, build_plan
from hipipe_compiler.schedule import check_plan
from hipipe_compiler.schedule.fold import fold_add, fold_depth, fold_topology
from hipipe_compiler.sim import SimulationError, simulate, simulate_exact
from hipipe_compiler.sim.simulate import probe_ranks, symmetric
from hipipe_compiler.topology import Dimension, Topology, preset

from conftest import REPO

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


@given(st.lists(st.integers(2, 5), min_size=1, max_size=3), st.data())
def test_offsets_on_a_folded_axis_form_a_group(radices, data):
    """Adding an offset permutes the positions, offsets compose, and each has an inverse, so
    every rank's peer in a direction is some rank's, and a message's two ends agree."""
    n = 1
    for r in radices:
        n *= r
    radices = tuple(radices)
    a, b, p = (data.draw(st.integers(0, n - 1)) for _ in range(3))
    assert sorted(fold_add(q, a, radices) for q in range(n)) == list(range(n))
    assert fold_add(fold_add(p, a, radices), b, radices) == fold_add(p, fold_add(a, b, radices), radices)
    assert fold_add(p, 0, radices) == p
    assert any(fold_add(fold_add(p, a, radices), c, radices) == p for c in range(n))


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
