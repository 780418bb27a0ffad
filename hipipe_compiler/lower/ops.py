"""The vocabulary lowering's passes share: an axis (a group structure over the ranks), an
operation (one send, receive, reduce or copy of a rank, before fusion) and a role (the
logical threadblock an operation runs on)."""

from __future__ import annotations

from dataclasses import dataclass

from ..schedule.fold import fold_add, fold_sub
from ..schedule.trees import binary_tree, nccl_tree
from ..topology import Topology

#: Roles per tree: the link to the parent and one per child (NCCL's tree has up to three).
TREE_ROLES = 4


class Axis:
    """A group structure: every rank has a position on the axis and a group of `size` ranks.

    On a flat axis, lane l's ring runs through the cycle translated by rank l's coordinates
    (a translation keeps every link), so that lanes, like NCCL's channels, cross each
    dimension through different ports; lane 0 runs Topology.ring_order itself.
    """

    def __init__(self, topology: Topology, flat: bool, index: int, fold: tuple[int, ...] = ()) -> None:
        self.topology = topology
        self.flat = flat
        self.index = index
        self.fold = fold
        if flat:
            self.cycle = topology.ring_order()
            self.position = {r: i for i, r in enumerate(self.cycle)}
            self.size = topology.nranks
        else:
            self.size = topology.dimensions[index].size

    def pos(self, rank: int, lane: int = 0) -> int:
        if self.flat:
            return self.position[self._translate(rank, lane, -1)]
        return self.topology.coord(rank, self.index)

    def add(self, pos: int, offset: int) -> int:
        """The position `offset` further on: digit by digit on a folded axis (fold.py), so
        that every rank's peers lie in the same directions of the network."""
        return fold_add(pos, offset, self.fold) if self.fold else (pos + offset) % self.size

    def difference(self, pos: int, origin: int) -> int:
        """The offset from `origin` to `pos`: the inverse of add."""
        return fold_sub(pos, origin, self.fold) if self.fold else (pos - origin) % self.size

    def member(self, rank: int, pos: int, lane: int = 0) -> int:
        pos %= self.size
        if self.flat:
            return self._translate(self.cycle[pos], lane, 1)
        return self.topology.shift(rank, self.index, pos - self.topology.coord(rank, self.index))

    def _translate(self, rank: int, lane: int, sign: int) -> int:
        """`rank` moved by sign times the coordinates of rank `lane` (mod each dimension). Roles
        on lane -1 - l serve lane l's chunks: pass Role.chunk_lane, never a role's own lane."""
        if lane < 0:
            raise ValueError(f"lane {lane}: translate by a chunk's lane (Role.chunk_lane)")
        if lane == 0:
            return rank
        topo = self.topology
        by = topo.coords(lane % topo.nranks)
        return topo.rank([(c + sign * t) % d.size for c, t, d in zip(topo.coords(rank), by, topo.dimensions)])

    def tree_links(self, rank: int, tree: int, lane: int = 0) -> tuple[int, tuple[int, ...]]:
        """(parent or -1, children) of a rank in tree 0 or 1 of this axis: NCCL's tree over
        every rank on a flat axis (translated on lane `lane`, as rings are), a binary tree
        over the positions of a dimension."""
        if self.flat:
            parent, children = nccl_tree(self.topology, tree)
            home = self._translate(rank, lane, -1)
            up = parent[home]
            return ((self._translate(up, lane, 1) if up >= 0 else -1),
                    tuple(self._translate(c, lane, 1) for c in children[home]))
        parent, children = binary_tree(self.size, tree)
        p = self.pos(rank)
        up = parent[p]
        return (self.member(rank, up) if up >= 0 else -1), tuple(self.member(rank, c) for c in children[p])


@dataclass(slots=True)
class Op:
    """One operation of a rank: `tick` orders it and matches the two ends of a message."""

    role: int
    tick: tuple[int, int, int]  # (event, piece, round): equal on both ends of a message
    type: str  # s, r, rrc, cpy
    src: tuple[str, int] | None
    dst: tuple[str, int] | None
    cnt: int
    fuse: bool = False  # a receive whose data the role's next operation sends on
    dead: bool = False  # the receive's local write is read by nothing but that send


@dataclass(frozen=True)
class Role:
    """A logical threadblock: an axis (-1: local work), a lane, an algorithm, a ring direction
    or peer offset, and which sides (send, receive) it takes."""

    axis: int  # -1 for local work
    lane: int
    algorithm: str  # ring, direct, tree, local
    offset: int  # ring direction, peer offset for direct, tree and relation for a tree
    side: str  # both, send, recv, local

    @property
    def chunk_lane(self) -> int:
        """The lane of the chunks this role serves: a chunk's other ring direction and its
        second tree run on roles of lane -1 - lane, and a flat axis translates by the chunk's lane."""
        return self.lane if self.lane >= 0 else -1 - self.lane

    @property
    def group(self) -> tuple[int, int, int]:
        """The channels this role's threadblocks take: those of its axis and lane, apart for a
        tree's roles, which would otherwise receive from a peer on the same channel as the
        direct stages of other chunks on that axis."""
        return self.axis, self.lane, int(self.algorithm == "tree")

    def peers(self, axis: Axis | None, rank: int) -> tuple[int, int]:
        if axis is None:
            return -1, -1
        if self.algorithm == "tree":  # offset: tree * TREE_ROLES + (0: the parent, 1 + i: child i)
            tree, relation = divmod(self.offset, TREE_ROLES)
            parent, children = axis.tree_links(rank, tree, self.chunk_lane)
            peer = parent if relation == 0 else children[relation - 1]
            return (peer, -1) if self.side == "send" else (-1, peer)
        lane = self.chunk_lane
        p = axis.pos(rank, lane)
        if self.algorithm == "ring":
            send, recv = axis.member(rank, p + self.offset, lane), axis.member(rank, p - self.offset, lane)
        else:
            send = recv = axis.member(rank, axis.add(p, self.offset), lane)
        if self.side == "send":
            recv = -1
        elif self.side == "recv":
            send = -1
        return send, recv
