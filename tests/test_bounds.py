"""The physical limit T_LB (cost-model.md section 4)."""

import heapq
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hipipe_compiler.bounds import bandwidth_bound_us, bus_factor, latency_bound_us, lower_bound, lower_bound_us
from hipipe_compiler.topology import Dimension, Topology
from hipipe_compiler.presets import preset

from conftest import topologies, c1p

GIB = 1 << 30

# T_BW* of algorithms.md 6.2 [computed], microseconds at 1 GiB, and its binding suffix
TABLE = {
    "c1p-8x4": (5943.93, 0),               # C1: all dimensions
    "torus-4x4": (10066.33, 0),            # C3
    "torus-4x4x4": (6039.80, 0),           # C5
    "ring-fc-switch-2x8x4": (6934.58, 1),  # C6: the cut {FC, SW} binds, 15% above the all-dimension bound
}


@pytest.mark.parametrize("name", sorted(TABLE))
def test_bandwidth_bound_matches_the_reference_table(name):
    value, binding = TABLE[name]
    bw, k = bandwidth_bound_us(c1p(4) if name == "c1p-8x4" else preset(name), "allreduce", GIB)
    assert bw == pytest.approx(value, abs=0.01)
    assert k == binding


def test_reference_table_at_other_sizes():
    c1 = c1p(4)
    assert bandwidth_bound_us(c1, "allreduce", 1 << 20)[0] == pytest.approx(5.80, abs=0.01)
    assert bandwidth_bound_us(c1, "allreduce", 256 << 20)[0] == pytest.approx(1485.98, abs=0.01)


def test_latency_bound_follows_the_link_rule():
    # a switch dimension reaches every rank below it in one message: one IB hop from anywhere,
    # at the fastest protocol's alpha (LL: 2.7 us by NCCL's estimate)
    assert latency_bound_us(c1p(4)) == 2.7
    assert latency_bound_us(Topology((Dimension(8, "switch", 300, 1.0), Dimension(4, "switch", 50, 5.0)))) == 5.0
    # rings: alpha times the hops to the farthest neighbour, per dimension
    assert latency_bound_us(preset("torus-4x4")) == pytest.approx(2.0)
    assert latency_bound_us(preset("torus-4x4x4")) == pytest.approx(0.05 * 2 + 0.5 * 2 + 2 * 2)
    assert latency_bound_us(preset("ring-fc-switch-2x8x4")) == pytest.approx(2.0)
    ring8 = Topology((Dimension(8, "ring", 10, 1.5),))
    assert latency_bound_us(ring8) == pytest.approx(6.0)


def shortest_path_latency(topology: Topology) -> float:
    """The same bound by brute force: Dijkstra from rank 0 over every legal message
    (coordinate shifts map the topology onto itself, so rank 0 stands for every rank)."""
    dist = {0: 0.0}
    heap = [(0.0, 0)]
    done: set[int] = set()
    while heap:
        d, u = heapq.heappop(heap)
        if u in done:
            continue
        done.add(u)
        for v in range(topology.nranks):
            alpha = min(topology.link_latency(u, v, p) for p in ("LL", "LL128", "Simple")) if u != v else 0.0
            if v != u and topology.has_link(u, v) and d + alpha < dist.get(v, math.inf):
                dist[v] = d + alpha
                heapq.heappush(heap, (dist[v], v))
    return max(dist.values())


@given(topologies(max_ranks=48))
def test_latency_bound_is_the_longest_shortest_path(topo):
    assert latency_bound_us(topo) == pytest.approx(shortest_path_latency(topo), abs=1e-9)


def test_a_switch_pair_that_agrees_outside_may_leave_and_come_back():
    # ranks that differ only in the slow inner ring are closer through the outer switch twice
    topo = Topology((Dimension(8, "ring", 10, 5.0), Dimension(2, "switch", 10, 1.0)))
    assert latency_bound_us(topo) == pytest.approx(2.0) == pytest.approx(shortest_path_latency(topo))


def test_bound_is_the_larger_part():
    c1 = c1p(4)
    small = lower_bound(c1, "allreduce", 1 << 10)
    assert small.total_us == small.latency_us == 2.7
    assert lower_bound_us(c1, "allreduce", GIB) == pytest.approx(5943.93, abs=0.01)
    assert lower_bound(c1, "alltoall", GIB) is None


@given(topologies(max_ranks=128), st.integers(1, 1 << 32))
def test_reduce_scatter_and_all_gather_need_half_the_bandwidth(topo, nbytes):
    ar = bandwidth_bound_us(topo, "allreduce", nbytes)[0]
    assert bandwidth_bound_us(topo, "reducescatter", nbytes)[0] == pytest.approx(ar / 2)
    assert bandwidth_bound_us(topo, "allgather", nbytes)[0] == pytest.approx(ar / 2)


@given(topologies(max_ranks=128), st.integers(1, 1 << 32))
def test_bound_is_at_least_the_classic_all_dimension_bound(topo, nbytes):
    n = topo.nranks
    classic = 2 * (n - 1) / n * nbytes / (sum(d.bandwidth for d in topo.dimensions) * 1e3)
    assert lower_bound_us(topo, "allreduce", nbytes) >= classic * (1 - 1e-12)


def test_bus_factors():
    assert bus_factor("allreduce", 8) == pytest.approx(1.75)
    assert bus_factor("allgather", 8) == pytest.approx(0.875)
    assert bus_factor("broadcast", 8) == 1.0


def test_the_cheapest_per_call_cost_comes_before_any_byte():
    from dataclasses import replace

    from hipipe_compiler.hardware import Latencies
    c1 = preset("torus-4x4")
    costly = replace(c1, call_latency=Latencies(6.6, 14.0, 8.4))
    assert lower_bound_us(costly, "allreduce", GIB) == pytest.approx(lower_bound_us(c1, "allreduce", GIB) + 6.6)


@given(topologies(max_ranks=64), st.integers(1, 1 << 34), st.sampled_from(["allreduce", "reducescatter", "allgather"]))
def test_the_one_protocol_limit_is_never_below_the_limit(topo, nbytes, coll):
    from hipipe_compiler.bounds import one_protocol_bound_us
    assert one_protocol_bound_us(topo, coll, nbytes) >= lower_bound_us(topo, coll, nbytes) * (1 - 1e-12)


def test_the_one_protocol_limit_pays_ll_twice_or_a_slower_latency():
    from hipipe_compiler.bounds import one_protocol_bound_us
    from hipipe_compiler.hardware import NETWORK, NVLINK
    c1p = Topology((Dimension(8, "switch", 300, NVLINK), Dimension(4, "switch", 50, NETWORK)))
    size = 1 << 20
    bw, _k = bandwidth_bound_us(c1p, "allreduce", size)
    # LL: twice the wire; LL128: 128/120 of it at 4 us; Simple: 14 us
    expected = min(max(2 * bw, 2.7), max(bw * 128 / 120, 4.0), max(bw, 14.0))
    assert one_protocol_bound_us(c1p, "allreduce", size) == pytest.approx(expected)
    assert one_protocol_bound_us(c1p, "alltoall", size) is None
