"""The baseline plans: hierarchical, flat ring, and their default orders and directions."""

from hypothesis import given

from hipipe_compiler.schedule import hierarchical_plan, ring_plan
from hipipe_compiler.schedule.baselines import bandwidth_order
from hipipe_compiler.topology import preset

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
