"""The bandwidth part of the physical limit when some dimensions reduce in the switch
(cost-model.md section 5; the proof is in docs/limits.md).

For every suffix S_k of dimensions, the ranks that share their coordinates in S_k form P_k
super-nodes. Per byte of the message, an all-reduce needs P_k - 1 merges of partial sums
across super-nodes (the in-tree into the first super-node to hold the whole sum) and P_k - 1
deliveries of the sum after that (one into every other super-node). Over a dimension d of
S_k, a byte sent point to point is at most one merge or one delivery, and costs one byte out
of a port and one in; a switch reduce of a byte is at most n_d - 1 merges and costs n_d bytes
out and one in, at the in-switch efficiency e_d; a multicast store is at most n_d - 1
deliveries for one byte out and n_d in. A linear program finds the cheapest mix, with each
dimension's ports, summed over the ranks, as the capacity. Without in-switch reduction it
gives cost-model.md section 4's T_bw,k exactly.

>>> from hipipe_compiler.topology import Dimension, Topology
>>> node = Topology((Dimension(8, "switch", 370.8, link="nvlink", nvls={"efficiency": 0.85}),))
>>> t, k = in_switch_bandwidth_us(node, "allreduce", 1 << 30)  # (1 + 1/8) M / (e B)
>>> round(t, 1), k, round(9 / 8 * (1 << 30) / (0.85 * 370.8e3), 1)
(3832.6, 0, 3832.6)
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from .topology import Topology

#: Per byte of the message, the merges and the deliveries each collective needs per extra
#: super-node: an all-reduce both, a reduce-scatter merges only, an all-gather deliveries only.
NEEDS = {"allreduce": (1, 1), "reducescatter": (1, 0), "allgather": (0, 1)}

#: One dimension as the program sees it: size, GB/s and in-switch efficiency (0: none).
_Dim = tuple[int, float, float]


def in_switch_bandwidth_us(topology: Topology, collective: str, nbytes: float, wire: float = 1.0
                           ) -> tuple[float, int]:
    """The largest, over suffixes S_k, of the least time the merges and deliveries of a
    collective of nbytes take on S_k's ports, and the binding k. `wire` is the wire bytes
    per data byte of a point-to-point message (2 under LL); in-switch messages move data
    bytes only."""
    dims = tuple((d.size, float(d.bandwidth), d.nvls.efficiency if d.nvls else 0.0) for d in topology.dimensions)
    per_byte, k = _per_byte_us(dims, collective, wire)
    return per_byte * nbytes, k


@lru_cache(maxsize=256)
def _per_byte_us(dims: tuple[_Dim, ...], collective: str, wire: float) -> tuple[float, int]:
    n = math.prod(size for size, _b, _e in dims)
    best, where = 0.0, 0
    for k in range(len(dims)):
        t = _suffix_per_byte_us(dims[k:], n, *NEEDS[collective], wire)
        if t > best:
            best, where = t, k
    return best, where


def _suffix_per_byte_us(dims: tuple[_Dim, ...], nranks: int, merges: int, deliveries: int, wire: float) -> float:
    """The linear program of one suffix, per byte of the message. Variables, per dimension d:
    bytes sent point to point as merges and as deliveries, switch-reduced and multicast bytes
    (the last two only with in-switch reduction), then the time T. Each dimension's ports,
    out and in, carry at most T times their capacity over all ranks."""
    supernodes = math.prod(size for size, _b, _e in dims)
    fastest = max(bandwidth for _s, bandwidth, _e in dims)
    per_dim = 4
    width = per_dim * len(dims) + 1
    rows, bounds_rhs = [], []
    merge_row, deliver_row = np.zeros(width), np.zeros(width)
    for i, (size, bandwidth, efficiency) in enumerate(dims):
        m, g, r, s = (per_dim * i + j for j in range(per_dim))
        merge_row[m], deliver_row[g] = -1.0, -1.0
        if efficiency:
            merge_row[r], deliver_row[s] = -(size - 1.0), -(size - 1.0)
        capacity = bandwidth / fastest  # scaled so that the solver's numbers are near 1
        for outward in (True, False):
            row = np.zeros(width)
            row[m] = row[g] = wire
            if efficiency:
                row[r] = (size if outward else 1.0) / efficiency
                row[s] = (1.0 if outward else size) / efficiency
            row[-1] = -capacity
            rows.append(row)
            bounds_rhs.append(0.0)
    rows += [merge_row, deliver_row]
    bounds_rhs += [-(supernodes - 1.0) * merges, -(supernodes - 1.0) * deliveries]
    from scipy.optimize import linprog  # half a second to import: only limits with in-switch reduction need it

    cost = np.zeros(width)
    cost[-1] = 1.0
    fixed = [(0, 0) if not dims[j // per_dim][2] and j % per_dim >= 2 else (0, None) for j in range(width - 1)]
    result = linprog(cost, A_ub=np.array(rows), b_ub=np.array(bounds_rhs), bounds=[*fixed, (0, None)], method="highs")
    if not result.success:  # pragma: no cover - the program is always feasible and bounded
        raise ArithmeticError(f"the in-switch limit's linear program failed: {result.message}")
    return float(result.x[-1]) / (nranks * fastest * 1e3)  # bytes per microsecond, all ranks' ports
