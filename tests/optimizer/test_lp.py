"""The two LPs of HiPIPE against closed forms and the physical limit."""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hipipe_compiler.bounds import bandwidth_bound_us
from hipipe_compiler.optimizer import Knobs, build_plan, lp
from hipipe_compiler.optimizer.lp import StageCost, chunk_sizes, dimension_loads, geometric_sizes, order_mix
from hipipe_compiler.topology import Dimension, Topology
from hipipe_compiler.presets import preset

from conftest import topologies, c1p


def two_stage(k, b1, b2, a=0.0):
    stages = [[StageCost("r1", a, b1), StageCost("r2", a, b2)] for _ in range(k)]
    sequence = {"r1": [(i, 0) for i in range(k)], "r2": [(i, 1) for i in range(k)]}
    return stages, sequence


@pytest.mark.parametrize("k,makespan,sizes", [
    (2, 3.25, [0.25, 0.75]),
    (4, 3.025, [0.025, 0.075, 0.225, 0.675]),
    (8, 3.0003, None),
])
def test_two_stages_without_latency_give_geometric_chunks(k, makespan, sizes):
    """algorithms.md 4.3: b = (1, 3), M = 1 gives 3.25 / 3.025 / 3.0003 for K = 2 / 4 / 8."""
    got, c = chunk_sizes(*two_stage(k, 1.0, 3.0), total=1.0)
    assert c == pytest.approx(makespan, abs=1e-4)
    if sizes:
        assert got == pytest.approx(sizes, abs=1e-9)
    assert got == pytest.approx(geometric_sizes(1.0, 3.0, k), abs=1e-9)
    # uniform chunks would give b2 M + b1 M / K
    assert c < 3.0 + 1.0 / k


@given(st.floats(0.1, 10), st.floats(0.1, 10), st.integers(2, 10))
def test_closed_form_matches_the_lp(b1, b2, k):
    sizes, c = chunk_sizes(*two_stage(k, b1, b2), total=1.0)
    geo = geometric_sizes(b1, b2, k)
    assert c == pytest.approx(max(b1, b2) + min(b1, b2) * min(geo[0], geo[-1]), rel=1e-6)
    assert sum(sizes) == pytest.approx(1.0)


def test_latency_makes_more_chunks_cost_more():
    # with a per-chunk latency the best makespan has a finite best K
    values = [chunk_sizes(*two_stage(k, 1.0, 2.0, a=0.05), total=1.0)[1] for k in (1, 2, 4, 8, 32)]
    assert min(values) < values[0] and values[-1] > min(values)


@pytest.mark.parametrize("name", ["dgx-h100-8x4", "torus-4x4", "torus-4x4x4", "ring-fc-switch-2x8x4"])
def test_order_mixing_reaches_the_physical_limit_on_the_grid(name):
    """algorithms.md 3.4: on every grid config the best mixture of orders equals T_BW*."""
    topo = preset(name)
    mix = order_mix(topo, "allreduce")
    assert sum(mix.fractions.values()) == pytest.approx(1.0)
    assert mix.time_per_byte * (1 << 30) == pytest.approx(bandwidth_bound_us(topo, "allreduce", 1 << 30)[0], rel=1e-6)


def test_c1_mix_sends_about_7_percent_the_other_way():
    mix = order_mix(c1p(4), "allreduce")
    assert mix.fractions[(1, 0)] == pytest.approx(0.068, abs=0.002)


@given(topologies(max_ranks=256))
def test_every_order_sends_the_same_bytes_in_total(topo):
    """The telescoping identity: sum over stages of (n-1)/n / prod(earlier) = 1 - 1/N."""
    totals = set()
    for order in itertools.permutations(range(topo.ndims)):
        loads = dimension_loads(topo, "allreduce", order, 1.0)
        bytes_sent = sum(load * d.bandwidth * 1e3 for load, d in zip(loads, topo.dimensions))
        totals.add(round(bytes_sent, 9))
    assert totals == {round(2 * (1 - 1 / topo.nranks), 9)}


@given(topologies(max_ranks=256))
def test_mixing_is_never_worse_than_the_best_single_order(topo):
    mix = order_mix(topo, "allreduce")
    single = min(max(dimension_loads(topo, "allreduce", o)) for o in itertools.permutations(range(topo.ndims)))
    assert mix.time_per_byte <= single * (1 + 1e-9)
    assert mix.time_per_byte * (1 << 30) >= bandwidth_bound_us(topo, "allreduce", 1 << 30)[0] * (1 - 1e-9)


def test_the_chunk_lp_solves_on_the_slowest_links_a_topology_may_have(monkeypatch):
    """1 MB/s and a GiB: stage times of 1e9 us, on which GLOP's tolerances fail unscaled (the
    rescaled LP takes over only then, so every other plan keeps its sizes)."""
    topo = Topology((Dimension(4, "switch", 0.001, 0.0), Dimension(2, "ring", 0.001, 0.0)))
    knobs = Knobs(chunks=24, mix=True, lp_sizes=True, granularity=4)
    unscaled = []
    solve = lp._chunk_lp
    monkeypatch.setattr(lp, "_chunk_lp", lambda *args: unscaled.append(args[4] == 1.0 and solve(*args) is None) or solve(*args))
    plan = build_plan(topo, "allreduce", 1 << 30, 1 << 30, knobs, 1 << 30)
    assert any(unscaled)  # the case this test is about: GLOP fails unscaled here
    assert sum(c.units for c in plan.chunks) == plan.units and min(c.units for c in plan.chunks) >= 1
