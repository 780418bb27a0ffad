"""Lowering: Plan -> Program (per-rank threadblocks of send/recv/reduce steps).

The passes, in order:
1. generate: every rank's operations in one logical order (the plan's schedule), each on a
   *role* (a logical threadblock: an axis, a lane, and a ring direction or a peer offset);
2. dependencies: per rank, which earlier operation each one must wait for, found by
   tracking every chunk slot's last writer and readers (input and output are aliased so the
   program is correct in place and out of place);
3. segmentation: roles longer than the step limit are cut, at the same message on every
   rank, into several threadblocks on successive channels;
4. fusion: a receive followed by a send of the same data becomes rrs/rcs/rrcs;
5. emission: dependencies pruned with vector clocks, extra ones carried by nops, then the
   Program with channel and threadblock numbers.

>>> from hipipe_compiler.topology import preset
>>> from hipipe_compiler.plan import hierarchical_plan
>>> program = lower(hierarchical_plan(preset("dgx-h100-8x2"), "allreduce", max_bytes=1 << 20))
>>> program.ngpus, program.nchunksperloop, program.max_steps <= 64
(16, 16, True)
"""

from __future__ import annotations

import gc
import math
from bisect import bisect_right
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .errors import PlanError
from .plan import Plan, Stage, check_plan
from .program import Gpu, Program, Step, Threadblock, buffer_chunks
from .runtime import Limits, piece_count
from .topology import Topology


# -- axes and the cell layout -----------------------------------------------------------------


class _Axis:
    """A group structure: every rank has a position on the axis and a group of `size` ranks."""

    def __init__(self, topology: Topology, flat: bool, index: int) -> None:
        self.topology = topology
        self.flat = flat
        self.index = index
        if flat:
            self.cycle = topology.ring_order()
            self.position = {r: i for i, r in enumerate(self.cycle)}
            self.size = topology.nranks
        else:
            self.size = topology.dimensions[index].size

    def pos(self, rank: int) -> int:
        return self.position[rank] if self.flat else self.topology.coord(rank, self.index)

    def member(self, rank: int, pos: int) -> int:
        pos %= self.size
        if self.flat:
            return self.cycle[pos]
        return self.topology.shift(rank, self.index, pos - self.topology.coord(rank, self.index))


class _Cells:
    """Which base chunks hold the cells of which final owners (the data layout)."""

    def __init__(self, plan: Plan, axes: list[_Axis]) -> None:
        self.plan = plan
        self.axes = axes
        self.n = plan.topology.nranks
        self.offsets = []
        acc = 0
        for c in plan.chunks:
            self.offsets.append(acc)
            acc += c.units
        self.block_units = acc  # cells per rank: B
        self.block = lru_cache(maxsize=None)(self._block)

    def _block(self, k: int, depth: int, prefix: tuple[int, ...], v: int,
               origin: tuple[int, ...] = ()) -> tuple[tuple[int, int], ...]:
        """Ranges (start, length) holding the cells of owners that match `prefix` on the chunk's
        first `depth` axes and sit at position v on axis order[depth].

        `origin` is the group's position on the axes after order[depth] (every member of a
        group shares it). Owners are taken in order of their position relative to it, so every
        group walks its blocks the same way: the schedule is the same on every rank, shifted.
        """
        chunk = self.plan.chunks[k]
        order = chunk.order
        if self.plan.collective == "allreduce":
            sizes = [self.axes[a].size for a in order]
            weights = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
            start = self.n * self.offsets[k] + chunk.units * (
                sum(p * w for p, w in zip(prefix, weights)) + v * weights[depth])
            return ((start, chunk.units * weights[depth]),)
        owners = self._owners(order, depth, prefix, v, origin)
        ranges: list[list[int]] = []
        for r in owners:
            start = r * self.block_units + self.offsets[k]
            if ranges and ranges[-1][0] + ranges[-1][1] == start:
                ranges[-1][1] += chunk.units
            else:
                ranges.append([start, chunk.units])
        return tuple((s, l) for s, l in ranges)

    def _owners(self, order: tuple[int, ...], depth: int, prefix: tuple[int, ...], v: int,
                origin: tuple[int, ...]) -> list[int]:
        if self.plan.flat:
            return [self.axes[0].member(0, v)]
        topo = self.plan.topology
        fixed = {order[i]: prefix[i] for i in range(depth)}
        fixed[order[depth]] = v
        free = order[depth + 1:]
        base = dict(zip(free, origin))
        owners = [0]
        for d, dim in enumerate(topo.dimensions):
            stride = topo._strides[d]
            values = [fixed[d]] if d in fixed else range(dim.size)
            owners = [o + c * stride for o in owners for c in values]

        def relative(r: int) -> tuple[int, ...]:
            return tuple((topo.coord(r, d) - base.get(d, 0)) % topo.dimensions[d].size for d in reversed(free))
        return sorted(owners, key=relative)


# -- operations -------------------------------------------------------------------------------


@dataclass(slots=True)
class _Op:
    role: int
    tick: tuple[int, int, int]  # (event, piece, round): equal on both ends of a message
    type: str  # s, r, rrc, cpy
    src: tuple[str, int] | None
    dst: tuple[str, int] | None
    cnt: int
    fuse: bool = False  # a receive whose data the role's next operation sends on
    dead: bool = False  # the receive's local write is read by nothing but that send


@dataclass(frozen=True)
class _Role:
    axis: int  # -1 for local work
    lane: int
    algorithm: str  # ring, direct, local
    offset: int  # ring direction, or peer offset for direct
    side: str  # both, send, recv, local

    def peers(self, axis: _Axis | None, rank: int) -> tuple[int, int]:
        if axis is None:
            return -1, -1
        p = axis.pos(rank)
        if self.algorithm == "ring":
            send, recv = axis.member(rank, p + self.offset), axis.member(rank, p - self.offset)
        else:
            send = recv = axis.member(rank, p + self.offset)
        if self.side == "send":
            recv = -1
        elif self.side == "recv":
            send = -1
        return send, recv


class _Generator:
    """Builds every rank's logical operation list for a plan."""

    def __init__(self, plan: Plan, limits: Limits) -> None:
        self.plan = plan
        self.limits = limits
        self.topology = plan.topology
        self.axes = [_Axis(plan.topology, plan.flat, a) for a in range(plan.naxes)]
        self.cells = _Cells(plan, self.axes)
        self.roles: list[_Role] = []
        self.role_index: dict[_Role, int] = {}
        self.nch = plan.nchunksperloop
        self.ring_pieces = piece_count(plan.protocol, plan.max_bytes, self.nch, ring=True)
        self.direct_pieces = piece_count(plan.protocol, plan.max_bytes, self.nch, ring=False)
        self.events = plan.events()
        self.ndepth = plan.naxes

    def role(self, axis: int, lane: int, algorithm: str, offset: int, side: str) -> int:
        key = _Role(axis, lane, algorithm, offset, side)
        if key not in self.role_index:
            self.role_index[key] = len(self.roles)
            self.roles.append(key)
        return self.role_index[key]

    # locations of the data a stage reads and writes, as buffer names
    def rs_input(self, depth: int) -> str:
        if depth == 0:
            return "i"
        return "o" if self.plan.collective == "allreduce" else "s"

    def rs_landing(self) -> str:
        return "o" if self.plan.collective == "allreduce" else "s"

    def rs_owned(self, depth: int) -> str:
        if self.plan.collective == "allreduce" or depth == self.ndepth - 1:
            return "o"
        return "s"

    def ag_source(self, depth: int) -> str:
        if self.plan.collective == "allgather" and depth == self.ndepth - 1:
            return "i"
        return "o"

    def pieces(self, ranges: tuple[tuple[int, int], ...], fused: bool, ring: bool) -> list[tuple[int, int]]:
        size = (self.ring_pieces if ring else self.direct_pieces) if fused else self.limits.max_count
        out = []
        for start, length in ranges:
            for off in range(0, length, size):
                out.append((start + off, min(size, length - off)))
        return out

    def block_pieces(self, k: int, depth: int, prefix: tuple[int, ...], v: int, origin: tuple[int, ...],
                     fused: bool, ring: bool) -> list[tuple[int, int]]:
        """The pieces of block v, cut so that every rank runs the same schedule shifted.

        An all-reduce block too big for one step is cut along the blocks of the chunk's next
        axis, taken in order from the rank's own position there (then recursively): each
        piece then depends on the same relative peer's work on every rank. Cutting at fixed
        offsets would make piece i depend on different peers on different ranks."""
        ranges = self.cells.block(k, depth, prefix, v, origin)
        size = (self.ring_pieces if ring else self.direct_pieces) if fused else self.limits.max_count
        order = self.plan.chunks[k].order
        if (self.plan.collective != "allreduce" or self.plan.flat or depth + 1 >= len(order)
                or sum(length for _start, length in ranges) <= size):
            return self.pieces(ranges, fused, ring)
        n_next = self.axes[order[depth + 1]].size
        out: list[tuple[int, int]] = []
        for t in range(n_next):
            out += self.block_pieces(k, depth + 1, prefix + (v,), (origin[0] + t) % n_next, origin[1:], fused, ring)
        return out

    def generate(self, rank: int) -> list[_Op]:
        ops: list[_Op] = []
        plan = self.plan
        if plan.collective == "allgather":
            b = self.cells.block_units
            local = self.role(-1, 0, "local", 0, "local")
            for off in range(0, b, self.limits.max_count):
                cnt = min(self.limits.max_count, b - off)
                ops.append(_Op(local, (-1, 0, 0), "cpy", ("i", rank * b + off), ("o", rank * b + off), cnt))
        for e, (k, j) in enumerate(self.events):
            self._stage(ops, rank, e, k, j)
        return ops

    def _stage(self, ops: list[_Op], x: int, e: int, k: int, j: int) -> None:
        plan = self.plan
        chunk = plan.chunks[k]
        st = plan.stages(k)[j]
        axis = self.axes[st.axis]
        n, p = axis.size, axis.pos(x)
        prefix = tuple(self.axes[a].pos(x) for a in chunk.order[: st.depth])
        origin = tuple(self.axes[a].pos(x) for a in chunk.order[st.depth + 1:])
        fused = plan.layouts[st.axis] == "fused"
        ring_axis = n > 2 and (plan.flat or plan.topology.dimensions[st.axis].kind == "ring")
        alg = plan.algorithms[st.axis] if n > 2 else "direct"
        if plan.algorithms[st.axis] == "oneshot":
            # one-shot only replaces the last axis's reduce-scatter + all-gather
            alg = "oneshot" if st.kind == "ar" else ("bidir" if ring_axis else "direct")
        blocks = [self.block_pieces(k, st.depth, prefix, v, origin, fused, alg in ("ring", "bidir")) for v in range(n)]
        lane = chunk.lane_of(j)
        if alg == "oneshot" and ring_axis:
            self._ring_oneshot(ops, e, n, k, st, prefix, origin, fused, lane, chunk.direction)
        elif alg == "oneshot":
            self._oneshot(ops, e, n, k, st, prefix, origin, fused, lane)
        elif alg == "ring":
            rs_send, rs_recv = self._ring_roles(st.axis, lane, chunk.direction, fused)
            for i in range(len(blocks[p])):
                rnd = 0
                if st.kind in ("rs", "ar"):
                    rnd = self._ring_rs(ops, e, i, n, p, chunk.direction, blocks, st, rs_send, rs_recv)
                if st.kind in ("ag", "ar"):
                    self._ring_ag(ops, e, i, n, p, chunk.direction, blocks, st, rs_send, rs_recv, rnd)
        elif alg == "bidir":
            d = chunk.direction
            # the other direction's chain gets threadblocks (and channels) of its own, so that it
            # runs beside the mirrored chunk's main chain on that link instead of after it
            roles = {d: self._ring_roles(st.axis, lane, d, fused), -d: self._ring_roles(st.axis, -1 - lane, -d, fused)}
            for i in range(len(blocks[p])):
                rnd = 0
                if st.kind in ("rs", "ar"):
                    rnd = self._bidir_rs(ops, e, i, n, p, d, blocks, st, roles)
                if st.kind in ("ag", "ar"):
                    self._bidir_ag(ops, e, i, n, p, d, blocks, st, roles, rnd)
        else:
            if fused:
                send_roles = recv_roles = [self.role(st.axis, lane, "direct", delta, "both") for delta in range(1, n)]
            else:
                send_roles = [self.role(st.axis, lane, "direct", delta, "send") for delta in range(1, n)]
                recv_roles = [self.role(st.axis, lane, "direct", delta, "recv") for delta in range(1, n)]
            for i in range(len(blocks[p])):
                if st.kind in ("rs", "ar"):
                    inp, own = self.rs_input(st.depth), self.rs_owned(st.depth)
                    for delta in range(1, n):
                        start, cnt = blocks[(p + delta) % n][i]
                        ops.append(_Op(send_roles[delta - 1], (e, i, 0), "s", (inp, start), None, cnt))
                        if fused:
                            start, cnt = blocks[p][i]
                            local = inp if delta == 1 else own
                            ops.append(_Op(recv_roles[delta - 1], (e, i, 0), "rrc", (local, start), (own, start), cnt))
                    if not fused:
                        for delta in range(1, n):
                            start, cnt = blocks[p][i]
                            local = inp if delta == 1 else own
                            ops.append(_Op(recv_roles[delta - 1], (e, i, 0), "rrc", (local, start), (own, start), cnt))
                if st.kind in ("ag", "ar"):
                    rnd = 1 if st.kind == "ar" else 0
                    src = "o" if st.kind == "ar" else self.ag_source(st.depth)
                    for delta in range(1, n):
                        start, cnt = blocks[p][i]
                        ops.append(_Op(send_roles[delta - 1], (e, i, rnd), "s", (src, start), None, cnt))
                        if fused:
                            start, cnt = blocks[(p + delta) % n][i]
                            ops.append(_Op(recv_roles[delta - 1], (e, i, rnd), "r", None, ("o", start), cnt))
                    if not fused:
                        for delta in range(1, n):
                            start, cnt = blocks[(p + delta) % n][i]
                            ops.append(_Op(recv_roles[delta - 1], (e, i, rnd), "r", None, ("o", start), cnt))

    def _oneshot(self, ops: list[_Op], e: int, n: int, k: int, st: Stage, prefix: tuple[int, ...],
                 origin: tuple[int, ...], fused: bool, lane: int) -> None:
        """All-reduce of the owned range in one exchange: send it whole to every peer, receive
        the peers' copies into scratch, and reduce them locally (one latency instead of two,
        n-1 times the block's bytes). Receives never wait for sends, as the split layout needs."""
        pieces = self._owned_pieces(n, k, st, prefix, origin, fused, False)
        if fused:
            send_roles = recv_roles = [self.role(st.axis, lane, "direct", delta, "both") for delta in range(1, n)]
        else:
            send_roles = [self.role(st.axis, lane, "direct", delta, "send") for delta in range(1, n)]
            recv_roles = [self.role(st.axis, lane, "direct", delta, "recv") for delta in range(1, n)]
        inp = self.rs_input(st.depth)
        for i, (start, cnt) in enumerate(pieces):
            for delta in range(1, n):
                ops.append(_Op(send_roles[delta - 1], (e, i, 0), "s", (inp, start), None, cnt))
                if fused:
                    ops.append(_Op(recv_roles[delta - 1], (e, i, 0), "r", None, ("s", self.scratch(delta - 1, start)), cnt))
            if not fused:
                for delta in range(1, n):
                    ops.append(_Op(recv_roles[delta - 1], (e, i, 0), "r", None, ("s", self.scratch(delta - 1, start)), cnt))
            if inp != "o":
                ops.append(_Op(recv_roles[0], (e, i, 1), "cpy", (inp, start), ("o", start), cnt))
            for delta in range(1, n):
                ops.append(_Op(recv_roles[delta - 1], (e, i, 1), "re", ("s", self.scratch(delta - 1, start)), ("o", start), cnt))

    def _owned_pieces(self, n: int, k: int, st: Stage, prefix: tuple[int, ...], origin: tuple[int, ...],
                      fused: bool, ring: bool) -> list[tuple[int, int]]:
        """The whole range a rank owns before the last axis's all-reduce, cut into pieces."""
        ranges = sorted(r for v in range(n) for r in self.cells.block(k, st.depth, prefix, v, origin))
        merged: list[list[int]] = []
        for start, length in ranges:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1][1] += length
            else:
                merged.append([start, length])
        return self.pieces(tuple((a, b) for a, b in merged), fused, ring)

    def _ring_oneshot(self, ops: list[_Op], e: int, n: int, k: int, st: Stage, prefix: tuple[int, ...],
                      origin: tuple[int, ...], fused: bool, lane: int, direction: int) -> None:
        """All-reduce around a ring in n // 2 rounds: every rank floods its whole range both
        ways, each hop forwarding what it received (into scratch) one step further; every
        rank then reduces the n - 1 ranges it received into its own. Few latencies, n - 1
        times the bytes: for small data on slow rings. With n even the opposite rank's range
        comes the chunk's own direction; the mirrored chunk balances the links."""
        pieces = self._owned_pieces(n, k, st, prefix, origin, fused, True)
        rounds = {direction: n // 2, -direction: (n - 1) // 2}
        roles = {direction: self._ring_roles(st.axis, lane, direction, fused),
                 -direction: self._ring_roles(st.axis, -1 - lane, -direction, fused)}
        inp = self.rs_input(st.depth)
        for i, (start, cnt) in enumerate(pieces):
            for d in (direction, -direction):
                send, recv = roles[d]
                ops.append(_Op(send, (e, i, 0), "s", (inp, start), None, cnt))
                for t in range(1, rounds[d] + 1):
                    dst = ("s", self.scratch_slot(d, t, start))
                    last = t == rounds[d]
                    ops.append(_Op(recv, (e, i, t - 1), "r", None, dst, cnt, fuse=not last))
                    if not last:
                        ops.append(_Op(send, (e, i, t), "s", dst, None, cnt))
            first = True
            for d in (direction, -direction):
                _send, recv = roles[d]
                if first and inp != "o":
                    ops.append(_Op(recv, (e, i, n), "cpy", (inp, start), ("o", start), cnt))
                first = False
                for t in range(1, rounds[d] + 1):
                    ops.append(_Op(recv, (e, i, n), "re", ("s", self.scratch_slot(d, t, start)), ("o", start), cnt))

    def scratch_slot(self, direction: int, hop: int, start: int) -> int:
        """Where a ring one-shot keeps the range that arrived `hop` ranks away, per direction."""
        return self.scratch((hop - 1) * 2 + (0 if direction == 1 else 1), start)

    def scratch(self, index: int, start: int) -> int:
        """Scratch chunk of the index-th copy of logical chunk `start` (one nchunksperloop apart)."""
        return index * self.nch + start

    def _ring_roles(self, axis: int, lane: int, direction: int, fused: bool) -> tuple[int, int]:
        """(send role, receive role) of a ring direction: one threadblock when fused."""
        if fused:
            both = self.role(axis, lane, "ring", direction, "both")
            return both, both
        return self.role(axis, lane, "ring", direction, "send"), self.role(axis, lane, "ring", direction, "recv")

    def _bidir_rs(self, ops: list[_Op], e: int, i: int, n: int, p: int, d: int, blocks: list, st: Stage,
                  roles: dict[int, tuple[int, int]]) -> int:
        """Reduce-scatter along both ring directions at once: block v gathers the n // 2 ranks
        behind it (direction d) along one chain and the (n - 1) // 2 ahead of it along the
        other, so it takes n // 2 latencies instead of n - 1. The chunk of the other direction
        mirrors it, which balances the two links. Returns the number of rounds."""
        inp, land, own = self.rs_input(st.depth), self.rs_landing(), self.rs_owned(st.depth)
        src_final = inp
        # the shorter chain first: its final reduce comes first, the longer one ends the stage
        for dd, length in ((-d, (n - 1) // 2), (d, n // 2)):
            send_role, recv_role = roles[dd]
            start, cnt = blocks[(p + length * dd) % n][i]
            ops.append(_Op(send_role, (e, i, 0), "s", (inp, start), None, cnt))
            for t in range(length):
                start, cnt = blocks[(p + (length - 1 - t) * dd) % n][i]
                last = t == length - 1
                # the final reduce is not fused with an all-gather send: that step would only
                # complete when its message arrives, holding back the other direction's send
                src = src_final if last else inp
                ops.append(_Op(recv_role, (e, i, t), "rrc", (src, start), (own if last else land, start), cnt,
                               fuse=not last, dead=not last))
                if not last:
                    ops.append(_Op(send_role, (e, i, t + 1), "s", (land, start), None, cnt))
            src_final = own
        return n // 2

    def _bidir_ag(self, ops: list[_Op], e: int, i: int, n: int, p: int, d: int, blocks: list, st: Stage,
                  roles: dict[int, tuple[int, int]], r0: int) -> None:
        """All-gather along both ring directions: block v travels n // 2 ranks one way and
        (n - 1) // 2 the other."""
        src = "o" if st.kind == "ar" else self.ag_source(st.depth)
        for dd, length in ((d, n // 2), (-d, (n - 1) // 2)):
            send_role, recv_role = roles[dd]
            start, cnt = blocks[p][i]
            ops.append(_Op(send_role, (e, i, r0), "s", (src, start), None, cnt))
            for t in range(length):
                start, cnt = blocks[(p - (t + 1) * dd) % n][i]
                last = t == length - 1
                ops.append(_Op(recv_role, (e, i, r0 + t), "r", None, ("o", start), cnt, fuse=not last))
                if not last:
                    ops.append(_Op(send_role, (e, i, r0 + t + 1), "s", ("o", start), None, cnt))

    def _ring_rs(self, ops: list[_Op], e: int, i: int, n: int, p: int, d: int, blocks: list, st: Stage,
                 send_role: int, recv_role: int) -> int:
        inp, land, own = self.rs_input(st.depth), self.rs_landing(), self.rs_owned(st.depth)
        start, cnt = blocks[(p - d) % n][i]
        ops.append(_Op(send_role, (e, i, 0), "s", (inp, start), None, cnt))
        for t in range(n - 1):
            start, cnt = blocks[(p - d * (t + 2)) % n][i]
            last = t == n - 2
            fuse = not last or st.kind == "ar"
            ops.append(_Op(recv_role, (e, i, t), "rrc", (inp, start), (own if last else land, start), cnt,
                           fuse=fuse, dead=not last))
            if not last:
                ops.append(_Op(send_role, (e, i, t + 1), "s", (land, start), None, cnt))
        return n - 1

    def _ring_ag(self, ops: list[_Op], e: int, i: int, n: int, p: int, d: int, blocks: list, st: Stage,
                 send_role: int, recv_role: int, r0: int) -> None:
        src = "o" if st.kind == "ar" else self.ag_source(st.depth)
        start, cnt = blocks[p][i]
        ops.append(_Op(send_role, (e, i, r0), "s", (src, start), None, cnt))
        for t in range(n - 1):
            start, cnt = blocks[(p - d * (t + 1)) % n][i]
            last = t == n - 2
            ops.append(_Op(recv_role, (e, i, r0 + t), "r", None, ("o", start), cnt, fuse=not last))
            if not last:
                ops.append(_Op(send_role, (e, i, r0 + t + 1), "s", ("o", start), None, cnt))


# -- slots, aliasing and raw dependencies -------------------------------------------------------


def _slot_mapper(plan: Plan, rank: int) -> tuple[Callable[[str, int], int], Callable[[str, int], int]]:
    """(slot of a logical location, buffer offset of a logical location); scratch follows i/o."""
    nch = plan.nchunksperloop
    b = plan.units
    coll = plan.collective

    def slot(buf: str, y: int) -> int:
        return nch + y if buf == "s" else y

    if coll == "reducescatter":
        def offset(buf: str, y: int) -> int:
            return y - rank * b if buf == "o" else y
    elif coll == "allgather":
        def offset(buf: str, y: int) -> int:
            return y - rank * b if buf == "i" else y
    else:
        def offset(buf: str, y: int) -> int:
            return y
    return slot, offset


#: Op types that read their src operand, and those that write their dst operand.
_READS = frozenset(("s", "rrc", "cpy", "re"))
_WRITES = frozenset(("r", "rrc", "cpy", "re"))


def _raw_dependencies(plan: Plan, ops: list[_Op]) -> list[list[int]]:
    """For each op, the earlier ops (any role) it must wait for, by slot reads and writes.

    A read waits for the slots' last writers; a write also waits, per role, for the latest
    read of any of its slots since they were last written. Slots are tracked in runs that
    no op's range splits (every op covers a run whole or not at all, so all slots of a run
    share their history): an op then touches one or two runs, not dozens of slots.
    """
    reads, writes, bounds = _slot_ranges(plan, ops)
    run_of = {b: i for i, b in enumerate(sorted(bounds))}
    writer = [-1] * len(run_of)  # last op that wrote each run
    readers: list[dict[int, int] | None] = [None] * len(run_of)  # per run: role -> its last op reading it since
    deps: list[list[int]] = []
    for idx, op in enumerate(ops):
        found: set[int] = set()
        read, write = reads[idx], writes[idx]
        if read is not None:
            ra, rb = run_of[read[0]], run_of[read[1]]
            found.update(writer[ra:rb])
        if write is not None:
            wa, wb = run_of[write[0]], run_of[write[1]]
            found.update(writer[wa:wb])  # (re also reads its dst: the same writer)
            found.update(_latest_reads(readers[wa:wb]))
        found.discard(-1)
        if read is not None:
            role = op.role
            for a in range(ra, rb):
                seen = readers[a]
                if seen is None:
                    readers[a] = {role: idx}
                else:
                    seen[role] = idx
        if write is not None:
            writer[wa:wb] = [idx] * (wb - wa)
            readers[wa:wb] = [None] * (wb - wa)
        deps.append(sorted(found))
    return deps


def _slot_ranges(plan: Plan, ops: list[_Op]) -> tuple[list[tuple[int, int] | None], list[tuple[int, int] | None], set[int]]:
    """Per op, the slots [a, b) it reads and writes (None: none), and every range's ends.

    The slot table holds i/o (one slot per chunk) and then scratch as far as any op uses
    it; slots past its end are ignored."""
    nch = plan.nchunksperloop
    nslots = nch + max((loc[1] + op.cnt for op in ops for loc in (op.src, op.dst) if loc is not None and loc[0] == "s"),
                       default=0)
    bounds = {0, nslots}

    def slots(loc: tuple[str, int], cnt: int) -> tuple[int, int] | None:
        a = nch + loc[1] if loc[0] == "s" else loc[1]
        b = min(a + cnt, nslots)
        if a >= b:
            return None
        bounds.add(a)
        bounds.add(b)
        return a, b

    reads = [slots(op.src, op.cnt) if op.type in _READS else None for op in ops]  # type: ignore[arg-type]
    writes = [slots(op.dst, op.cnt) if op.type in _WRITES else None for op in ops]  # type: ignore[arg-type]
    return reads, writes, bounds


def _latest_reads(readers: list[dict[int, int] | None]) -> list[int]:
    """Per role, the latest op that read any of these runs."""
    if len(readers) == 1:
        return list(readers[0].values()) if readers[0] else []
    latest: dict[int, int] = {}
    for seen in readers:
        if seen:
            for role, idx in seen.items():
                if idx > latest.get(role, -1):
                    latest[role] = idx
    return list(latest.values())


# -- segmentation -----------------------------------------------------------------------------


def _segment_cuts(gen: _Generator, per_rank_ops: list[list[_Op]], budgets: dict[tuple[int, int], int],
                  extra_steps: list[list[int]]) -> dict[tuple[int, int], list[tuple[int, int, int]]]:
    """For each (axis, lane): the ticks at which a new threadblock segment starts."""
    cuts: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for key, ticks in _steps_per_tick(gen, per_rank_ops, extra_steps).items():
        cuts[key] = _cuts_within(ticks, budgets.get(key, gen.limits.max_steps))
    return cuts


def _steps_per_tick(gen: _Generator, per_rank_ops: list[list[_Op]], extra_steps: list[list[int]]
                    ) -> dict[tuple[int, int], dict[tuple[int, int, int], dict[int, int]]]:
    """Per (axis, lane), per tick: the steps each (rank, role) spends there (keyed by
    rank * nroles + role). A send after a role's fusing receive costs only its nops."""
    nroles = len(gen.roles)
    group_of = [(role.axis, role.lane) if role.axis >= 0 else None for role in gen.roles]
    groups: dict[tuple[int, int], dict[tuple[int, int, int], dict[int, int]]] = {}
    for rank, ops in enumerate(per_rank_ops):
        extra = extra_steps[rank]
        prev_fuse = [False] * nroles
        for idx, op in enumerate(ops):
            role = op.role
            key = group_of[role]
            if key is None:
                continue
            steps = extra[idx] if op.type == "s" and prev_fuse[role] else 1 + extra[idx]
            prev_fuse[role] = op.fuse
            ticks = groups.get(key)
            if ticks is None:
                ticks = groups[key] = {}
            counts = ticks.get(op.tick)
            if counts is None:
                counts = ticks[op.tick] = {}
            who = rank * nroles + role
            counts[who] = counts.get(who, 0) + steps
    return groups


def _cuts_within(ticks: dict[tuple[int, int, int], dict[int, int]], budget: int) -> list[tuple[int, int, int]]:
    """Cut an (axis, lane)'s ticks into segments in which no (rank, role) spends more than
    `budget` steps; a cut goes at the start of the event in progress if that is inside the
    segment, else at the tick that overflows."""
    order = sorted(ticks)
    acc: dict[int, int] = {}
    seg = 0  # index in order of the segment's first tick
    event = 0  # index of the first tick of the current event
    out: list[tuple[int, int, int]] = []
    for i, t in enumerate(order):
        if t[0] != order[event][0]:
            event = i
        counts = ticks[t]
        if i != seg and any(acc.get(who, 0) + c > budget for who, c in counts.items()):
            seg = event if event > seg else i
            out.append(order[seg])
            acc = {}
            for t2 in order[seg:i]:
                for who, c in ticks[t2].items():
                    acc[who] = acc.get(who, 0) + c
        for who, c in counts.items():
            acc[who] = acc.get(who, 0) + c
    return out


# -- emission ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Unit:
    """A step-to-be: one op, or a receive fused with the send after it."""

    index: int  # in the rank's list of units
    ops: list[int]
    tb: int
    pos: int
    type: str
    src: tuple[str, int] | None
    dst: tuple[str, int] | None
    cnt: int


def lowering_key(plan: Plan) -> tuple[Any, ...]:
    """Plans with equal keys lower to the same program apart from the window."""
    n = plan.nchunksperloop
    return (replace(plan, min_bytes=0, max_bytes=0, nominal_bytes=0, schedule=plan.events()),
            piece_count(plan.protocol, plan.max_bytes, n, True), piece_count(plan.protocol, plan.max_bytes, n, False))


def lower(plan: Plan, limits: Limits = Limits(), ranks: Sequence[int] | None = None) -> Program:
    """Lower a plan to a Program within the runtime limits, or raise PlanError saying why not.

    With `ranks`, only those ranks' gpus are built (a partial program for estimates, such as
    simulate(..., quotient=True) on rank 0; never written out).
    """
    with _collector_paused():
        return _lower(plan, limits, ranks)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the duration (unless already paused).

    Lowering allocates millions of small objects (ops, units, steps) that all stay alive
    until it returns; each collection meanwhile walks them and the caller's heap (the
    optimizer's cached programs) and frees nothing. That was a third of lowering's time.
    The few cycles lowering leaves (the cell cache) are collected after it returns."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _lower(plan: Plan, limits: Limits, ranks: Sequence[int] | None) -> Program:
    """lower() with the collector paused."""
    check_plan(plan)
    if plan.nchunksperloop > limits.max_offset + 1:
        raise PlanError(
            f"the plan needs {plan.nchunksperloop} chunks per loop ({plan.units} per rank x {plan.topology.nranks} ranks); "
            f"chunk offsets are stored as int16 by the runtime, so at most {limits.max_offset + 1}; use fewer or smaller chunks")
    gen = _Generator(plan, limits)
    chosen = list(range(plan.topology.nranks)) if ranks is None else list(ranks)
    per_rank_ops = [gen.generate(r) for r in chosen]
    raw = [_raw_dependencies(plan, ops) for ops in per_rank_ops]

    # Segment with rank 0 alone first (cheap), then emit every rank with those budgets; ranks
    # whose dependencies need a few more nops make another round.
    budgets: dict[tuple[int, int], int] = {}
    first: list[tuple[Any, _Layout]] = []  # the first rank's last layout and its cuts: emit reuses it
    probe = ([chosen[0]], per_rank_ops[:1], raw[:1])
    extra = [[0] * len(per_rank_ops[0])]
    for phase in ("probe", "all"):
        ranks_, ops_, raw_ = probe if phase == "probe" else (chosen, per_rank_ops, raw)
        if phase == "all":
            extra = [list(extra[0]) if len(ops) == len(extra[0]) else [0] * len(ops) for ops in per_rank_ops]
        # the probe's program is only kept when it is the whole answer
        build = phase == "all" or len(chosen) == 1
        for _attempt in range(12):
            cuts = _segment_cuts(gen, ops_, budgets, extra)
            program, overflow, nops = _emit(plan, gen, ranks_, ops_, raw_, cuts, limits, build, first)
            if not overflow:
                break
            extra = nops
            for key, over in overflow.items():
                budgets[key] = min(budgets.get(key, limits.max_steps), limits.max_steps) - max(1, over // 2)
                if budgets[key] < 4:
                    raise PlanError(f"axis {key[0]} lane {key[1]}: cannot fit the steps of one exchange into "
                                    f"{limits.max_steps} steps per threadblock")
        else:
            raise PlanError("could not fit the plan into the step limit after repeated segmentation")
        if len(chosen) == 1:
            break
    assert program is not None
    return program


def _emit(plan: Plan, gen: _Generator, ranks: list[int], per_rank_ops: list[list[_Op]], raw: list[list[list[int]]],
          cuts: dict[tuple[int, int], list[tuple[int, int, int]]], limits: Limits, build: bool = True,
          first: list[tuple[Any, _Layout]] | None = None) -> tuple[Program | None, dict[tuple[int, int], int], list[list[int]]]:
    """Lay out every rank's steps for given segment cuts; report step-limit overflow per
    (axis, lane) and the nops before each op's step. The Program is built only with `build`
    and when nothing overflows (lower() discards it otherwise).

    `first` holds the first rank's layout for the cuts it was made with: it is reused when
    the cuts are the same (the probe's last round is often the full round's first), and
    replaced by this call's."""
    topo = plan.topology
    nranks = topo.nranks
    channel_base, nchannels = _channels(cuts)
    if nchannels > limits.max_channels:
        raise PlanError(
            f"the plan needs {nchannels} channels (threadblocks are split over channels to stay within "
            f"{limits.max_steps} steps each); the runtime allows {limits.max_channels}; use fewer chunks or lanes")

    # threadblock keys in a fixed order: (role, segment)
    role_cuts = [cuts.get((role.axis, role.lane), []) if role.axis >= 0 else [] for role in gen.roles]
    per_rank_segs = [_segments(ops, role_cuts) for ops in per_rank_ops]
    tb_keys: list[tuple[int, int]] = sorted({(op.role, g) for op, g in zip(per_rank_ops[0], per_rank_segs[0])})
    if any({(op.role, g) for op, g in zip(ops, segs)} != set(tb_keys)
           for ops, segs in zip(per_rank_ops[1:], per_rank_segs[1:])):
        raise PlanError("internal error: ranks disagree on their threadblocks")
    ntb = len(tb_keys)
    if ntb > limits.max_threadblocks:
        raise PlanError(
            f"the plan needs {ntb} threadblocks per rank; the budget is {limits.max_threadblocks} "
            f"(all threadblocks must be resident at once); use fewer lanes, chunks, or a ring inside large switch dimensions")
    if ntb > limits.max_depid + 1:
        raise PlanError(f"the plan needs {ntb} threadblocks; dependencies can only name threadblocks 0..{limits.max_depid}")
    role_tbs: list[dict[int, int]] = [{} for _ in gen.roles]  # role -> segment -> threadblock
    for t, (role, seg) in enumerate(tb_keys):
        role_tbs[role][seg] = t
    # (threadblock of a segment, threadblock of the role's previous segment): chained in order
    chains = [(t, role_tbs[role][seg - 1]) for t, (role, seg) in enumerate(tb_keys)
              if seg > 0 and seg - 1 in role_tbs[role]]

    overflow: dict[tuple[int, int], int] = {}
    layouts: list[_Layout] = []
    for index, rank in enumerate(ranks):
        ops = per_rank_ops[index]
        slot_offset = _slot_mapper(plan, rank)[1]
        if index == 0 and first and first[0][0] == cuts:
            layout = first[0][1]
        else:
            tb_of_op = [role_tbs[op.role][g] for op, g in zip(ops, per_rank_segs[index])]
            graph = _unit_graph(ops, tb_of_op, raw[index], ntb, chains)
            layout = _layout(graph, _prune(graph, ntb), len(ops))
            if index == 0 and first is not None:
                first[:] = [(cuts, layout)]
        layouts.append(layout)
        for t, length in enumerate(layout.tb_steps):
            if length > limits.max_steps:
                role = gen.roles[tb_keys[t][0]]
                key = (role.axis, role.lane)
                overflow[key] = max(overflow.get(key, 0), length - limits.max_steps)
        layout.s_used = max((slot_offset(*loc) + op.cnt for op in ops for loc in (op.src, op.dst)
                             if loc is not None and loc[0] == "s"), default=0)
        if layout.s_used > limits.max_offset + 1:
            raise PlanError(f"the plan needs {layout.s_used} scratch chunks; offsets are stored as int16 by the runtime, "
                            f"so at most {limits.max_offset + 1}; use fewer or smaller chunks")
    nops_per_op = [layout.nops for layout in layouts]
    nodes = 1 + nranks + max(ntb + sum(layout.tb_steps) for layout in layouts)
    if nodes > limits.max_nodes and not overflow:
        raise PlanError(
            f"a rank's share of the XML has {nodes} nodes (algo + every gpu + its threadblocks and steps); "
            f"the runtime's reader holds {limits.max_nodes}; use fewer chunks")
    if overflow or not build:
        return None, overflow, nops_per_op

    bufs = buffer_chunks(plan.collective, nranks, plan.nchunksperloop)
    gpus: list[Gpu] = []
    for rank, layout in zip(ranks, layouts):
        tb_steps = _steps(layout, _slot_mapper(plan, rank)[1])
        tbs = []
        for t, (role_idx, seg) in enumerate(tb_keys):
            role = gen.roles[role_idx]
            axis = gen.axes[role.axis] if role.axis >= 0 else None
            send, recv = role.peers(axis, rank)
            chan = channel_base[(role.axis, role.lane)] + seg if role.axis >= 0 else 0
            tbs.append(Threadblock(t, send, recv, chan, tb_steps[t]))
        gpus.append(Gpu(rank, bufs["i"], bufs["o"], layout.s_used, tuple(tbs)))
    program = Program(
        name=plan.name or f"{plan.collective}-{plan.topology.label}", collective=plan.collective,
        protocol=plan.protocol, nchannels=nchannels, nchunksperloop=plan.nchunksperloop, ngpus=nranks,
        inplace=True, outofplace=True, min_bytes=plan.min_bytes, max_bytes=plan.max_bytes, gpus=tuple(gpus),
    )
    return program, overflow, nops_per_op


def _channels(cuts: dict[tuple[int, int], list[tuple[int, int, int]]]) -> tuple[dict[tuple[int, int], int], int]:
    """The first channel of every (axis, lane) (its segments take successive channels; lanes
    of one axis follow each other) and the number of channels."""
    segs_of = {key: len(c) + 1 for key, c in cuts.items()}
    channel_base: dict[tuple[int, int], int] = {}
    by_axis: dict[int, list[int]] = defaultdict(list)
    for axis, lane in sorted(segs_of):
        by_axis[axis].append(lane)
    nchannels = 1
    for axis, lanes in by_axis.items():
        base = 0
        for lane in sorted(lanes):
            channel_base[(axis, lane)] = base
            base += segs_of[(axis, lane)]
        nchannels = max(nchannels, base)
    return channel_base, nchannels


def _segments(ops: list[_Op], role_cuts: list[list[tuple[int, int, int]]]) -> list[int]:
    """Each op's segment of its role: how many of the role's cuts are at or before its tick."""
    out = []
    for op in ops:
        c = role_cuts[op.role]
        out.append(bisect_right(c, op.tick) if c else 0)
    return out


@dataclass(slots=True)
class _Graph:
    """One rank's units and the dependencies between them (by unit index)."""

    units: list[_Unit]
    tb_units: list[list[_Unit]]  # per threadblock, in order
    deps: list[set[int]]  # per unit: the units it waits for
    prev_in_tb: list[int]  # per unit: the unit before it in its threadblock, or -1
    forward: bool  # every unit comes after those it waits for (unit order is topological)


def _unit_graph(ops: list[_Op], tb_of_op: list[int], raw: list[list[int]], ntb: int,
                chains: list[tuple[int, int]]) -> _Graph:
    """Group a rank's ops into units, in op order, and collect their dependencies.

    A send that forwards what the receive just before it in its threadblock got (same
    data) fuses with it into one step. A unit waits for the units of its ops' raw
    dependencies, and the first unit of a role's segment for the last of the segment
    before (`chains`: (threadblock, previous segment's threadblock))."""
    tb_units: list[list[_Unit]] = [[] for _ in range(ntb)]
    unit_of = [0] * len(ops)
    units: list[_Unit] = []
    deps: list[set[int]] = []
    prev_in_tb: list[int] = []
    forward = True
    for idx, op in enumerate(ops):
        t = tb_of_op[idx]
        lst = tb_units[t]
        me = -1
        if lst and op.type == "s":
            prev = lst[-1]
            if len(prev.ops) == 1:
                pop = ops[prev.ops[0]]
                if pop.fuse and pop.dst == op.src and pop.cnt == op.cnt:
                    prev.ops.append(idx)
                    prev.type = {"rrc": "rrs" if pop.dead else "rrcs", "r": "rcs"}[pop.type]
                    if prev.type == "rrs":
                        prev.dst = None
                    me = prev.index
        if me < 0:
            me = len(units)
            u = _Unit(me, [idx], t, len(lst), op.type, op.src, op.dst, op.cnt)
            units.append(u)
            deps.append(set())
            prev_in_tb.append(lst[-1].index if lst else -1)
            lst.append(u)
        unit_of[idx] = me
        op_deps = raw[idx]
        if op_deps:
            found = deps[me]
            for d in op_deps:
                other = unit_of[d]
                if other != me:
                    found.add(other)
                    if other > me:
                        forward = False
    for t, prev_t in chains:
        if tb_units[prev_t] and tb_units[t]:
            first, last = tb_units[t][0].index, tb_units[prev_t][-1].index
            deps[first].add(last)
            if last > first:
                forward = False
    return _Graph(units, tb_units, deps, prev_in_tb, forward)


@dataclass(slots=True)
class _Layout:
    """Where a rank's units land: their step positions (after the nops before them)."""

    graph: _Graph
    pruned: list[list[int]]  # per unit: the units it names (the last in its step, the others in nops)
    step_of: list[int]  # per unit: its step's position in its threadblock
    nops: list[int]  # per op: the nops before its unit's step (0 for a fused send)
    tb_steps: list[int]  # steps per threadblock
    s_used: int = 0  # scratch chunks used


def _layout(graph: _Graph, pruned: list[list[int]], nops_total: int) -> _Layout:
    """Step positions: a step names one dependency; each other one takes a nop just before it."""
    step_of = [0] * len(graph.units)
    nops = [0] * nops_total
    tb_steps = []
    for lst in graph.tb_units:
        pos = 0
        for u in lst:
            extra = len(pruned[u.index]) - 1
            if extra > 0:
                pos += extra
                nops[u.ops[0]] = extra
            step_of[u.index] = pos
            pos += 1
        tb_steps.append(pos)
    return _Layout(graph, pruned, step_of, nops, tb_steps)


def _steps(layout: _Layout, slot_offset: Callable[[str, int], int]) -> list[tuple[Step, ...]]:
    """Every threadblock's steps."""
    units, pruned, step_of = layout.graph.units, layout.pruned, layout.step_of
    hasdep: set[int] = set()
    for deps in pruned:
        hasdep.update(deps)
    tb_of = [u.tb for u in units]
    out: list[tuple[Step, ...]] = []
    for lst in layout.graph.tb_units:
        steps: list[Step] = []
        for u in lst:
            deps = pruned[u.index]
            depid = dstep = -1
            if deps:
                targets = sorted(deps, key=lambda d: (tb_of[d], step_of[d])) if len(deps) > 1 else deps
                for d in targets[:-1]:
                    steps.append(Step(len(steps), "nop", "i", -1, "o", -1, 0, tb_of[d], step_of[d], False))
                depid, dstep = tb_of[targets[-1]], step_of[targets[-1]]
            srcbuf, srcoff = ("i", -1) if u.src is None or u.type == "rcs" else (u.src[0], slot_offset(*u.src))
            dstbuf, dstoff = ("o", -1) if u.dst is None or u.type == "s" else (u.dst[0], slot_offset(*u.dst))
            steps.append(Step(len(steps), u.type, srcbuf, srcoff, dstbuf, dstoff, u.cnt, depid, dstep, u.index in hasdep))
        out.append(tuple(steps))
    return out


def _prune(graph: _Graph, ntb: int) -> list[list[int]]:
    """Drop dependencies already implied by threadblock order or by other dependencies.

    Vector clocks: the clock of unit u holds, per threadblock t, the highest position of t
    known complete once u is (u's ancestors and u). A dependency stays unless the unit
    before u in its threadblock, or another dependency of u, implies it. Units are visited
    in a topological order of the dependency graph.

    Only a unit that keeps a dependency gets a clock of its own; the others share the
    clock of the unit before them in their threadblock, so a clock may lag in its owner's
    own threadblock: that entry is read as the owner's position instead (`_implied`).
    """
    units, unit_deps, prev_in_tb = graph.units, graph.deps, graph.prev_in_tb
    n = len(units)
    tb_of = [u.tb for u in units]
    pos_of = [u.pos for u in units]
    result: list[list[int]] = [[] for _ in range(n)]
    order = range(n) if graph.forward else _topological_order(unit_deps, prev_in_tb)
    nothing = np.full(ntb, -1, dtype=np.int64)
    clock = [nothing] * n
    for ui in order:
        deps = unit_deps[ui]
        prev = prev_in_tb[ui]
        known = clock[prev] if prev >= 0 else nothing
        clock[ui] = known
        if not deps:
            continue
        t = tb_of[ui]
        final = [d for d in deps if tb_of[d] != t and known[tb_of[d]] < pos_of[d]]
        if len(final) > 1 or (final and len(deps) > 1):
            final = [d for d in final if not _implied(d, deps, t, tb_of, pos_of, clock)]
        if final:
            # the clocks may lag in their owners' threadblocks: those entries are set exactly
            # (a final dependency is the latest known unit of its threadblock)
            row = np.maximum(known, clock[final[0]])
            for d in final[1:]:
                np.maximum(row, clock[d], out=row)
            for d in final:
                row[tb_of[d]] = pos_of[d]
            row[t] = pos_of[ui]
            clock[ui] = row
            result[ui] = final
    return result


def _implied(d: int, deps: set[int], t: int, tb_of: list[int], pos_of: list[int], clock: list[np.ndarray]) -> bool:
    """Whether another dependency (outside threadblock t) of a unit in t implies dependency d."""
    td, pd = tb_of[d], pos_of[d]
    for o in deps:
        if o != d:
            to = tb_of[o]
            if to != t and (pos_of[o] if to == td else clock[o][td]) >= pd:
                return True
    return False


def _topological_order(unit_deps: list[set[int]], prev_in_tb: list[int]) -> list[int]:
    """Units in an order where each comes after its dependencies and its threadblock
    predecessor (Kahn); PlanError on a cycle."""
    n = len(unit_deps)
    indeg = [0] * n
    succ: list[list[int]] = [[] for _ in range(n)]
    for ui in range(n):
        deps = unit_deps[ui]
        for p in deps:
            succ[p].append(ui)
        k = len(deps)
        prev = prev_in_tb[ui]
        if prev >= 0 and prev not in deps:
            succ[prev].append(ui)
            k += 1
        indeg[ui] = k
    order = [ui for ui in range(n) if indeg[ui] == 0]
    for ui in order:  # grows while it is walked
        for s in succ[ui]:
            indeg[s] -= 1
            if indeg[s] == 0:
                order.append(s)
    if len(order) != n:
        raise PlanError("internal error: the lowered program has a dependency cycle")
    return order
