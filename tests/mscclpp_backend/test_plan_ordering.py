"""What a program's own order guarantees about its slots: credits it makes needless are left
out (and the plan still verifies), the others are kept, and the order search is sound."""

from __future__ import annotations

import sys

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from hipipe_compiler.errors import PlanError
from hipipe_compiler.mscclpp import ordering
from hipipe_compiler.mscclpp.ordering import StepGraph, needless_credits, step_graph
from hipipe_compiler.mscclpp.translate import translate
from hipipe_compiler.plan_compiler import POOLS
from hipipe_compiler.plan_fitting import fit
from hipipe_compiler.mscclpp.verify import verify_plan
from hipipe_compiler.lower import lower
from hipipe_compiler.presets import preset
from hipipe_compiler.schedule import hierarchical_plan

from conftest import COLLECTIVES, topologies

#: the module, which the package's `translate` function hides
translate_module = sys.modules["hipipe_compiler.mscclpp.translate"]


def waits(plan) -> int:
    return sum(op.name == "wait" for g in plan.gpus for tb in g.threadblocks for op in tb.ops)


def program_of(name: str, collective: str, chunks: int):
    topo = preset(name)
    return topo, lower(hierarchical_plan(topo, collective, chunks=chunks, protocol="Simple", max_bytes=1 << 20))


def test_ranks_that_exchange_both_ways_need_no_credits(monkeypatch):
    """On a switch, two ranks send each other their chunks in turn, each its next only after
    receiving the other's: a slot is read before its sender comes round to it again, so the
    pooled plan waits no more than the plain one, and verifies. With every credit kept it
    waits more, and verifies too."""
    topo, program = program_of("dgx-h100-8x2", "allreduce", 2)
    plain, pooled = translate(program, topo, "t"), translate(program, topo, "t", pool=2)
    assert waits(pooled) == waits(plain)
    assert pooled.gpus[0].scratch_chunks < plain.gpus[0].scratch_chunks
    assert verify_plan(pooled).ok
    monkeypatch.setattr(translate_module, "needless_credits", lambda graph, pool: frozenset())
    credited = translate(program, topo, "t", pool=2)
    assert waits(credited) > waits(pooled)
    assert verify_plan(credited).ok


def test_a_ring_keeps_every_credit():
    """Around a ring, a sender's next chunk comes from upstream, not from the rank it feeds:
    nothing orders its write after that rank's read but the credit."""
    _topo, program = program_of("torus-4x4", "allgather", 2)
    graph = step_graph(program)
    pooled = [conn for conn, reads in graph.received.items() if len(reads) > 2]
    assert pooled and not needless_credits(graph, 2)


def chain(n: int) -> StepGraph:
    return StepGraph(tuple((0, 0, i) for i in range(n)), tuple((i + 1,) if i + 1 < n else () for i in range(n)),
                     {}, {}, tuple(range(n)), tuple(range(n)))


def test_the_order_search_follows_edges_forward_only(monkeypatch):
    graph = chain(6)
    assert graph.precedes(0, 5) and graph.precedes(2, 3)
    assert not graph.precedes(5, 0) and not graph.precedes(3, 2)
    monkeypatch.setattr(ordering, "SEARCH_LIMIT", 2)
    assert not graph.precedes(0, 5)  # too far to search: the credit is kept
    assert graph.precedes(0, 2)


def test_steps_that_wait_in_a_cycle_are_refused():
    with pytest.raises(PlanError, match="cycle"):
        ordering._topological([[1], [0]])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topologies(max_ranks=16), st.sampled_from(COLLECTIVES), st.integers(2, 4), st.sampled_from(POOLS))
def test_pooled_plans_without_their_needless_credits_verify(topo, collective, chunks, pool):
    """Hierarchical programs on random topologies, their credits left out wherever the order
    search says the program orders the reuse itself: the verifier, which knows nothing of that
    search, proves every slot's reuse, or finds the same deadlock the kept credits close."""
    try:
        program, plan = fit(hierarchical_plan(topo, collective, chunks=chunks, protocol="Simple", max_bytes=1 << 20),
                            topo, "t", pool=pool)
    except PlanError:
        assume(False)
    if needless_credits(step_graph(program), pool):
        event("some credits are needless")
    report = verify_plan(plan)
    assert report.ok or report.rules() == {"deadlock"}, [str(v) for v in report.violations[:3]]
