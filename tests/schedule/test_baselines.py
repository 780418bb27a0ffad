"""The baseline plans: hierarchical, flat ring, and their default orders and directions."""

import pytest
from hypothesis import given

from hipipe_compiler.schedule import hierarchical_plan, ring_plan
from hipipe_compiler.errors import PlanError
from hipipe_compiler.schedule.baselines import bandwidth_order, tree_plan
from hipipe_compiler.schedule.trees import nccl_tree_fits
from hipipe_compiler.topology import Dimension, Topology, preset

from conftest import topologies


def test_bandwidth_order_puts_the_fastest_dimension_first():
    assert bandwidth_order(preset("dgx-h100-8x4")) == (0, 1)
    assert bandwidth_order(preset("torus-4x4x4")) == (0, 1, 2)


@given(topologies(max_ranks=64))
def test_hierarchical_plan_uses_both_ring_directions(topo):
    plan = hierarchical_plan(topo, "allreduce", chunks=2)
    rings = any(d.kind == "ring" and d.size >= 3 for d in topo.dimensions)
    assert {c.direction for c in plan.chunks} == ({1, -1} if rings else {1})
    assert len(plan.chunks) == (4 if rings else 2)
    assert plan.nchunksperloop == plan.units * topo.nranks


def test_ring_plan_is_flat():
    plan = ring_plan(preset("torus-4x4"), "allreduce", chunks=3)
    assert plan.flat and plan.naxes == 1 and len(plan.chunks) == 3 and plan.algorithms == ("ring",)


def test_nccl_tree_only_where_its_links_exist():
    torus = Topology((Dimension(4, "ring", 100, 0.5), Dimension(4, "ring", 100, 0.5)), name="t4x4")
    assert not nccl_tree_fits(torus)
    with pytest.raises(PlanError, match="NCCL's tree needs links t4x4 lacks"):
        tree_plan(torus)
    assert tree_plan(preset("dgx-h100-8x4"), chunks=2).chunks[1].direction == -1  # pairs: one per tree
