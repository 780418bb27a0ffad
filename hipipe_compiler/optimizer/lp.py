"""The two linear programs of HiPIPE, solved with OR-Tools (GLOP).

* `order_mix`: which fraction of the data takes which dimension order, so that the load on
  every dimension is balanced (algorithms.md 3.4). A single order cannot beat its own
  bottleneck dimension; a mixture reaches the physical limit on the benchmark configs.
* `chunk_sizes`: for a fixed number of chunks and a fixed order of operations on every
  resource, the chunk sizes that minimise the makespan, i.e. the pipeline bubbles
  (algorithms.md 4.2). Stage j of chunk k costs a_j + b_j x_k.

>>> from hipipe_compiler.topology import Dimension, Topology
>>> c1 = Topology((Dimension(8, "switch", 300, link="nvlink"), Dimension(4, "switch", 50, link="network")))
>>> mix = order_mix(c1, "allreduce")
>>> sorted((o, round(f, 3)) for o, f in mix.fractions.items())
[((0, 1), 0.932), ((1, 0), 0.068)]
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

from ortools.linear_solver import pywraplp

from ..topology import Topology


def _solver() -> pywraplp.Solver:
    solver = pywraplp.Solver.CreateSolver("GLOP")
    if solver is None:  # pragma: no cover - GLOP ships with every OR-Tools wheel
        raise RuntimeError("OR-Tools GLOP is not available")
    return solver


def dimension_loads(topology: Topology, collective: str, order: Sequence[int], nbytes: float = 1.0) -> list[float]:
    """Microseconds of bandwidth work each dimension does per rank when all data takes `order`."""
    factor = 2.0 if collective == "allreduce" else 1.0
    loads = [0.0] * topology.ndims
    data = float(nbytes)
    for d in order:
        dim = topology.dimensions[d]
        loads[d] = factor * (dim.size - 1) / dim.size * data / (dim.bandwidth * 1e3)
        data /= dim.size
    return loads


@dataclass(frozen=True)
class OrderMix:
    """Fractions of the data per dimension order, and the balanced time per byte they give."""

    fractions: dict[tuple[int, ...], float]
    time_per_byte: float


def order_mix(topology: Topology, collective: str, orders: Sequence[tuple[int, ...]] | None = None,
              min_fraction: float = 1e-3) -> OrderMix:
    """min T s.t. sum f = 1, f >= 0, and every dimension's mixed load <= T.

    Fractions below `min_fraction` are dropped and the rest rescaled: a sliver of data in its
    own order costs more in latency than it saves in balance.
    """
    orders = list(orders) if orders is not None else list(itertools.permutations(range(topology.ndims)))
    loads = {o: dimension_loads(topology, collective, o) for o in orders}
    solver = _solver()
    f = {o: solver.NumVar(0.0, 1.0, f"f{i}") for i, o in enumerate(orders)}
    t = solver.NumVar(0.0, solver.infinity(), "T")
    solver.Add(sum(f.values()) == 1.0)
    for d in range(topology.ndims):
        solver.Add(sum(f[o] * loads[o][d] for o in orders) <= t)
    solver.Minimize(t)
    if solver.Solve() != pywraplp.Solver.OPTIMAL:  # pragma: no cover - always feasible
        raise RuntimeError("the order-mixing LP has no optimum")
    raw = {o: f[o].solution_value() for o in orders}
    # at least the largest order survives, however small every fraction is
    kept = {o: v for o, v in raw.items() if v >= min_fraction} or {max(raw, key=raw.__getitem__): 1.0}
    total = sum(kept.values())
    fractions = {o: v / total for o, v in kept.items()}
    per_byte = max(sum(fractions[o] * loads[o][d] for o in fractions) for d in range(topology.ndims))
    return OrderMix(fractions, per_byte)


@dataclass(frozen=True)
class StageCost:
    """One stage a chunk passes through: the resource it occupies and its affine cost."""

    resource: object
    a: float  # microseconds per chunk, whatever its size (latency)
    b: float  # microseconds per byte of the chunk's original size


def chunk_sizes(stages: Sequence[Sequence[StageCost]], sequence: dict[object, list[tuple[int, int]]],
                total: float, min_size: float = 0.0) -> tuple[list[float], float]:
    """Chunk sizes x_k (summing to `total`) that minimise the makespan C of the LP:

        S[k][j+1] >= S[k][j] + a + b x_k          (a chunk flows through its stages)
        S[k'][j'] >= S[k][j] + a + b x_k          (consecutive operations on one resource)
        C >= S[k][J] + a + b x_k

    `stages[k]` lists chunk k's stages; `sequence[r]` the (chunk, stage) order on resource r.
    Returns the sizes and the LP's makespan.
    """
    solved = _chunk_lp(stages, sequence, total, min_size, 1.0, 1.0)
    if solved is None:
        # GLOP's tolerances fail on extreme links (1 MB/s, a GiB: times of 1e9 us); in units
        # of the whole buffer and of the longest stage the coefficients stay near 1. Only then:
        # the LP has many optima, and a rescaled one may pick another
        scale = max((max(st.a, st.b * total) for row in stages for st in row), default=1.0) or 1.0
        solved = _chunk_lp(stages, sequence, total, min_size, scale, total or 1.0)
    if solved is None:  # pragma: no cover - always feasible
        raise RuntimeError("the chunk-size LP has no optimum")
    return solved


def _chunk_lp(stages: Sequence[Sequence[StageCost]], sequence: dict[object, list[tuple[int, int]]], total: float,
              min_size: float, scale: float, unit: float) -> tuple[list[float], float] | None:
    """chunk_sizes' LP with times in units of `scale` us and sizes in units of `unit` bytes."""
    solver = _solver()
    nk = len(stages)
    x = [solver.NumVar(min_size / unit, solver.infinity(), f"x{k}") for k in range(nk)]
    start = [[solver.NumVar(0.0, solver.infinity(), f"s{k}_{j}") for j in range(len(stages[k]))] for k in range(nk)]
    makespan = solver.NumVar(0.0, solver.infinity(), "C")
    solver.Add(sum(x) == total / unit)

    def end(k: int, j: int):
        st = stages[k][j]
        return start[k][j] + st.a / scale + st.b * unit / scale * x[k]

    for k in range(nk):
        for j in range(len(stages[k]) - 1):
            solver.Add(start[k][j + 1] >= end(k, j))
        solver.Add(makespan >= end(k, len(stages[k]) - 1))
    for ops in sequence.values():
        for (k, j), (k2, j2) in zip(ops, ops[1:]):
            solver.Add(start[k2][j2] >= end(k, j))
    solver.Minimize(makespan)
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return None
    return [v.solution_value() * unit for v in x], makespan.solution_value() * scale


def geometric_sizes(b1: float, b2: float, k: int, total: float = 1.0) -> list[float]:
    """Closed form for two stages on separate resources with alpha = 0 (algorithms.md 4.3):
    sizes grow by r = b2 / b1, x_1 = total (r - 1) / (r^k - 1)."""
    r = b2 / b1
    if math.isclose(r, 1.0):
        return [total / k] * k
    first = total * (r - 1) / (r ** k - 1)
    return [first * r ** i for i in range(k)]
