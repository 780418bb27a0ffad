"""Folding: an all-reduce plan may treat a topology's innermost dimensions as one switch axis,
so that a latency-bound call pays one hop where it would pay one per dimension (C6p at 64 KiB: the
two-rank ring and the eight-rank switch below the network, 6.44 -> 5.87 us).

The fold is legal where every pair of ranks that differ only in the folded dimensions has a
link: dimension 0 folds into dimension 1 where dimension 1 is a switch (a hop there also
sets coordinate 0) and dimension 0 is a switch or a ring of up to three ranks (whose ranks
are all neighbours). Ranks keep their numbers: the folded axis's position is the
mixed-radix number of the folded coordinates, and peers and owners on it are found by adding
and subtracting offsets digit by digit (`fold_add`, `fold_sub`), which translates the real
dimensions, so a rank's schedule is rank 0's shifted wherever the unfolded plan's is
(simulate.symmetric holds on the real topology).

>>> from hipipe_compiler.presets import preset
>>> folded, radices = fold_topology(preset("dgx-h100-8x4"))
>>> [d.size for d in folded.dimensions], radices
([32], (8, 4))
>>> fold_add(9, 15, (8, 4)), fold_add(0, 9, (2, 8))
(16, 9)
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..errors import PlanError
from ..topology import Dimension, Topology

#: The largest ring dimension 0 may be to fold: every other rank is a neighbour.
FOLDABLE_RING = 3


def fold_depth(topology: Topology) -> int:
    """How many dimensions the fold merges: 2 where dimension 0 can fold into dimension 1,
    0 where it cannot. (Folding further switches would be legal too; one level is what the
    search has found to pay.)"""
    dims = topology.dimensions
    if topology.ndims < 2 or dims[1].kind != "switch":
        return 0
    return 2 if dims[0].kind == "switch" or dims[0].size <= FOLDABLE_RING else 0


def check_foldable(collective: str) -> None:
    """Raise PlanError unless `collective` may fold: an all-reduce lays its cells out by chunk,
    the others by owner rank, whose runs the digit-wise order breaks up differently on
    different ranks (so rank 0 would no longer stand for every rank)."""
    if collective != "allreduce":
        raise PlanError(f"only an all-reduce folds dimensions; {collective} lays its data out by rank")


def fold_topology(topology: Topology) -> tuple[Topology, tuple[int, ...]]:
    """The topology with its innermost `fold_depth` dimensions as one switch of their ranks,
    with the outermost folded dimension's bandwidth and latencies, and that axis's radices
    (the folded dimensions' sizes, innermost first). Raises ValueError where none can fold."""
    depth = fold_depth(topology)
    if not depth:
        raise ValueError(f"topology {topology.label}: no inner dimensions can fold into one switch")
    parts = topology.dimensions[:depth]
    top = parts[-1]
    name = "+".join(topology.dim_name(d) for d in range(depth))
    merged: Dimension = replace(top, size=math.prod(d.size for d in parts), name=name, nvls=None)
    return replace(topology, dimensions=(merged, *topology.dimensions[depth:]), name=topology.label), \
        tuple(d.size for d in parts)


def folded_limits(network: Topology, radices: tuple[int, ...], protocol: str) -> tuple[float, float]:
    """The folded axis's smallest latency and summed bandwidth on the `network` it folds: a
    message on the axis leaves through one of the folded dimensions, so no run beats these
    (estimate.time_floor_us). Raises ValueError when the network's dimensions do not match."""
    folded = network.dimensions[:len(radices)]
    if tuple(d.size for d in folded) != radices:
        raise ValueError(f"topology {network.label} does not fold into dimensions of sizes {radices}")
    return min(d.alpha(protocol) for d in folded), sum(d.bandwidth for d in folded)


def fold_add(position: int, offset: int, radices: tuple[int, ...]) -> int:
    """position + offset on a folded axis: digit by digit, each digit modulo its radix."""
    return _digitwise(position, offset, radices, 1)


def fold_sub(position: int, origin: int, radices: tuple[int, ...]) -> int:
    """The offset that fold_add takes from origin to position."""
    return _digitwise(position, origin, radices, -1)


def _digitwise(a: int, b: int, radices: tuple[int, ...], sign: int) -> int:
    out, scale = 0, 1
    for n in radices:
        out += ((a // scale + sign * (b // scale)) % n) * scale
        scale *= n
    return out
