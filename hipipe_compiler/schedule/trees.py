"""Trees for latency-bound all-reduces: reduce up to a root, broadcast back down, so a message
crosses about 2 log2(n) links instead of n - 1.

Two complementary binary trees (NCCL's double binary tree) each carry half of the data: a
rank that is an inner node of one is mostly a leaf of the other, so no rank sends twice its
share. `binary_tree` builds them over the n positions of one dimension; `nccl_tree` builds
NCCL's own all-reduce tree over every rank: a chain through each node's GPUs (the innermost
dimension), and the double binary tree across the nodes' first GPUs.

>>> parent, children = binary_tree(7, 0)
>>> parent[:4], children[0], children[1]
((-1, 0, 0, 1), (1, 2), (3, 4))
>>> binary_tree(7, 1)[0]  # the mirror image: position p plays 6 - p, and 6 is the root
(4, 4, 5, 5, 6, 6, -1)
>>> tree_depth(binary_tree(7, 0)[0])
2
"""

from __future__ import annotations

from functools import lru_cache

from ..topology import Topology
from .plan import Plan

#: (parent of each position or -1 for the root, children of each position)
Tree = tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]


@lru_cache(maxsize=256)
def binary_tree(n: int, tree: int) -> Tree:
    """Tree 0: heap order over positions 0..n-1 (the root is 0, the children of p are 2p+1
    and 2p+2). Tree 1: its mirror image (position p takes the place of n-1-p), whose leaves
    are tree 0's inner nodes."""
    heap_parent = [(p - 1) // 2 if p else -1 for p in range(n)]
    place = (lambda p: p) if tree == 0 else (lambda p: n - 1 - p)
    parent = [-1] * n
    for p in range(n):
        up = heap_parent[place(p)]
        parent[p] = -1 if up < 0 else place(up)
    return _with_children(parent)


@lru_cache(maxsize=64)
def nccl_tree(topology: Topology, tree: int) -> Tree:
    """NCCL's all-reduce tree over every rank (by rank number): in each node (the ranks that
    share every coordinate but the innermost) a chain from its first rank to its last, and
    between the nodes' first ranks binary tree `tree` over the node index."""
    n0 = topology.dimensions[0].size
    nodes = topology.nranks // n0
    head_parent, _ = binary_tree(nodes, tree) if nodes > 1 else ((-1,), ((),))
    parent = [-1] * topology.nranks
    for r in range(topology.nranks):
        node, local = divmod(r, n0)
        if local:
            parent[r] = r - 1  # up the chain toward the node's first rank
        elif head_parent[node] >= 0:
            parent[r] = head_parent[node] * n0
    return _with_children(parent)


def nccl_tree_fits(topology: Topology) -> bool:
    """Whether every link of both of NCCL's trees exists (rings join only neighbours, so a
    torus outside the innermost dimension has none to spare)."""
    return all(topology.has_link(r, up) for tree in (0, 1)
               for r, up in enumerate(nccl_tree(topology, tree)[0]) if up >= 0)


def _with_children(parent: list[int]) -> Tree:
    children: list[list[int]] = [[] for _ in parent]
    for p, up in enumerate(parent):
        if up >= 0:
            children[up].append(p)
    return tuple(parent), tuple(tuple(c) for c in children)


def tree_depth(parent: tuple[int, ...]) -> int:
    """Links from the deepest position to the root."""
    depth = 0
    for p in range(len(parent)):
        d, q = 0, p
        while parent[q] >= 0:
            q, d = parent[q], d + 1
        depth = max(depth, d)
    return depth


def stage_tree(plan: Plan, axis: int, direction: int) -> Tree:
    """The tree a chunk of ring direction `direction` all-reduces over on `axis`: by position
    on a dimension, by rank on a flat plan (NCCL's tree)."""
    tree = 0 if direction == 1 else 1
    return nccl_tree(plan.topology, tree) if plan.flat else binary_tree(plan.axis_size(axis), tree)
