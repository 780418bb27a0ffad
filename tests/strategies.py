"""Hypothesis strategies for plans: arbitrary chunk sizes, orders, directions, lanes,
algorithms, layouts, protocols, windows and emission orders."""

from __future__ import annotations

from hypothesis import strategies as st

from hipipe_compiler.msccl.program import PROTOCOLS
from hipipe_compiler.schedule import ChunkPlan, Plan, check_plan
from hipipe_compiler.schedule.baselines import auto_layouts
from hipipe_compiler.schedule.plan import chunk_stages
from hipipe_compiler.schedule.trees import nccl_tree_fits

from conftest import topologies

COLLECTIVES = ("allreduce", "reducescatter", "allgather")
WINDOWS = (1 << 16, 1 << 20, 64 << 20, 1 << 30)


@st.composite
def plans(draw, max_ranks: int = 32, max_chunks: int = 4) -> Plan:
    topo = draw(topologies(max_ranks=max_ranks))
    coll = draw(st.sampled_from(COLLECTIVES))
    flat = draw(st.booleans()) if topo.ndims > 1 else False
    naxes = 1 if flat else topo.ndims
    sizes = [topo.nranks] if flat else [d.size for d in topo.dimensions]
    algorithms = []
    # NCCL's tree over every rank needs links between the nodes' first ranks: switches outside
    trees_legal = nccl_tree_fits(topo)
    for a in range(naxes):
        can_direct = sizes[a] == 2 or (not flat and topo.dimensions[a].kind == "switch")
        oneshot = ["oneshot"] if coll == "allreduce" and not flat else []
        tree = ["tree"] if coll == "allreduce" and (trees_legal if flat else can_direct) else []
        choices = (["ring", "bidir", "direct"] if can_direct else ["ring", "bidir"]) + oneshot + tree
        algorithms.append(draw(st.sampled_from(choices)))
    nchunks = draw(st.integers(1, max_chunks))
    chunks = []
    for _ in range(nchunks):
        order = tuple(draw(st.permutations(range(naxes))))
        nstages = len(chunk_stages(coll, order))
        chunks.append(ChunkPlan(
            units=draw(st.integers(1, 2)),
            order=order,
            direction=draw(st.sampled_from([1, -1])),
            lane=draw(st.integers(0, 1)),
            stage_lanes=draw(st.one_of(st.none(), st.tuples(*[st.integers(0, 2)] * nstages))),
        ))
    chunks = tuple(chunks)
    protocol = draw(st.sampled_from(PROTOCOLS))
    max_bytes = draw(st.sampled_from(WINDOWS))
    layouts = draw(st.one_of(
        st.just(auto_layouts(topo, flat, chunks, algorithms, protocol, max_bytes)),
        st.tuples(*[st.sampled_from(["fused", "split"]) for _ in range(naxes)]),
    ))
    # a random emission order that keeps every chunk's stages in sequence
    remaining = {k: list(range(len(chunk_stages(coll, c.order)))) for k, c in enumerate(chunks)}
    schedule = []
    while any(remaining.values()):
        k = draw(st.sampled_from(sorted(k for k, v in remaining.items() if v)))
        schedule.append((k, remaining[k].pop(0)))
    plan = Plan(
        topology=topo, collective=coll, chunks=chunks, algorithms=tuple(algorithms), layouts=tuple(layouts),
        protocol=protocol, flat=flat, schedule=tuple(schedule) if draw(st.booleans()) else (),
        min_bytes=max_bytes // 2, max_bytes=max_bytes, nominal_bytes=max_bytes, name="random",
    )
    check_plan(plan)
    return plan
