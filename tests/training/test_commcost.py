"""Collective costs: the closed form for tests, and the simulator on our own programs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hipipe_compiler.sim import simulate
from hipipe_compiler.presets import preset
from hipipe_compiler.training import AlphaBetaCost, SimulatedCost
from hipipe_compiler.training.commcost import COLLECTIVES, CostCache, cached
from hipipe_compiler.windows import window_of

from conftest import DTYPE_BYTES, call_sizes, examples, c1p


def test_alpha_beta_formulas():
    cost = AlphaBetaCost.hierarchical([(8, 300.0, 1.0), (4, 50.0, 5.0)], launch_us=10.0)
    S = 1 << 30
    rs = 7 * 1.0 + 3 * 5.0 + 10.0 + (7 / 8 / 300e3 + 3 / 4 / 8 / 50e3) * S
    assert cost.time_us("reducescatter", S) == pytest.approx(rs)
    assert cost.time_us("allgather", S) == pytest.approx(rs)
    assert cost.time_us("allreduce", S) == pytest.approx(2 * rs - 10.0)
    assert cost.latency_us("allreduce") == pytest.approx(2 * 22.0 + 10.0)
    assert AlphaBetaCost.ring(1, 10.0, 5.0).time_us("allreduce", S) == 0.0
    assert cost.call_bytes("allreduce", 1001) == 1001


def test_cost_cache_splits_latency_and_work_and_rejects_nonsense():
    cache = cached(AlphaBetaCost.ring(4, 100.0, 2.0))
    latency, work = cache.phases_ms("allreduce", 4_000_000)
    assert latency == pytest.approx(0.012) and latency + work == pytest.approx(0.072)
    assert cached(cache) is cache
    broken = CostCache(AlphaBetaCost({c: -5.0 for c in COLLECTIVES}, {c: float("nan") for c in COLLECTIVES}), {})
    with pytest.raises(ValueError, match="finite time"):
        broken.phases_ms("allgather", 10)


@pytest.fixture(scope="module", params=DTYPE_BYTES, ids=lambda b: f"{b}-byte elements")
def torus_cost(request) -> SimulatedCost:
    return SimulatedCost(preset("torus-4x4"), algorithm="hierarchical", dtype_bytes=request.param)


@settings(max_examples=examples(30), deadline=None)
@given(st.sampled_from(COLLECTIVES), call_sizes())
def test_calls_are_padded_to_a_size_their_program_serves(torus_cost, collective, nbytes):
    """The runtime selects a program only for sizes in its window that are multiples of
    nchunksperloop elements: a padded call must be one, and the least such above nbytes."""
    size = torus_cost.call_bytes(collective, nbytes)
    cw = torus_cost.compiled(collective, size)
    multiple = cw.program.nchunksperloop * torus_cost.options.dtype_bytes
    assert size >= nbytes and size % multiple == 0
    assert cw.window == window_of(size) and cw.window.min_bytes <= size <= cw.window.max_bytes
    if window_of(nbytes) == cw.window:
        assert size - nbytes < multiple
    else:  # padding carried the call into a later window, with its own program
        assert size > window_of(nbytes).max_bytes
    assert torus_cost.call_bytes(collective, size) == size


def test_time_is_the_simulator_on_the_compiled_program(torus_cost):
    size = torus_cost.call_bytes("allreduce", 3 << 20)
    cw = torus_cost.compiled("allreduce", size)
    full = simulate(cw.program, torus_cost.topology, size).time_us
    assert torus_cost.time_us("allreduce", 3 << 20) == pytest.approx(full, rel=1e-9)
    assert cw.program.collective == "allreduce" and cw.program.ngpus == 16
    # larger calls never take less time, and start-up is the smallest call
    times = [torus_cost.time_us("reducescatter", 1 << k) for k in range(10, 28, 3)]
    assert times == sorted(times)
    assert 0 < torus_cost.latency_us("reducescatter") <= times[0]


def test_each_window_is_compiled_once():
    seen = []
    cost = SimulatedCost(c1p(2), algorithm="hierarchical", progress=lambda c, w: seen.append((c, w)))
    for nbytes in (5000, 6000, 7000, 5000, 1 << 20):
        cost.time_us("allgather", nbytes)
    assert len(seen) == len(set(seen)) == len(cost.programs())
    assert {w for _, w in seen} >= {window_of(cost.call_bytes("allgather", 5000)), window_of(1 << 20)}


def test_hipipe_programs_are_never_slower_than_hierarchical():
    topo = c1p(2)
    ours, base = SimulatedCost(topo), SimulatedCost(topo, algorithm="hierarchical")
    for nbytes in (64 << 10, 4 << 20):
        assert ours.time_us("allreduce", nbytes) <= base.time_us("allreduce", nbytes) * 1.001
