"""The baseline plans: hierarchical, flat ring, and their default orders and directions."""

import pytest
from hypothesis import given

from hipipe_compiler.schedule import hierarchical_plan, ring_plan
from hipipe_compiler.errors import PlanError
from hipipe_compiler.lower import lower
from hipipe_compiler.schedule.baselines import bandwidth_order, nccl_channels, nccl_plan, tree_plan
from hipipe_compiler.sim import simulate
from hipipe_compiler.schedule.trees import nccl_tree_fits
from hipipe_compiler.topology import Dimension, Topology
from hipipe_compiler.presets import preset

from conftest import topologies, c1p


def test_bandwidth_order_puts_the_fastest_dimension_first():
    assert bandwidth_order(c1p(4)) == (0, 1)
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


def test_nccl_ring_crosses_the_network_through_every_port_of_a_node():
    """One channel's ring leaves each node through one GPU's NIC; NCCL's channels, one per GPU
    of a node, leave through all of them, so the network's whole bandwidth is used."""
    topo = c1p(4)
    assert nccl_channels(topo) == 8 and nccl_channels(preset("torus-4x4x4")) == 16
    senders = {}
    for plan in (ring_plan(topo, "allreduce", 1), nccl_plan(topo, "ring", "allreduce")):
        program = lower(plan)
        senders[plan.label] = {gpu.id for gpu in program.gpus for tb in gpu.threadblocks
                               if tb.send >= 0 and topo.coord(tb.send, 1) != topo.coord(gpu.id, 1)}
    assert len(senders["ring"]) == 4  # one GPU per node
    assert len(senders["nccl-ring-Simple"]) == 32  # every GPU


def test_nccl_ring_takes_the_time_of_algorithms_md_5_9():
    """T = 2(N-1) alpha_max + 2(N-1)/N M max_i c_i / B_i, with C = 8 rings, one per NIC of a
    node: a fraction c_NIC = 1/C of each GPU's ring edges on its NIC, (C-1)/C on NVLink."""
    topo = c1p(4)
    nvlink, network = topo.dimensions
    n, m, c = topo.nranks, 1 << 30, nccl_channels(topo)
    per_byte = max((c - 1) / c / (nvlink.bandwidth * 1e3), 1 / c / (network.bandwidth * 1e3))  # us per byte
    model = 2 * (n - 1) * network.alpha("Simple") + 2 * (n - 1) / n * m * per_byte
    simulated = simulate(lower(nccl_plan(topo, "ring", "allreduce", max_bytes=m)), topo, m).time_us
    assert simulated == pytest.approx(model, rel=0.01)
    single = simulate(lower(ring_plan(topo, "allreduce", 1, max_bytes=m)), topo, m).time_us
    assert single > 5 * simulated  # one channel crosses each node on one NIC


def test_nccl_tree_only_where_its_links_exist():
    torus = Topology((Dimension(4, "ring", 100, 0.5), Dimension(4, "ring", 100, 0.5)), name="t4x4")
    assert not nccl_tree_fits(torus)
    with pytest.raises(PlanError, match="NCCL's tree needs links t4x4 lacks"):
        tree_plan(torus)
    assert tree_plan(c1p(4), chunks=2).chunks[1].direction == -1  # pairs: one per tree
