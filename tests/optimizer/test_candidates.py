"""The search's candidate lists: what the coarse sweep and the extras offer, and that every
candidate they offer builds a well-formed plan."""

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from hipipe_compiler.bench import load_grid
from hipipe_compiler.optimizer.candidates import (BANDWIDTH_WINDOW, FOLD_WINDOW, LARGE_WINDOW, LL_LANES_WINDOW,
                                                  MAX_CHUNKS, both_way_sweep, chunk_limit, coarse_sweep, extra_sweep,
                                                  folds, protocol_choices, rings)
from hipipe_compiler.optimizer.knobs import build_plan
from hipipe_compiler.schedule import check_plan
from hipipe_compiler.presets import preset

from conftest import COLLECTIVES, REPO, examples, topologies, c1p, per_protocol_torus

MiB = 1 << 20
GRID = load_grid(REPO / "benchmarks" / "grid.yaml")


def candidates(topology, collective: str, nominal: int):
    allreduce, large = collective == "allreduce", nominal >= LARGE_WINDOW
    limit = chunk_limit(topology, nominal)
    return [*coarse_sweep(limit, allreduce, large), *extra_sweep(topology, nominal, limit, allreduce, large),
            *both_way_sweep(topology, nominal, limit)]


@settings(max_examples=examples(40), deadline=None)
@given(topologies(max_ranks=32), st.sampled_from(COLLECTIVES), st.integers(12, 30), st.data())
def test_every_candidate_fits_its_window_and_builds_a_valid_plan(topo, collective, log_size, data):
    """Chunk counts stay within the window's limit, protocols within those the topology
    weighs, one-shot and trees only for all-reduce; and any candidate builds a plan."""
    nominal = 1 << log_size
    offered = candidates(topo, collective, nominal)
    limit = chunk_limit(topo, nominal)
    # the most chunks that each carry ~128 bytes per rank or more (one at least, MAX_CHUNKS at most)
    assert limit == 1 or nominal // (limit * topo.nranks) >= 128
    assert limit == MAX_CHUNKS or nominal // ((limit + 1) * topo.nranks) < 128
    assert all(1 <= k.chunks <= limit for k in offered)
    assert {k.protocol for k in offered} <= set(protocol_choices(topo))
    if collective != "allreduce":
        assert not any(k.oneshot or k.tree for k in offered)
    knobs = data.draw(st.sampled_from(offered))
    check_plan(build_plan(topo, collective, nominal, nominal, knobs))


def test_ll_is_offered_only_where_latencies_differ_by_protocol():
    """On the scalar grid LL only doubles the wire bytes, so no candidate uses it; C6p's
    differ, and LL competes below the bandwidth-bound windows."""
    for size in (64 << 10, MiB, 4 * MiB, 64 * MiB):
        assert not any(k.protocol == "LL" for k in candidates(GRID.topologies["C6"], "allreduce", size))
    assert any(k.protocol == "LL" for k in candidates(GRID.topologies["C6p"], "allreduce", MiB))
    assert not any(k.protocol == "LL" for k in candidates(GRID.topologies["C6p"], "allreduce", BANDWIDTH_WINDOW))


def test_tilted_lane_pipelines_run_under_ll_only_below_their_window():
    """C6p's picks at 1 and 4 MiB (k12, each order on its own lanes, tilted -1, slow dimension
    on three lane groups) are offered there, under LL only below LL_LANES_WINDOW."""
    topo = GRID.topologies["C6p"]
    pick = [k for k in candidates(topo, "allreduce", MiB) if k.label == "k12-mix-ag-l2-r1-lanes-t-1-s3-LL"]
    assert len(pick) == 1
    at_window = candidates(topo, "allreduce", LL_LANES_WINDOW)
    assert replace(pick[0], protocol="LL128") in at_window
    assert pick[0] not in at_window


def test_bandwidth_bound_windows_get_no_extras_where_latencies_are_scalar():
    """From BANDWIDTH_WINDOW on, a scalar topology's search runs the coarse sweep and the
    descent only; a per-protocol one still tries LL128's lane pipelines."""
    for name in ("C1", "C3", "C5", "C6"):
        topo = GRID.topologies[name]
        assert extra_sweep(topo, BANDWIDTH_WINDOW, chunk_limit(topo, BANDWIDTH_WINDOW), True, False) == []
    topo = GRID.topologies["C6p"]
    extras = extra_sweep(topo, BANDWIDTH_WINDOW, chunk_limit(topo, BANDWIDTH_WINDOW), True, False)
    assert extras and {k.protocol for k in extras} == {"LL128"}


def test_folded_one_shot_pipelines_are_offered_where_inner_dimensions_fold_into_a_small_switch():
    """C6p's two-rank ring and eight-rank switch fold into one switch of 16 below FOLD_WINDOW;
    the scalar C6 keeps its grid results, and the pod's 32 folded ranks are too many for
    direct exchange."""
    assert folds(GRID.topologies["C6p"]) and not folds(preset("pod-8x4x8x4")) and not folds(c1p(4))
    folded = [k for k in candidates(GRID.topologies["C6p"], "allreduce", 64 << 10) if k.fold]
    assert folded and all(k.oneshot and k.protocol != "Simple" for k in folded)
    assert not any(k.fold for k in candidates(GRID.topologies["C6p"], "allreduce", FOLD_WINDOW))
    assert not any(k.fold for k in candidates(GRID.topologies["C6"], "allreduce", 64 << 10))
    assert not any(k.fold for k in candidates(GRID.topologies["C6p"], "reducescatter", 64 << 10))


def test_both_way_ring_lane_pipelines_are_offered_where_rings_meet_per_protocol_latencies():
    """Below LARGE_WINDOW, a ring topology with per-protocol latencies also tries LL128 (and
    below BANDWIDTH_WINDOW LL) pipelines with both-way rings, each order on its own lanes and
    fanned out; not from that window on, not without rings (C1p, or C6p whose two-rank ring
    exchanges directly), and not where every protocol pays one latency (C3)."""
    def offered(topo, size):
        return [k for k in candidates(topo, "allreduce", size) if k.bidir and k.fan and k.arrange == "lanes"]

    torus = per_protocol_torus(8, 2)
    assert rings(torus) and not rings(c1p(4)) and not rings(GRID.topologies["C6p"])
    assert {k.protocol for k in offered(torus, MiB)} == {"LL", "LL128"}
    assert {k.protocol for k in offered(torus, BANDWIDTH_WINDOW)} == {"LL128"}
    assert offered(torus, LARGE_WINDOW) == []
    for topo in (c1p(4), GRID.topologies["C6p"], GRID.topologies["C3"]):
        assert offered(topo, MiB) == []
