"""Folding: a plan may treat a topology's innermost dimensions as one switch axis, so that a
latency-bound call pays one hop where it would pay one per dimension (C6p at 64 KiB: the
two-rank ring and the eight-rank switch below the network, 6.44 -> 5.87 us).

The fold is legal where every pair of ranks that differ only in the folded dimensions has a
link: the outermost folded dimension is a switch (a hop there also sets every coordinate
below it), and each one below is a switch too, except the innermost, which may be a ring of
up to three ranks (each rank its neighbour). Ranks keep their numbers: the folded axis's
position is the mixed-radix number of the folded coordinates, and peers on it are found by
adding offsets digit by digit (`fold_add`), which is a translation of the real dimensions,
so every rank runs rank 0's schedule shifted (simulate.symmetric holds on the real topology).

>>> from hipipe_compiler.topology import preset
>>> folded, radices = fold_topology(preset("dgx-h100-8x4"))
>>> [d.size for d in folded.dimensions], radices
([32], (8, 4))
>>> fold_add(9, 15, (8, 4)), fold_add(0, 9, (2, 8))
(16, 9)
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..topology import Dimension, Topology

#: The largest ring the innermost folded dimension may be: every other rank is a neighbour.
FOLDABLE_RING = 3


def fold_depth(topology: Topology) -> int:
    """How many dimensions the fold merges (0: none can be): the innermost ones up to the
    first switch above dimension 0, if every one below it may be folded."""
    dims = topology.dimensions
    for upto in range(1, topology.ndims):
        below = dims[:upto]
        if any(d.kind != "switch" for d in below[1:]) or (below[0].kind == "ring" and below[0].size > FOLDABLE_RING):
            return 0
        if dims[upto].kind == "switch":
            return upto + 1
    return 0


def fold_topology(topology: Topology) -> tuple[Topology, tuple[int, ...]]:
    """The topology with its innermost `fold_depth` dimensions as one switch of their ranks,
    with the outermost folded dimension's bandwidth and latencies, and that axis's radices
    (the folded dimensions' sizes, innermost first). Raises ValueError where none can fold."""
    depth = fold_depth(topology)
    if not depth:
        raise ValueError(f"topology {topology.label}: no inner dimensions can fold into one switch")
    parts = topology.dimensions[:depth]
    top = parts[-1]
    merged: Dimension = replace(top, size=math.prod(d.size for d in parts), name="+".join(topology.dim_name(d) for d in range(depth)))
    return replace(topology, dimensions=(merged, *topology.dimensions[depth:]), name=topology.label), \
        tuple(d.size for d in parts)


def fold_add(position: int, offset: int, radices: tuple[int, ...]) -> int:
    """position + offset on a folded axis: digit by digit, each digit modulo its radix."""
    out, scale = 0, 1
    for n in radices:
        out += ((position // scale + offset // scale) % n) * scale
        scale *= n
    return out
