"""The HiPIPE planner: plan shapes, the search, and the performance it must reach."""

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from hipipe_compiler.bench import BASELINES, load_grid
from hipipe_compiler.bounds import lower_bound_us
from hipipe_compiler.compiler import CompileOptions, compile_range
from hipipe_compiler.errors import PlanError
from hipipe_compiler.lower import lower, same_schedule
from hipipe_compiler.msccl.program import PROTOCOLS
from hipipe_compiler.msccl.verify import verify
from hipipe_compiler.optimizer import Knobs, Search, build_plan, optimize_window
from hipipe_compiler.optimizer.knobs import SPREAD_STRIDE
from hipipe_compiler.optimizer import search as search_module
from hipipe_compiler.optimizer.judge import program_key
from hipipe_compiler.optimizer.lp import order_mix
from hipipe_compiler.schedule import check_plan, ring_plan
from hipipe_compiler.schedule.fold import fold_depth
from hipipe_compiler.schedule.plan import plan_shape
from hipipe_compiler.sim import SimulationError, simulate, simulate_exact
from hipipe_compiler.sim.simulate import probe_ranks, symmetric
from hipipe_compiler.hardware import NETWORK, NVLINK
from hipipe_compiler.topology import Dimension, Topology
from hipipe_compiler.presets import preset

from conftest import examples, topologies, c1p, per_protocol_torus

MiB = 1 << 20


def test_build_plan_mixes_orders_in_the_lp_proportions():
    topo = c1p(4)
    plan = build_plan(topo, "allreduce", 1 << 30, 1 << 30, Knobs(16, mix=True, granularity=16))
    share = sum(c.units for c in plan.chunks if c.order == (1, 0)) / plan.units
    assert share == pytest.approx(order_mix(topo, "allreduce").fractions[(1, 0)], abs=0.01)


def test_ramps_shrink_the_first_and_last_chunks():
    plan = build_plan(c1p(4), "allreduce", 1 << 30, 1 << 30, Knobs(12, granularity=8, ramp=2))
    units = [c.units for c in plan.chunks]
    assert units[0] < units[len(units) // 2] and units[-1] < units[len(units) // 2]
    total = sum(units)
    assert total >= 12 * 8 and total & (total - 1) == 0  # a power of two: nchunksperloop divides the call sizes


def test_lanes_fan_and_all_gather_lanes():
    topo = c1p(4)
    ag = build_plan(topo, "allreduce", MiB, MiB, Knobs(2, ag_lane=True))
    assert [c.stage_lanes for c in ag.chunks] == [(0, 0, 1), (0, 0, 1)]
    fan = build_plan(topo, "allreduce", MiB, MiB, Knobs(3, fan=True))
    assert [c.stage_lanes for c in fan.chunks] == [(0, 1, 1), (0, 2, 2), (0, 3, 3)]
    torus = build_plan(preset("torus-4x4"), "allreduce", MiB, MiB, Knobs(2))
    assert {c.direction for c in torus.chunks} == {1, -1}  # both directed links of every ring


def test_spread_puts_the_slowest_dimension_of_successive_chunks_on_lane_groups():
    topo = preset("torus-4x4x4")  # z has the largest latency
    plan = build_plan(topo, "allreduce", 64 * MiB, 64 * MiB, Knobs(6, spread=3))
    for k, chunk in enumerate(plan.chunks):
        group = k // 2 % 3  # both ring directions of a chunk share its group
        for j, stage in enumerate(plan.stages(k)):
            assert chunk.lane_of(j) // SPREAD_STRIDE == (group if stage.axis == 2 else 0)
    # z's messages of successive chunks go out side by side: a faster 64 MiB all-reduce
    plain = build_plan(topo, "allreduce", 64 * MiB, 64 * MiB, Knobs(48, mix=True, ag_lane=True, granularity=2, ramp=1,
                                                                      arrange="lanes"))
    spread = build_plan(topo, "allreduce", 64 * MiB, 64 * MiB, Knobs(48, mix=True, ag_lane=True, granularity=2,
                                                                       ramp=1, arrange="lanes", spread=3))
    times = [simulate(lower(p, ranks=[0]), topo, 64 * MiB, quotient=True).time_us for p in (plain, spread)]
    assert times[1] < 0.97 * times[0]


KNOBS = st.builds(
    Knobs, chunks=st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]), mix=st.booleans(), ag_lane=st.booleans(),
    lp_sizes=st.booleans(), granularity=st.sampled_from([1, 2, 4, 8, 16]), protocol=st.sampled_from(PROTOCOLS),
    lanes=st.integers(1, 3), ramp=st.integers(0, 3), oneshot=st.booleans(),
    arrange=st.sampled_from(["spread", "front", "back", "lanes"]), fan=st.booleans(), split=st.booleans(),
    tilt=st.integers(-7, 7), bidir=st.booleans(), spread=st.integers(1, 3), fold=st.sampled_from((False, False, True)))
#: Size windows the search plans for: small and latency bound, a multiple of slices, large.
WINDOWS = [(64 << 10, (128 << 10) - 1), (1 << 20, (4 << 20) - 1), (64 << 20, (256 << 20) - 1)]


MIXED_3X2X3 = Topology((Dimension(3, "ring", 100.0, 0.5, "x"), Dimension(2, "switch", 50.0, 1.0, "y"),
                        Dimension(3, "ring", 25.0, 2.0, "z")), name="mixed-3x2x3")


@settings(max_examples=examples(40), deadline=None)
@given(topologies(max_ranks=16), st.sampled_from(["allreduce", "reducescatter", "allgather"]), KNOBS,
       st.sampled_from(WINDOWS))
@example(MIXED_3X2X3, "reducescatter", Knobs(1, mix=True), WINDOWS[1])  # every order's share below one chunk's
def test_every_plan_the_search_can_build_verifies_and_never_beats_the_bound(topo, coll, knobs, window):
    """Any knob setting the search may reach gives a plan; where it fits the runtime, its
    program for every rank verifies, and no simulated call is faster than the physical limit.
    A folded plan runs on the real network's links, and where the search times it by rank 0
    alone (its probe ranks generate rank 0's schedule), every rank runs rank 0's shifted."""
    lo, hi = window
    if knobs.fold and (coll != "allreduce" or not fold_depth(topo)):
        with pytest.raises(PlanError, match="only an all-reduce folds|no inner dimensions can fold"):
            build_plan(topo, coll, lo, hi, knobs)
        return
    plan = build_plan(topo, coll, lo, hi, knobs)
    check_plan(plan)
    assert all(c.units >= 1 for c in plan.chunks)
    try:
        program = lower(plan)
    except PlanError:
        return  # too large for the runtime: the search skips it
    report = verify(program)
    assert report.ok, (knobs, report.violations[:3])
    if plan.fold and same_schedule(plan, probe_ranks(topo)):
        assert symmetric(program, topo), knobs
    for size in (lo, hi):
        result = simulate(program, topo, size)
        assert result.time_us >= result.lower_bound_us * (1 - 1e-9), (knobs, size, result.time_us, result.lower_bound_us)


def test_both_way_rings_replace_rings_only_and_cut_small_message_time():
    topo = preset("ring-fc-switch-2x8x4")  # a ring of 2 and two switch dimensions: nothing to change
    assert build_plan(topo, "allreduce", MiB, MiB, Knobs(2, bidir=True)).algorithms == ("direct", "direct", "direct")
    torus = preset("torus-4x4x4")
    plain, both = (build_plan(torus, "allreduce", MiB, MiB, Knobs(4, fan=True, bidir=b)) for b in (False, True))
    assert both.algorithms == ("bidir",) * 3
    assert verify(lower(both)).ok
    times = [simulate_exact(lower(p), torus, MiB).time_us for p in (plain, both)]
    assert times[1] < 0.9 * times[0]  # two latencies per ring pass instead of three


@settings(max_examples=examples(12))
@given(topologies(max_ranks=16), st.sampled_from(["allreduce", "reducescatter", "allgather"]),
       st.sampled_from([64 << 10, MiB, 64 * MiB]))
def test_hipipe_is_never_slower_than_any_baseline(topo, coll, size):
    """Judged by the full simulator on the fully lowered, verified program."""
    choice = optimize_window(Search(topo, coll), size, size, budget=20)
    program = lower(choice.plan)
    assert verify(program).ok
    mine = simulate(program, topo, size).time_us
    for name, build in BASELINES.items():
        try:
            base = simulate(lower(build(topo, coll, size, "Simple")), topo, size).time_us
        except (PlanError, SimulationError):
            continue  # NCCL's tree runs all-reduces only, over links a torus lacks
        assert mine <= base * (1 + 1e-9), (name, mine, base)


# The targets of the HiPIPE issue on the scalar grid (benchmarks/grid.yaml), measured by the
# simulator on programs for exactly that size.
TARGETS = [
    ("C1", 1 << 30, 0.97), ("C1", 256 * MiB, 0.95), ("C1", 64 * MiB, 0.95), ("C1", MiB, 0.35),
    ("C3", 1 << 30, 0.97), ("C3", 256 * MiB, 0.95), ("C3", 64 * MiB, 0.95), ("C3", MiB, 0.35),
    ("C6", 1 << 30, 0.97), ("C6", 256 * MiB, 0.95), ("C6", 64 * MiB, 0.95), ("C6", MiB, 0.35),
    ("C5", 1 << 30, 0.97), ("C5", 256 * MiB, 0.95), ("C5", 64 * MiB, 0.95), ("C5", MiB, 0.35),
]
GRID = load_grid(Path(__file__).resolve().parents[2] / "benchmarks" / "grid.yaml")


@pytest.mark.parametrize("name,size,target", TARGETS, ids=lambda v: str(v))
def test_utilisation_targets(name, size, target):
    topo = GRID.topologies[name]
    choice = optimize_window(Search(topo, "allreduce"), size, size)
    time = simulate_exact(lower(choice.plan), topo, size).time_us  # every rank, unless all run the same schedule
    assert lower_bound_us(topo, "allreduce", size) / time >= target


def test_a_directory_of_windows_tiles_the_range_and_every_program_verifies():
    windows = compile_range(c1p(2), CompileOptions(), 1 << 10, 256 * MiB)
    assert windows[0].window.min_bytes == 1 << 10 and windows[-1].window.max_bytes == 256 * MiB
    for a, b in zip(windows, windows[1:]):
        assert b.window.min_bytes == a.window.max_bytes + 1
    assert all(w.report.ok for w in windows)
    assert all(w.details["utilisation"] > 0 for w in windows)
    assert len({w.details["choice"] for w in windows}) > 1  # the plan changes with the size


def test_the_protocol_is_a_real_decision():
    """On C1p (NCCL's per-protocol latencies) a 64 KiB call pays latencies and takes LL, a
    256 MiB call pays bandwidth and takes Simple; on C1, where every protocol pays the same
    alpha, LL would only double the wire bytes and is never tried."""
    search = Search(GRID.topologies["C1p"], "allreduce")
    small, large = optimize_window(search, 64 << 10, 64 << 10), optimize_window(search, 256 * MiB, 256 * MiB)
    assert small.plan.protocol == "LL" and large.plan.protocol == "Simple"
    assert verify(lower(small.plan)).ok
    c1 = Search(GRID.topologies["C1"], "allreduce")
    assert optimize_window(c1, 64 << 10, 64 << 10).plan.protocol != "LL"


# The protocol targets (C1p and C6p, issue 14) that the search reaches.
PROTOCOL_TARGETS = [("C1p", 64 << 10, 0.45), ("C1p", 4 * MiB, 0.60), ("C1p", 16 * MiB, 0.85), ("C1p", 64 * MiB, 0.95),
                    ("C6p", 64 << 10, 0.45), ("C6p", 4 * MiB, 0.60), ("C6p", 256 * MiB, 0.95)]


@pytest.mark.parametrize("name,size,target", PROTOCOL_TARGETS, ids=lambda v: str(v))
def test_protocol_aware_utilisation_targets(name, size, target):
    topo = GRID.topologies[name]
    choice = optimize_window(Search(topo, "allreduce"), size, size)
    time = simulate_exact(lower(choice.plan), topo, size).time_us
    assert lower_bound_us(topo, "allreduce", size) / time >= target


def test_c6p_at_16mib_takes_an_ll128_pipeline_near_u_0_8():
    """Simple pays 14 us per network message on C6p, so LL128 pipelines win at 16 MiB; with each
    dimension order on lanes of its own they reach U 0.79 (the search found 0.70 without them)."""
    topo, size = GRID.topologies["C6p"], 16 * MiB
    choice = optimize_window(Search(topo, "allreduce"), size, size)
    time = simulate_exact(lower(choice.plan), topo, size).time_us
    assert choice.plan.protocol == "LL128" and lower_bound_us(topo, "allreduce", size) / time >= 0.78


def test_latency_bound_windows_give_each_order_lanes_of_its_own():
    """Where latency counts, pipelines whose dimension orders run on lanes of their own overlap
    every message's latency. C6p 1 MiB: U 0.26 with orders on shared lanes; 0.31 with every
    order's and every chunk's later stages on lanes of their own (fan); 0.329 with two lanes
    per order, the network's messages over three lane groups and the order mix tilted by a
    unit. The descent reaches neither from the sweep, where mixing orders on shared lanes
    loses first."""
    topo, size = GRID.topologies["C6p"], MiB
    choice = optimize_window(Search(topo, "allreduce"), size, size)
    time = simulate_exact(lower(choice.plan), topo, size).time_us
    assert choice.knobs is not None and choice.knobs.mix and choice.knobs.arrange == "lanes"
    assert lower_bound_us(topo, "allreduce", size) / time >= 0.325


@pytest.mark.parametrize("name,floor", [("C6p", 0.29), ("C3", 0.47)], ids=str)
def test_small_windows_try_ramped_one_shot_pipelines_on_two_lanes(name, floor):
    """At 256 KiB a one-shot pipeline on two lanes with halved end chunks wins, though each of
    those knobs alone loses: C6p U 0.250 -> 0.294, C3 0.38 -> 0.476."""
    topo, size = GRID.topologies[name], 256 << 10
    choice = optimize_window(Search(topo, "allreduce"), size, size)
    time = simulate_exact(lower(choice.plan), topo, size).time_us
    assert choice.knobs is not None and choice.knobs.oneshot and choice.knobs.ramp and choice.knobs.lanes == 2
    assert lower_bound_us(topo, "allreduce", size) / time >= floor


@pytest.mark.parametrize("name,lanes,fold,floor", [("C6p", 2, True, 0.46), ("C1p", 3, False, 0.52)], ids=str)
def test_64kib_windows_take_one_shot_pipelines_on_lanes(name, lanes, fold, floor):
    """At 64 KiB one-shot pipelines on lanes with halved end chunks win. C1p: 5 chunks on
    three lanes, U 0.485 -> 0.533 (on 64 ranks 5 chunks carry 205 bytes per rank each, under
    the 256 the search once took as the least). C6p took the same for U 0.378 -> 0.419; with
    its ring and switch folded into one switch, 3 chunks on two lanes reach 0.460."""
    topo, size = GRID.topologies[name], 64 << 10
    choice = optimize_window(Search(topo, "allreduce"), size, size)
    time = simulate_exact(lower(choice.plan), topo, size).time_us
    assert choice.knobs is not None and choice.knobs.oneshot and choice.knobs.ramp
    assert (choice.knobs.lanes, choice.knobs.fold) == (lanes, fold)
    assert lower_bound_us(topo, "allreduce", size) / time >= floor


@pytest.mark.parametrize("shape,size,floor", [((8, 2), MiB, 0.31), ((4, 4), 4 * MiB, 0.64)], ids=str)
def test_rings_with_per_protocol_latencies_take_both_way_lane_pipelines(shape, size, floor):
    """On a torus with NCCL's per-protocol latencies, both-way rings halve each ring stage's
    latencies, and fanned-out lanes keep enough messages in flight to cover the rest; the
    descent never combined them. 8x2 at 1 MiB: U 0.237 -> 0.319; 4x4 at 4 MiB: 0.546 -> 0.655."""
    topo = per_protocol_torus(*shape)
    choice = optimize_window(Search(topo, "allreduce"), size, size)
    time = simulate_exact(lower(choice.plan), topo, size).time_us
    assert choice.knobs is not None and choice.knobs.bidir and choice.knobs.fan
    assert lower_bound_us(topo, "allreduce", size) / time >= floor


@pytest.mark.parametrize("size,gain", [(64 << 10, 0.0), (MiB, 0.10)], ids=str)
def test_both_way_lane_pipelines_seed_a_descent_of_their_own(monkeypatch, size, gain):
    """An 8-GPU ring per node over a network switch: the both-way ring lane pipelines win 1 MiB
    by 14 %; at 64 KiB they lose, and since they seed a descent of their own instead of taking
    the extras' seeds, the one-shot pick the extras' descent finds stays (taking those seeds
    made it 5.9 % slower on a zoo machine of this shape)."""
    topo = Topology((Dimension(8, "ring", 100.0, NVLINK, "link"), Dimension(2, "switch", 50.0, NETWORK, "net")), name="r")

    def picked() -> float:
        choice = optimize_window(Search(topo, "allreduce"), size, size)
        return simulate_exact(lower(choice.plan), topo, size).time_us

    with_them = picked()
    monkeypatch.setattr(search_module, "both_way_sweep", lambda *args: [])
    assert with_them <= picked() * (1 - gain) + 1e-9


def test_the_other_protocols_seeds_descend_on_a_budget_of_their_own(monkeypatch):
    """On C1p at 1 MiB the sweep spends the descent's budget; the best seeds of the other
    protocols still descend (they once shared what was left: nothing)."""
    original, starts = search_module._knob_neighbours, []

    def neighbours(knobs, *args, **kwargs):
        starts.append(knobs)
        return original(knobs, *args, **kwargs)
    monkeypatch.setattr(search_module, "_knob_neighbours", neighbours)
    optimize_window(Search(GRID.topologies["C1p"], "allreduce"), MiB, MiB)
    assert any(k.protocol != "Simple" for k in starts)


def test_the_finalists_are_distinct_plans():
    """Knobs that build one plan up to lane numbers (spreads or all-gather lanes under `fan`, a
    mix of one order) must not fill the five finalists judged at a window's ends: on
    dgx-h100-8x4's 256-512 KiB window they once did, and the pick lost to 4 chunks at both ends."""
    search = Search(c1p(4), "allreduce")
    lo, hi = 256 << 10, (512 << 10) - 1
    variants = [build_plan(search.topology, "allreduce", lo, hi, Knobs(6, oneshot=True, fan=True, protocol="LL", **extra))
                for extra in ({}, {"spread": 2}, {"ag_lane": True}, {"mix": True})]
    assert len({plan_shape(p) for p in variants}) == 1 and len(set(variants)) == len(variants)
    choice = optimize_window(search, lo, hi)
    rival = Knobs(4, oneshot=True, fan=True, protocol="LL")
    rival_score = search.judge(build_plan(search.topology, "allreduce", lo, hi, rival), (lo, hi), rival).score
    assert search.judge(choice.plan, (lo, hi)).score <= rival_score


@settings(max_examples=examples(10), deadline=None)
@given(topologies(max_ranks=16), KNOBS, st.sampled_from(WINDOWS))
@example(c1p(2), Knobs(6, oneshot=True, fan=True, protocol="LL"), WINDOWS[0])
def test_plans_of_one_shape_take_the_same_time(topo, knobs, window):
    """plan_shape forgets names and lane numbers only: knobs whose plans share a shape give
    programs that take the same time, so dropping all but one of them loses nothing."""
    assume(not knobs.fold or fold_depth(topo))
    lo, hi = window
    first, *others = [build_plan(topo, "allreduce", lo, hi, k) for k in
                      (knobs, replace(knobs, ag_lane=not knobs.ag_lane), replace(knobs, spread=knobs.spread % 3 + 1))]
    try:
        programs = [lower(p) for p in (first, *(p for p in others if plan_shape(p) == plan_shape(first)))]
    except PlanError:
        return  # too large for the runtime
    for size in (lo, hi):
        times = [simulate(p, topo, size).time_us for p in programs]
        assert max(times) <= min(times) * (1 + 1e-9), (knobs, size, times)


def test_the_descent_refines_chunk_counts_last():
    from hipipe_compiler.optimizer.search import _knob_neighbours
    counts = [k.chunks for k in _knob_neighbours(Knobs(24), True, False) if k.chunks != 24]
    assert counts[:4] == [12, 16, 36, 48] and counts[-2:] == [20, 28]  # coarse steps first, a sixth apart last


def test_the_finest_plan_within_the_tolerance_wins():
    from hipipe_compiler.optimizer.search import GRANULARITY_TOLERANCE, TIE, Evaluation, _granular
    topo = c1p(2)

    def ev(chunks: int, granularity: int, score: float) -> Evaluation:
        knobs = Knobs(chunks, granularity=granularity)
        return Evaluation(knobs, build_plan(topo, "allreduce", MiB, MiB, knobs), (1.0,), score)

    coarse, fine, finer = ev(16, 4, 1.0), ev(8, 1, 1.0 + GRANULARITY_TOLERANCE / 2), ev(2, 1, 1.0 + 2 * GRANULARITY_TOLERANCE)
    assert coarse.plan.nchunksperloop > fine.plan.nchunksperloop > finer.plan.nchunksperloop
    ranked = _granular([coarse, fine, finer])
    assert ranked[0] is fine and set(map(id, ranked)) == {id(coarse), id(fine), id(finer)}  # finer costs too much
    assert _granular([coarse])[0] is coarse
    # a window of one size: only a tie (the same time up to rounding) goes to the finer plan
    tie = ev(8, 1, 1.0 + 1e-13)
    assert _granular([coarse, fine], TIE)[0] is coarse and _granular([coarse, tie], TIE)[0] is tie


@settings(max_examples=examples(10), deadline=None)
@given(topologies(max_ranks=16), st.sampled_from([1, 2, 4]), st.sampled_from([256 << 10, 16 * MiB]))
def test_a_capped_search_never_exceeds_the_cap(topo, per_rank, size):
    cap = topo.nranks * per_rank
    choice = optimize_window(Search(topo, "allreduce", max_nchunksperloop=cap), size, size, budget=20)
    assert choice.plan.nchunksperloop <= cap and all(p.nchunksperloop <= cap for p in choice.alternatives)
    assert verify(lower(choice.plan)).ok


def test_the_cap_trades_speed_for_calls_served():
    """Capped at 8 chunks per rank, dgx-h100-8x4's 16-64 MiB window serves BERT's 27 MiB
    buckets (7,087,872 elements, a multiple of 256 but not 512) and costs some time."""
    topo, lo, hi = c1p(4), 16 * MiB, 64 * MiB - 1
    free = optimize_window(Search(topo, "allreduce"), lo, hi)
    capped = optimize_window(Search(topo, "allreduce", max_nchunksperloop=256), lo, hi)
    assert 7_087_872 % capped.plan.nchunksperloop == 0 < 7_087_872 % free.plan.nchunksperloop
    assert sum(capped.times_us) > sum(free.times_us)


def test_a_window_the_runtime_would_replay_too_often_is_refused_after_a_smaller_one_lowered():
    """The lowering cache shares programs across windows: the replay limit (MSCCL_MAX_ITER) is
    part of its key, so a program lowered for 1 MiB is not reused for 2 TiB (65,536 slices)."""
    topo = preset("torus-4x4")
    search = Search(topo, "allreduce")
    small = ring_plan(topo, "allreduce", 1, "Simple", 1 << 20, 1 << 20, 1 << 20)
    assert search.judge(small, (1 << 20,)) is not None
    assert search.judge(small.with_window(2 << 40, 2 << 40), (2 << 40,)) is None


@pytest.mark.parametrize("topo", [c1p(2), preset("torus-4x4")], ids=["C1p-2", "torus-4x4"])
def test_a_window_above_the_screen_ranks_at_the_screen_and_picks_at_its_own_size(monkeypatch, topo):
    """Above SCREEN_BYTES the candidates are simulated at that size, and only the finalists and
    the baselines at the window's own: the pick's time there is exact, and no baseline beats it."""
    screen, size = 16 * MiB, 256 * MiB
    monkeypatch.setattr(search_module, "SCREEN_BYTES", screen)
    search = Search(topo, "allreduce")
    choice = optimize_window(search, size, size, budget=20)
    at_size = {key for key, s in search.times if s == size}
    at_screen = {key for key, s in search.times if s == screen}
    assert set(search.times) == {(k, s) for k, s in search.times if s in (screen, size)}
    assert len(at_screen) > 2 * len(at_size) and at_size <= at_screen
    baselines = {program_key(plan) for _knobs, plan in search_module._baselines(topo, "allreduce", size, size, size)}
    assert baselines & at_screen and baselines & at_screen <= at_size
    program = lower(choice.plan)
    assert choice.times_us[0] == pytest.approx(simulate(program, topo, size).time_us, rel=1e-9)
    for name, build in BASELINES.items():
        try:
            base = simulate(lower(build(topo, "allreduce", size, "Simple")), topo, size).time_us
        except (PlanError, SimulationError):
            continue
        assert choice.times_us[0] <= base * (1 + 1e-9), name


def test_paired_steps_move_a_unit_of_tilt_with_each_granularity():
    """A tilt counts units and the granularity sets their size, so a mixed pipeline's paired
    steps change both at once; an unmixed one has no tilt to move."""
    k = Knobs(8, mix=True, granularity=4, tilt=1)
    paired = set(search_module._paired_neighbours(k))
    assert {replace(k, granularity=g, tilt=t) for g in (2, 8) for t in (0, 2)} <= paired
    assert search_module._paired_neighbours(Knobs(8, granularity=4)) == []


def test_a_latency_window_tries_every_tilt_in_reach_of_its_best_mixed_pipeline(monkeypatch):
    """Below BANDWIDTH_WINDOW, the best mixed pipeline after the descents is built with every
    tilt up to TILT_REACH units either way (steps of one and three stop short where the time
    is rugged in the tilt)."""
    built: list[Knobs] = []
    real = search_module.build_plan

    def recording(topo, coll, lo, hi, knobs, nominal=None):
        built.append(knobs)
        return real(topo, coll, lo, hi, knobs, nominal)

    monkeypatch.setattr(search_module, "build_plan", recording)
    topo = per_protocol_torus(4, 4)
    choice = optimize_window(Search(topo, "allreduce"), 1 * MiB, 1 * MiB)
    reach = range(-search_module.TILT_REACH, search_module.TILT_REACH + 1)
    lines = {replace(k, tilt=0) for k in built if k.mix and all(replace(k, tilt=t) in built for t in reach)}
    assert lines, "no mixed pipeline was tried at every tilt in reach"
    assert choice.knobs is not None


def test_a_window_of_one_size_reaches_further_than_a_wider_one(monkeypatch):
    """A window of one size toggles `fan` at more chunks and pairs granularity with tilt; a
    wider window, and every window of a directory, keeps the narrower reach."""
    seen: dict[bool, set] = {True: set(), False: set()}
    knob_steps, paired_steps = search_module._knob_neighbours, search_module._paired_neighbours

    def knobs(k, *args):
        seen[one_size].add(("fan", args[-1]))
        return knob_steps(k, *args)

    def paired(k, tilt_pairs=True):
        seen[one_size].add(("tilt", tilt_pairs))
        return paired_steps(k, tilt_pairs)

    monkeypatch.setattr(search_module, "_knob_neighbours", knobs)
    monkeypatch.setattr(search_module, "_paired_neighbours", paired)
    topo = per_protocol_torus(4, 4)
    for one_size, window in ((True, (1 * MiB, 1 * MiB)), (False, (1 * MiB, 2 * MiB - 1))):
        optimize_window(Search(topo, "allreduce"), *window)
    assert seen[True] == {("fan", search_module.FAN_CHUNKS), ("tilt", True)}
    assert ("fan", search_module.RANGED_FAN_CHUNKS) in seen[False]
    assert seen[False] <= {("fan", search_module.RANGED_FAN_CHUNKS), ("tilt", False)}
    # a directory's windows all keep the narrower reach, a last window of one size too
    seen[False].clear()
    search_module.optimize(topo, "allreduce", [(1 * MiB, 2 * MiB - 1), (2 * MiB + 4096, 2 * MiB + 4096)])
    assert ("fan", search_module.RANGED_FAN_CHUNKS) in seen[False]
    assert seen[False] <= {("fan", search_module.RANGED_FAN_CHUNKS), ("tilt", False)}


def _built_in_one_size_window(monkeypatch: pytest.MonkeyPatch, topo: Topology, size: int,
                              reach: search_module.Reach) -> tuple[list[Knobs], float]:
    """The knobs of every plan a window of one size builds, in order, and its pick's time."""
    built: list[Knobs] = []

    def recording(topo, coll, lo, hi, knobs, nominal=None):
        built.append(knobs)
        return build_plan(topo, coll, lo, hi, knobs, nominal)

    with monkeypatch.context() as patch:
        patch.setattr(search_module, "build_plan", recording)
        choice = optimize_window(Search(topo, "allreduce"), size, size, reach=reach)
    return built, choice.times_us[0]


@pytest.mark.parametrize("smaller,larger", [
    ({"budget_scale": 1, "far_share": 0.0}, {"far_share": 0.0}),  # the larger budget
    ({"far_share": 0.0}, {}),  # then the descents far from the others'
])
def test_a_window_of_one_size_spends_its_larger_budget_after_one_budgets_search(monkeypatch, smaller, larger):
    """A window of one size searches as one budget would, then spends the rest of its
    ONE_SIZE_BUDGET_SCALE budgets descending further, then FAR_BUDGET_SHARE of a budget on
    descents from plans no descent came near: each stage builds every plan the stages before it
    build, in the same order, then more, and picks no slower a plan."""
    monkeypatch.setattr(search_module, "BUDGET", 10)
    topo = per_protocol_torus(4, 4)
    few, slow = _built_in_one_size_window(monkeypatch, topo, 1 * MiB, replace(search_module.ONE_SIZE, **smaller))
    more, fast = _built_in_one_size_window(monkeypatch, topo, 1 * MiB, replace(search_module.ONE_SIZE, **larger))
    assert search_module.ONE_SIZE.budget_scale > search_module.RANGED.budget_scale == 1
    assert search_module.ONE_SIZE.far_share > search_module.RANGED.far_share == 0
    assert more[:len(few)] == few and len(more) > len(few)
    assert fast <= slow * (1 + 1e-9)


def test_bandwidth_bound_windows_spend_nothing_on_far_descents(monkeypatch):
    """From BANDWIDTH_WINDOW on, where the times are smooth in the knobs and simulations cost
    more, a window of one size builds the same plans with or without the far descents."""
    monkeypatch.setattr(search_module, "BUDGET", 10)
    monkeypatch.setattr(search_module, "BANDWIDTH_BUDGET", 10)
    topo = per_protocol_torus(4, 4)
    size = search_module.BANDWIDTH_WINDOW
    without = _built_in_one_size_window(monkeypatch, topo, size, replace(search_module.ONE_SIZE, far_share=0.0))
    assert _built_in_one_size_window(monkeypatch, topo, size, search_module.ONE_SIZE) == without
