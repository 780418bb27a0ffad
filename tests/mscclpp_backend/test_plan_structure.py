"""The structure check passes a threadblock once per distinct operations and surroundings;
whatever one rank's surroundings lose, that rank is still checked, and finds what a check of
every threadblock afresh finds."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from hipipe_compiler.msccl.verify.report import Collector
from hipipe_compiler.mscclpp.nvls_pipeline import nvls_pipeline_plan
from hipipe_compiler.mscclpp.plan import ExecutionPlan, GpuPlan
from hipipe_compiler.mscclpp.reader import read_plan_text
from hipipe_compiler.mscclpp.verify.structure import check_structure
from hipipe_compiler.mscclpp.writer import write_plan
from hipipe_compiler.plan_fitting import fit
from hipipe_compiler.presets import preset
from hipipe_compiler.schedule import hierarchical_plan

from conftest import nvls_nodes


def _hierarchical(protocol: str) -> ExecutionPlan:
    topo = preset("dgx-h100-8x2")
    return fit(hierarchical_plan(topo, "allreduce", chunks=2, protocol=protocol, max_bytes=1 << 20), topo, "r")[1]


#: Plans as `hipipe verify` reads them: ranks share the operations and lists they repeat.
SUBJECTS = {name: read_plan_text(write_plan(make())) for name, make in {
    "hierarchical Simple": lambda: _hierarchical("Simple"),
    "hierarchical LL": lambda: _hierarchical("LL"),
    "in-switch pipeline": lambda: nvls_pipeline_plan(nvls_nodes(4, 2), "p", False, 2),
}.items()}


def _afresh(plan: ExecutionPlan) -> ExecutionPlan:
    """The same plan with no list of operations shared: every threadblock is checked."""
    return replace(plan, gpus=tuple(replace(g, threadblocks=tuple(replace(tb, ops=tuple([*tb.ops]))
                                                                  for tb in g.threadblocks)) for g in plan.gpus))


def _found(plan: ExecutionPlan) -> list:
    out = Collector(100_000)
    check_structure(plan, out)
    return out.items


#: What a rank's surroundings can lose: its buffers' sizes, a semaphore, a peer buffer, a switch group's member.
def _shrink(field: str):
    return lambda g, k: replace(g, **{field: max(0, getattr(g, field) - k)})


EDITS = {
    "input": _shrink("input_chunks"),
    "output": _shrink("output_chunks"),
    "scratch": _shrink("scratch_chunks"),
    "semaphores": lambda g, k: replace(g, semaphores=g.semaphores[:-1]),
    "peer buffer type": lambda g, k: replace(g, remote_buffers=tuple(
        replace(b, type="i" if b.type != "i" else "o") if i == k % max(1, len(g.remote_buffers)) else b
        for i, b in enumerate(g.remote_buffers))),
    "peer buffer dropped": lambda g, k: replace(g, remote_buffers=g.remote_buffers[:-1]),
    "switch group member": lambda g, k: replace(g, channels=tuple(
        replace(c, rank_groups=tuple((*grp[:-1], 10_000) for grp in c.rank_groups)) if c.channel_type == "switch" else c
        for c in g.channels)),
}


@pytest.mark.parametrize("name", sorted(SUBJECTS))
def test_shared_lists_are_checked_once_and_pass(name):
    plan = SUBJECTS[name]
    lists = {id(tb.ops) for g in plan.gpus for tb in g.threadblocks}
    assert len(lists) < sum(len(g.threadblocks) for g in plan.gpus)  # the memo has something to save
    assert _found(plan) == _found(_afresh(plan)) == []


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(SUBJECTS)), st.sampled_from(sorted(EDITS)), st.data())
def test_a_rank_whose_surroundings_changed_finds_what_a_fresh_check_finds(name, edit, data):
    plan = SUBJECTS[name]
    rank = data.draw(st.integers(0, plan.ngpus - 1), label="rank")
    k = data.draw(st.integers(1, 64), label="by")
    gpus: list[GpuPlan] = list(plan.gpus)
    gpus[rank] = EDITS[edit](gpus[rank], k)
    broken = replace(plan, gpus=tuple(gpus))
    assert _found(broken) == _found(_afresh(broken))


def test_the_changes_are_found_at_all():
    """The comparison above is not between two empty lists: each edit breaks some subject."""
    for edit, change in EDITS.items():
        found = []
        for plan in SUBJECTS.values():
            gpus = list(plan.gpus)
            gpus[-1] = change(gpus[-1], 64)
            found += _found(replace(plan, gpus=tuple(gpus)))
        assert found, edit
