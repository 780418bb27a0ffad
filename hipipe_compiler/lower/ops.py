"""The vocabulary lowering's passes share: an axis (a group structure over the ranks), an
operation (one send, receive, reduce or copy of a rank, before fusion) and a role (the
logical threadblock an operation runs on)."""

from __future__ import annotations

from dataclasses import dataclass

from ..schedule.trees import binary_tree, nccl_tree
from ..topology import Topology

#: Roles per tree: the link to the parent and one per child (NCCL's tree has up to three).
TREE_ROLES = 4


class Axis:
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

    def tree_links(self, rank: int, tree: int) -> tuple[int, tuple[int, ...]]:
        """(parent or -1, children) of a rank in tree 0 or 1 of this axis: NCCL's tree over
        every rank on a flat axis, a binary tree over the positions of a dimension."""
        if self.flat:
            parent, children = nccl_tree(self.topology, tree)
            return parent[rank], children[rank]
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

    def peers(self, axis: Axis | None, rank: int) -> tuple[int, int]:
        if axis is None:
            return -1, -1
        if self.algorithm == "tree":  # offset: tree * TREE_ROLES + (0: the parent, 1 + i: child i)
            tree, relation = divmod(self.offset, TREE_ROLES)
            parent, children = axis.tree_links(rank, tree)
            peer = parent if relation == 0 else children[relation - 1]
            return (peer, -1) if self.side == "send" else (-1, peer)
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
