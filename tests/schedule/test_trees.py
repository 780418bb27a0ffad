"""Trees for latency-bound all-reduces: NCCL's double binary tree and its chain-and-trees."""

import math

from hypothesis import given
from hypothesis import strategies as st

from hipipe_compiler.schedule.trees import binary_tree, nccl_tree, tree_depth
from hipipe_compiler.topology import Dimension, Topology

from conftest import c1p


def reaches_root(parent: tuple[int, ...]) -> bool:
    for p in range(len(parent)):
        seen, q = set(), p
        while parent[q] >= 0:
            if q in seen:
                return False
            seen.add(q)
            q = parent[q]
    return sum(1 for up in parent if up < 0) == 1


@given(st.integers(1, 600))
def test_two_complementary_binary_trees(n):
    trees = [binary_tree(n, t) for t in (0, 1)]
    for parent, children in trees:
        assert reaches_root(parent)
        assert all(len(c) <= 2 for c in children)
        assert tree_depth(parent) == (n.bit_length() - 1)  # log2(n), rounded down
        assert all(parent[c] == p for p, cs in enumerate(children) for c in cs)
    inner = [{p for p, c in enumerate(children) if c} for _parent, children in trees]
    # no position is an inner node of both trees but the middle one of an odd count
    assert len(inner[0] & inner[1]) <= 1


def test_ncc_tree_chains_each_node_and_joins_the_nodes_first_ranks():
    topo = c1p(4)
    for tree in (0, 1):
        parent, children = nccl_tree(topo, tree)
        assert reaches_root(parent)
        for r in range(32):
            if r % 8:
                assert parent[r] == r - 1  # up the chain inside the node
            else:
                assert parent[r] == -1 or parent[r] % 8 == 0  # nodes meet at their first ranks
        assert tree_depth(parent) == 7 + math.floor(math.log2(4))
    roots = [nccl_tree(topo, t)[0].index(-1) for t in (0, 1)]
    assert roots[0] != roots[1]  # the two trees differ across the nodes


def test_a_single_node_tree_is_its_chain():
    parent, _children = nccl_tree(Topology((Dimension(4, "switch", 100, 1.0),)), 0)
    assert parent == (-1, 0, 1, 2)
