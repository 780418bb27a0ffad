"""The physical limits of cost-model.md section 4: T_LB, what no schedule on this topology can
beat, and T_LB1 (section 4.1), what no program that runs one protocol can beat, for a
collective of M bytes. Both depend on the topology and M only. Where dimensions reduce in
the switch (section 5), T_LB is the smaller of the GPU-side limit and the in-switch one
(switch_bound.py; docs/limits.md); T_LB1 stays the limit of an MSCCL XML program, which
cannot reduce in the switch.

>>> from hipipe_compiler.topology import Dimension, Topology
>>> topo = Topology((Dimension(8, "switch", 300, link="nvlink"), Dimension(4, "switch", 50, link="network")))
>>> round(lower_bound_us(topo, "allreduce", 1 << 30), 2), round(one_protocol_bound_us(topo, "allreduce", 1 << 20), 2)
(5943.93, 6.19)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .hardware import PROTOCOLS, WIRE_EFFICIENCY
from .switch_bound import in_switch_bandwidth_us
from .topology import Topology

#: Collectives with a bound; the others report none (cost-model.md 3).
BOUNDED = ("allreduce", "reducescatter", "allgather")


@dataclass(frozen=True)
class Bound:
    """T_LB and its parts, in microseconds; `binding_from` is k of the binding suffix S_k and
    `call_us` the cheapest protocol's per-call cost, paid before any byte moves (with the
    cheapest in-switch call cost where `in_switch`: the limit of a program that reduces in
    the switch binds)."""

    bandwidth_us: float
    latency_us: float
    binding_from: int
    call_us: float = 0.0
    in_switch: bool = False

    @property
    def total_us(self) -> float:
        return self.call_us + max(self.bandwidth_us, self.latency_us)


def bandwidth_bound_us(topology: Topology, collective: str, nbytes: float) -> tuple[float, int]:
    """max over suffixes S_k of 2(prod n - 1) M / (N sum B) (halved for RS/AG), and the binding k.

    The ranks sharing coordinates in S_k form super-nodes that can only talk through the
    dimensions of S_k, so that much data must cross links whose total capacity is N sum B.
    """
    factor = 2.0 if collective == "allreduce" else 1.0
    n = topology.nranks
    best, where = 0.0, 0
    for k in range(topology.ndims):
        dims = topology.dimensions[k:]
        supernodes = math.prod(d.size for d in dims)
        capacity = sum(d.bandwidth for d in dims) * 1e3  # bytes per microsecond per rank
        t = factor * (supernodes - 1) * nbytes / (n * capacity)
        if t > best:
            best, where = t, k
    return best, where


def latency_bound_us(topology: Topology, protocol: str | None = None) -> float:
    """The largest, over rank pairs, of the smallest sum of alpha along a legal path, each
    dimension's alpha that of `protocol`, or the smallest over the protocols when None (the
    protocol is the schedule's choice).

    Dimension by dimension from the outermost: a switch hop in dimension d costs alpha_d and
    sets every coordinate up to d at once (the highest differing coordinate decides the
    dimension); a ring hop moves one coordinate by one. So the worst pair costs, with M the
    worst over the dimensions below d, alpha_d * diameter_d + M for a ring, and
    max(alpha_d, min(2 alpha_d, M)) for a switch: a pair that differs in d pays one hop that
    also fixes the lower coordinates, one that does not either fixes them below or leaves d
    and comes back. (tests/test_bounds.py checks this against a shortest-path search.)
    """
    worst = 0.0
    for dim in topology.dimensions:
        alpha = dim.min_alpha if protocol is None else dim.alpha(protocol)
        if dim.kind == "ring":
            worst += dim.diameter * alpha
        else:
            worst = max(alpha, min(2 * alpha, worst))
    return worst


def lower_bound(topology: Topology, collective: str, nbytes: float, in_switch: bool = True) -> Bound | None:
    """T_LB for a collective of nbytes (nccl-tests size), or None without a bound. Where the
    topology can reduce in the switch, a program that does pays an in-switch call cost too,
    so the limit is the smaller of the two; `in_switch=False` gives the GPU-side limit alone
    (what the search measures its GPU-side programs by)."""
    if collective not in BOUNDED:
        return None
    bw, k = bandwidth_bound_us(topology, collective, nbytes)
    latency = latency_bound_us(topology)
    call = min(topology.call_cost(p) for p in PROTOCOLS)
    gpu_side = Bound(bw, latency, k, call)
    if not in_switch or not topology.nvls_dimensions:
        return gpu_side
    nvls_bw, nvls_k = in_switch_bandwidth_us(topology, collective, nbytes)
    nvls_call = min(topology.dimensions[d].nvls.call_latency for d in topology.nvls_dimensions)
    switched = Bound(nvls_bw, latency, nvls_k, call + nvls_call, in_switch=True)
    return switched if switched.total_us < gpu_side.total_us else gpu_side


def lower_bound_us(topology: Topology, collective: str, nbytes: float, in_switch: bool = True) -> float | None:
    """T_LB in microseconds, or None for a collective without a bound."""
    b = lower_bound(topology, collective, nbytes, in_switch)
    return None if b is None else b.total_us


def one_protocol_bound_us(topology: Topology, collective: str, nbytes: float, protocols: tuple[str, ...] = PROTOCOLS
                          ) -> float | None:
    """T_LB1 (cost-model.md 4.1): the smallest, over the protocols a program may run, of that
    protocol's per-call cost plus the larger of the bandwidth bound with its wire bytes and
    the latency bound with its latencies; None for a collective without a bound."""
    if collective not in BOUNDED:
        return None
    bw, _k = bandwidth_bound_us(topology, collective, nbytes)
    return min(topology.call_cost(p) + max(bw / WIRE_EFFICIENCY[p], latency_bound_us(topology, p)) for p in protocols)


def bus_factor(collective: str, nranks: int) -> float:
    """busbw / algbw, the nccl-tests definitions."""
    if collective == "allreduce":
        return 2 * (nranks - 1) / nranks
    if collective in ("reducescatter", "allgather", "alltoall"):
        return (nranks - 1) / nranks
    return 1.0
