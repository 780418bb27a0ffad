"""Every rank's buffers as one array of cells, with the runtime's in-place aliasing resolved:
the memory model the symbolic execution and the race check share."""

from __future__ import annotations

import math
from bisect import bisect_right

import numpy as np

from ..program import BUFFERS, Program, buffer_chunks


class Memory:
    """Every rank's buffers laid end to end in one array, in-place aliasing resolved
    (msccl-runtime.md 8.4): chunk `off` of buffer b on rank r lives at start[r, b] + off.
    One extra cell at the end (`size`) takes the accesses a step does not make."""

    def __init__(self, p: Program, inplace: bool) -> None:
        self.p = p
        self.inplace = inplace
        n, k = p.ngpus, p.nchunksperloop
        self.per = k // n if p.collective in ("allgather", "reducescatter", "alltoall") and k % n == 0 else k
        self.logical = buffer_chunks(p.collective, n, k)
        gpu_s = {g.id: g.s_chunks for g in p.gpus}
        regions: dict[tuple[int, str], int] = {}
        self.start = np.zeros((n, len(BUFFERS)), dtype=np.int64)
        size = 0
        for r in range(n):
            for b, buf in enumerate(BUFFERS):
                r2, buf2, shift = self.key(r, buf, 0)
                if (r2, buf2) not in regions:
                    regions[(r2, buf2)] = size
                    size += gpu_s.get(r2, 0) if buf2 == "s" else self.logical[buf2]
                self.start[r, b] = regions[(r2, buf2)] + shift
        self.size = size
        self.regions = sorted((start, key) for key, start in regions.items())

    def locate(self, cell: int) -> tuple[int, str, int]:
        """The (rank, buffer, chunk) a cell belongs to."""
        i = bisect_right(self.regions, (cell, (math.inf, ""))) - 1
        start, (rank, buf) = self.regions[i]
        return rank, buf, cell - start

    def key(self, rank: int, buf: str, off: int) -> tuple[int, str, int]:
        """The (rank, buffer, chunk) that (rank, buf, off) really is."""
        if not self.inplace:
            return rank, buf, off
        coll = self.p.collective
        if coll in ("allreduce", "alltoall", "broadcast", "reduce") and buf == "o":
            return rank, "i", off
        if coll == "allgather" and buf == "i":
            return rank, "o", rank * self.per + off
        if coll == "reducescatter" and buf == "o":
            return rank, "i", rank * self.per + off
        return rank, buf, off
