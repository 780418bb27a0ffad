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
This module generates the operations and drives the passes; emission.py holds passes 2-5.

>>> from hipipe_compiler.topology import preset
>>> from hipipe_compiler.plan import hierarchical_plan
>>> program = lower(hierarchical_plan(preset("dgx-h100-8x2"), "allreduce", max_bytes=1 << 20))
>>> program.ngpus, program.nchunksperloop, program.max_steps <= 64
(16, 16, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Sequence

from .collector import paused
from .errors import PlanError
from .emission import (
    Layout, check_nodes, check_threadblocks, emit, footprint, fusing_sends, raw_dependencies, segment_cuts,
)
from .plan import Plan, Stage, check_plan, largest_blocks, ring_axis, stage_algorithm
from .program import Program
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
        self.role_index: dict[tuple[int, int, str, int, str], int] = {}
        self.piece_memo: dict[tuple, list[tuple[int, int]]] = {}
        self.nch = plan.nchunksperloop
        self.ring_pieces = piece_count(plan.protocol, plan.max_bytes, self.nch, ring=True)
        self.direct_pieces = piece_count(plan.protocol, plan.max_bytes, self.nch, ring=False)
        self.events = plan.events()
        self.ndepth = plan.naxes

    def role(self, axis: int, lane: int, algorithm: str, offset: int, side: str) -> int:
        key = (axis, lane, algorithm, offset, side)
        index = self.role_index.get(key)
        if index is None:
            index = self.role_index[key] = len(self.roles)
            self.roles.append(_Role(*key))
        return index

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
        offsets would make piece i depend on different peers on different ranks.

        Memoised (the all-gather of a block cuts it as its reduce-scatter did); callers must
        not change the list."""
        key = (k, depth, prefix, v, origin, fused, ring)
        out = self.piece_memo.get(key)
        if out is None:
            out = self.piece_memo[key] = self._block_pieces(k, depth, prefix, v, origin, fused, ring)
        return out

    def _block_pieces(self, k: int, depth: int, prefix: tuple[int, ...], v: int, origin: tuple[int, ...],
                      fused: bool, ring: bool) -> list[tuple[int, int]]:
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
        ring = ring_axis(plan, st.axis)
        alg = stage_algorithm(plan, st)
        blocks = [self.block_pieces(k, st.depth, prefix, v, origin, fused, alg in ("ring", "bidir")) for v in range(n)]
        lane = chunk.lane_of(j)
        if alg == "oneshot" and ring:
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
            roles = self._both_ways_roles(st.axis, lane, d, fused)
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
        roles = self._both_ways_roles(st.axis, lane, direction, fused)
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

    def _both_ways_roles(self, axis: int, lane: int, direction: int, fused: bool) -> dict[int, tuple[int, int]]:
        """Roles of a chunk that uses both ring directions: its own direction on its lane, the
        other on threadblocks (and channels) of their own (lane -1 - lane), so that it runs
        beside the mirrored chunk's main direction on that link instead of after it."""
        return {direction: self._ring_roles(axis, lane, direction, fused),
                -direction: self._ring_roles(axis, -1 - lane, -direction, fused)}

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


# -- the passes -------------------------------------------------------------------------------


def lowering_key(plan: Plan) -> tuple[Any, ...]:
    """Plans with equal keys lower to the same program apart from the window.

    The window enters only through the piece limits, and those cut nothing at or above the
    largest block: windows whose limits are all that large share the key (and the program)."""
    n = plan.nchunksperloop
    cap = max(largest_blocks(plan.topology, plan.flat, plan.chunks, plan.algorithms))
    return (replace(plan, min_bytes=0, max_bytes=0, nominal_bytes=0, schedule=plan.events()),
            min(cap, piece_count(plan.protocol, plan.max_bytes, n, True)),
            min(cap, piece_count(plan.protocol, plan.max_bytes, n, False)))


def lower(plan: Plan, limits: Limits = Limits(), ranks: Sequence[int] | None = None) -> Program:
    """Lower a plan to a Program within the runtime limits, or raise PlanError saying why not.

    With `ranks`, only those ranks' gpus are built (a partial program for estimates, such as
    simulate(..., quotient=True) on rank 0; never written out).
    """
    with paused():
        return _lower(plan, limits, ranks)


def same_schedule(plan: Plan, ranks: Sequence[int], limits: Limits = Limits()) -> bool:
    """Whether each of `ranks` generates rank 0's operations (roles, ticks, types, counts and
    fusions) with rank 0's dependencies. Lowering then gives them rank 0's program shifted
    (simulate.symmetric), so rank 0 alone times the plan exactly; checked without emitting.

    >>> from hipipe_compiler.plan import hierarchical_plan
    >>> from hipipe_compiler.topology import preset
    >>> same_schedule(hierarchical_plan(preset("torus-4x4"), chunks=2, max_bytes=1 << 20), [5, 15])
    True
    """
    with paused():
        gen = _Generator(plan, limits)
        first = None
        for rank in (0, *ranks):
            ops = gen.generate(rank)
            shape = [(op.role, op.tick, op.type, op.cnt, op.fuse, op.dead, f) for op, f in zip(ops, fusing_sends(ops))]
            signature = (shape, raw_dependencies(plan, ops))
            if first is None:
                first = signature
            elif signature != first:
                return False
    return True


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
    # what the first rank needs at least, before the costly passes: many candidates fail here
    first_cuts = segment_cuts(gen, per_rank_ops[:1], {}, [[0] * len(per_rank_ops[0])])
    ntb, rank_nodes = footprint(gen, per_rank_ops[0], first_cuts)
    check_threadblocks(ntb, limits, floor=True)
    check_nodes(plan.topology.nranks, rank_nodes, limits, floor=True)
    raw = [raw_dependencies(plan, ops) for ops in per_rank_ops]

    # Segment with rank 0 alone first (cheap), then emit every rank with those budgets; ranks
    # whose dependencies need a few more nops make another round.
    budgets: dict[tuple[int, int], int] = {}
    first: list[tuple[Any, Layout]] = []  # the first rank's last layout and its cuts: emit reuses it
    probe = ([chosen[0]], per_rank_ops[:1], raw[:1])
    extra = [[0] * len(per_rank_ops[0])]
    for phase in ("probe", "all"):
        ranks_, ops_, raw_ = probe if phase == "probe" else (chosen, per_rank_ops, raw)
        if phase == "all":
            extra = [list(extra[0]) if len(ops) == len(extra[0]) else [0] * len(ops) for ops in per_rank_ops]
        # the probe's program is only kept when it is the whole answer
        build = phase == "all" or len(chosen) == 1
        for attempt in range(12):
            cuts = first_cuts if phase == "probe" and attempt == 0 else segment_cuts(gen, ops_, budgets, extra)
            program, overflow, nops = emit(plan, gen, ranks_, ops_, raw_, cuts, limits, build, first)
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

