"""Pass 1 of lowering: every rank's operations, in one logical order (the plan's schedule),
each on a role. The data layout (`_Cells`) says which base chunks hold whose cells; each
algorithm inside an axis (ring, both-way ring, direct exchange, one-shot) writes its own
sends, receives and reductions."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Iterable

from ..msccl.runtime import Limits, piece_count
from ..schedule.estimate import events
from ..schedule.plan import Plan, Stage, ring_axis, stage_algorithm
from .ops import TREE_ROLES, Axis, Op, Role


def _runs(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Ranges (start, length) with adjacent ones joined, in the order their first range came."""
    merged: list[list[int]] = []  # start, length, index of the first range
    for i, (start, length) in sorted(enumerate(ranges), key=lambda ir: ir[1]):
        if merged and merged[-1][0] + merged[-1][1] == start:
            merged[-1][1] += length
            merged[-1][2] = min(merged[-1][2], i)
        else:
            merged.append([start, length, i])
    return tuple((a, b) for a, b, _first in sorted(merged, key=lambda m: m[2]))


class _Cells:
    """Which base chunks hold the cells of which final owners (the data layout)."""

    def __init__(self, plan: Plan, axes: list[Axis]) -> None:
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
        owners = self._owners(order, depth, prefix, v, origin, chunk.lane_of(0))  # a flat chunk has one stage
        ranges: list[list[int]] = []
        for r in owners:
            start = r * self.block_units + self.offsets[k]
            if ranges and ranges[-1][0] + ranges[-1][1] == start:
                ranges[-1][1] += chunk.units
            else:
                ranges.append([start, chunk.units])
        return tuple((s, l) for s, l in ranges)

    def _owners(self, order: tuple[int, ...], depth: int, prefix: tuple[int, ...], v: int,
                origin: tuple[int, ...], lane: int = 0) -> list[int]:
        if self.plan.flat:
            return [self.axes[0].member(0, v, lane)]
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
            return tuple(self.axes[d].difference(topo.coord(r, d), base.get(d, 0)) for d in reversed(free))
        return sorted(owners, key=relative)


class Generator:
    """Builds every rank's logical operation list for a plan."""

    def __init__(self, plan: Plan, limits: Limits) -> None:
        self.plan = plan
        self.limits = limits
        self.topology = plan.topology
        self.axes = [Axis(plan.topology, plan.flat, a, plan.fold if a == 0 else ()) for a in range(plan.naxes)]
        self.cells = _Cells(plan, self.axes)
        self.roles: list[Role] = []
        self.role_index: dict[tuple[int, int, str, int, str], int] = {}
        self.piece_memo: dict[tuple, list[tuple[int, int]]] = {}
        self.nch = plan.nchunksperloop
        self.ring_pieces = piece_count(plan.protocol, plan.max_bytes, self.nch, ring=True)
        self.direct_pieces = piece_count(plan.protocol, plan.max_bytes, self.nch, ring=False)
        self.events = events(plan)
        self.ndepth = plan.naxes

    def role(self, axis: int, lane: int, algorithm: str, offset: int, side: str) -> int:
        key = (axis, lane, algorithm, offset, side)
        index = self.role_index.get(key)
        if index is None:
            index = self.role_index[key] = len(self.roles)
            self.roles.append(Role(*key))
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
        if sum(length for _start, length in ranges) <= size:
            # one piece: its cells' runs, whatever order the owners come in, so that every
            # rank sends as many messages (owners 3, 2 would otherwise be two ranges, 2, 3 one)
            return self.pieces(_runs(ranges), fused, ring)
        if self.plan.collective != "allreduce" or self.plan.flat or depth + 1 >= len(order):
            return self.pieces(ranges, fused, ring)
        n_next = self.axes[order[depth + 1]].size
        out: list[tuple[int, int]] = []
        for t in range(n_next):
            out += self.block_pieces(k, depth + 1, prefix + (v,), (origin[0] + t) % n_next, origin[1:], fused, ring)
        return out

    def generate(self, rank: int) -> list[Op]:
        ops: list[Op] = []
        plan = self.plan
        if plan.collective == "allgather":
            b = self.cells.block_units
            local = self.role(-1, 0, "local", 0, "local")
            for off in range(0, b, self.limits.max_count):
                cnt = min(self.limits.max_count, b - off)
                ops.append(Op(local, (-1, 0, 0), "cpy", ("i", rank * b + off), ("o", rank * b + off), cnt))
        for e, (k, j) in enumerate(self.events):
            self._stage(ops, rank, e, k, j)
        return ops

    def _stage(self, ops: list[Op], x: int, e: int, k: int, j: int) -> None:
        plan = self.plan
        chunk = plan.chunks[k]
        st = plan.stages(k)[j]
        axis = self.axes[st.axis]
        alg = stage_algorithm(plan, st)
        lane = chunk.lane_of(j)
        n, p = axis.size, axis.pos(x, lane)
        prefix = tuple(self.axes[a].pos(x) for a in chunk.order[: st.depth])
        origin = tuple(self.axes[a].pos(x) for a in chunk.order[st.depth + 1:])
        fused = plan.layouts[st.axis] == "fused"
        ring = ring_axis(plan, st.axis)
        blocks = [self.block_pieces(k, st.depth, prefix, v, origin, fused, alg in ("ring", "bidir")) for v in range(n)]
        if alg == "tree":
            self._tree(ops, x, e, n, k, st, prefix, origin, lane, 0 if chunk.direction == 1 else 1)
        elif alg == "oneshot" and ring:
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
                        start, cnt = blocks[axis.add(p, delta)][i]
                        ops.append(Op(send_roles[delta - 1], (e, i, 0), "s", (inp, start), None, cnt))
                        if fused:
                            start, cnt = blocks[p][i]
                            local = inp if delta == 1 else own
                            ops.append(Op(recv_roles[delta - 1], (e, i, 0), "rrc", (local, start), (own, start), cnt))
                    if not fused:
                        for delta in range(1, n):
                            start, cnt = blocks[p][i]
                            local = inp if delta == 1 else own
                            ops.append(Op(recv_roles[delta - 1], (e, i, 0), "rrc", (local, start), (own, start), cnt))
                if st.kind in ("ag", "ar"):
                    rnd = 1 if st.kind == "ar" else 0
                    src = "o" if st.kind == "ar" else self.ag_source(st.depth)
                    for delta in range(1, n):
                        start, cnt = blocks[p][i]
                        ops.append(Op(send_roles[delta - 1], (e, i, rnd), "s", (src, start), None, cnt))
                        if fused:
                            start, cnt = blocks[axis.add(p, delta)][i]
                            ops.append(Op(recv_roles[delta - 1], (e, i, rnd), "r", None, ("o", start), cnt))
                    if not fused:
                        for delta in range(1, n):
                            start, cnt = blocks[axis.add(p, delta)][i]
                            ops.append(Op(recv_roles[delta - 1], (e, i, rnd), "r", None, ("o", start), cnt))

    def _oneshot(self, ops: list[Op], e: int, n: int, k: int, st: Stage, prefix: tuple[int, ...],
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
                ops.append(Op(send_roles[delta - 1], (e, i, 0), "s", (inp, start), None, cnt))
                if fused:
                    ops.append(Op(recv_roles[delta - 1], (e, i, 0), "r", None, ("s", self.scratch(delta - 1, start)), cnt))
            if not fused:
                for delta in range(1, n):
                    ops.append(Op(recv_roles[delta - 1], (e, i, 0), "r", None, ("s", self.scratch(delta - 1, start)), cnt))
            if inp != "o":
                ops.append(Op(recv_roles[0], (e, i, 1), "cpy", (inp, start), ("o", start), cnt))
            for delta in range(1, n):
                ops.append(Op(recv_roles[delta - 1], (e, i, 1), "re", ("s", self.scratch(delta - 1, start)), ("o", start), cnt))

    def _tree(self, ops: list[Op], x: int, e: int, n: int, k: int, st: Stage, prefix: tuple[int, ...],
              origin: tuple[int, ...], lane: int, tree: int) -> None:
        """All-reduce of the owned range over a tree, piece by piece: each rank reduces its
        children's partial sums into its own and sends the result to its parent (round 0);
        the root's total then flows back down, each rank passing it on to its children
        (round 1). Each link's upward and downward traffic run on threadblocks of their own,
        so the next piece climbs while the last one comes down; tree 1 runs on lanes (and
        channels) apart from tree 0's, as a both-way ring's other direction does."""
        axis = self.axes[st.axis]
        parent, children = axis.tree_links(x, tree, lane)
        lane = lane if tree == 0 else -1 - lane  # the trees share links (the chains)
        base = tree * TREE_ROLES
        inp, own = self.rs_input(st.depth), "o"
        for i, (start, cnt) in enumerate(self._owned_pieces(n, k, st, prefix, origin, False, False)):
            for c in range(len(children)):
                role = self.role(st.axis, lane, "tree", base + 1 + c, "recv")
                ops.append(Op(role, (e, i, 0), "rrc", (inp if c == 0 else own, start), (own, start), cnt))
            if parent >= 0:
                ops.append(Op(self.role(st.axis, lane, "tree", base, "send"), (e, i, 0), "s",
                              (own if children else inp, start), None, cnt))
                ops.append(Op(self.role(st.axis, lane, "tree", base, "recv"), (e, i, 1), "r", None, (own, start), cnt))
            for c in range(len(children)):
                ops.append(Op(self.role(st.axis, lane, "tree", base + 1 + c, "send"), (e, i, 1), "s", (own, start), None, cnt))

    def _owned_pieces(self, n: int, k: int, st: Stage, prefix: tuple[int, ...], origin: tuple[int, ...],
                      fused: bool, ring: bool) -> list[tuple[int, int]]:
        """The whole range a rank owns before the last axis's all-reduce, cut into pieces."""
        return self.pieces(_runs(sorted(r for v in range(n) for r in self.cells.block(k, st.depth, prefix, v, origin))),
                           fused, ring)

    def _ring_oneshot(self, ops: list[Op], e: int, n: int, k: int, st: Stage, prefix: tuple[int, ...],
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
                ops.append(Op(send, (e, i, 0), "s", (inp, start), None, cnt))
                for t in range(1, rounds[d] + 1):
                    dst = ("s", self.scratch_slot(d, t, start))
                    last = t == rounds[d]
                    ops.append(Op(recv, (e, i, t - 1), "r", None, dst, cnt, fuse=not last))
                    if not last:
                        ops.append(Op(send, (e, i, t), "s", dst, None, cnt))
            first = True
            for d in (direction, -direction):
                _send, recv = roles[d]
                if first and inp != "o":
                    ops.append(Op(recv, (e, i, n), "cpy", (inp, start), ("o", start), cnt))
                first = False
                for t in range(1, rounds[d] + 1):
                    ops.append(Op(recv, (e, i, n), "re", ("s", self.scratch_slot(d, t, start)), ("o", start), cnt))

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

    def _bidir_rs(self, ops: list[Op], e: int, i: int, n: int, p: int, d: int, blocks: list, st: Stage,
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
            ops.append(Op(send_role, (e, i, 0), "s", (inp, start), None, cnt))
            for t in range(length):
                start, cnt = blocks[(p + (length - 1 - t) * dd) % n][i]
                last = t == length - 1
                # the final reduce is not fused with an all-gather send: that step would only
                # complete when its message arrives, holding back the other direction's send
                src = src_final if last else inp
                ops.append(Op(recv_role, (e, i, t), "rrc", (src, start), (own if last else land, start), cnt,
                               fuse=not last, dead=not last))
                if not last:
                    ops.append(Op(send_role, (e, i, t + 1), "s", (land, start), None, cnt))
            src_final = own
        return n // 2

    def _bidir_ag(self, ops: list[Op], e: int, i: int, n: int, p: int, d: int, blocks: list, st: Stage,
                  roles: dict[int, tuple[int, int]], r0: int) -> None:
        """All-gather along both ring directions: block v travels n // 2 ranks one way and
        (n - 1) // 2 the other."""
        src = "o" if st.kind == "ar" else self.ag_source(st.depth)
        for dd, length in ((d, n // 2), (-d, (n - 1) // 2)):
            send_role, recv_role = roles[dd]
            start, cnt = blocks[p][i]
            ops.append(Op(send_role, (e, i, r0), "s", (src, start), None, cnt))
            for t in range(length):
                start, cnt = blocks[(p - (t + 1) * dd) % n][i]
                last = t == length - 1
                ops.append(Op(recv_role, (e, i, r0 + t), "r", None, ("o", start), cnt, fuse=not last))
                if not last:
                    ops.append(Op(send_role, (e, i, r0 + t + 1), "s", ("o", start), None, cnt))

    def _ring_rs(self, ops: list[Op], e: int, i: int, n: int, p: int, d: int, blocks: list, st: Stage,
                 send_role: int, recv_role: int) -> int:
        inp, land, own = self.rs_input(st.depth), self.rs_landing(), self.rs_owned(st.depth)
        start, cnt = blocks[(p - d) % n][i]
        ops.append(Op(send_role, (e, i, 0), "s", (inp, start), None, cnt))
        for t in range(n - 1):
            start, cnt = blocks[(p - d * (t + 2)) % n][i]
            last = t == n - 2
            fuse = not last or st.kind == "ar"
            ops.append(Op(recv_role, (e, i, t), "rrc", (inp, start), (own if last else land, start), cnt,
                           fuse=fuse, dead=not last))
            if not last:
                ops.append(Op(send_role, (e, i, t + 1), "s", (land, start), None, cnt))
        return n - 1

    def _ring_ag(self, ops: list[Op], e: int, i: int, n: int, p: int, d: int, blocks: list, st: Stage,
                 send_role: int, recv_role: int, r0: int) -> None:
        src = "o" if st.kind == "ar" else self.ag_source(st.depth)
        start, cnt = blocks[p][i]
        ops.append(Op(send_role, (e, i, r0), "s", (src, start), None, cnt))
        for t in range(n - 1):
            start, cnt = blocks[(p - d * (t + 1)) % n][i]
            last = t == n - 2
            ops.append(Op(recv_role, (e, i, r0 + t), "r", None, ("o", start), cnt, fuse=not last))
            if not last:
                ops.append(Op(send_role, (e, i, r0 + t + 1), "s", ("o", start), None, cnt))
