"""The structure check passes a threadblock once per distinct operations and surroundings;
whatever one rank's surroundings lose, that rank is still checked, and finds what a check of
every threadblock afresh finds."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from hipipe_compiler.msccl.verify.report import Collector
from hipipe_compiler.mscclpp.nvls_pipeline import nvls_pipeline_plan
from hipipe_compiler.mscclpp.plan import ExecutionPlan, GpuPlan, Op, Threadblock
from hipipe_compiler.mscclpp.reader import read_plan_text
from hipipe_compiler.mscclpp.verify import structure
from hipipe_compiler.mscclpp.verify.structure import check_structure
from hipipe_compiler.mscclpp.writer import write_plan
from hipipe_compiler.plan_fitting import fit
from hipipe_compiler.presets import preset
from hipipe_compiler.schedule import hierarchical_plan

from conftest import nvls_nodes


def _hierarchical(protocol: str) -> ExecutionPlan:
    topo = preset("dgx-h100-8x2")
    return fit(hierarchical_plan(topo, "allreduce", chunks=2, protocol=protocol, max_bytes=1 << 20), topo, "r")[1]


def _with_barriers(plan: ExecutionPlan) -> ExecutionPlan:
    """The plan with a barrier over every threadblock first in each list, lists still shared."""
    lists: dict[int, tuple[Op, ...]] = {}
    n = len(plan.gpus[0].threadblocks)
    barrier = Op("barrier", barrier_id=0, num_threadblocks=n)
    return replace(plan, gpus=tuple(replace(g, threadblocks=tuple(
        replace(tb, ops=lists.setdefault(id(tb.ops), (barrier, *tb.ops))) for tb in g.threadblocks)) for g in plan.gpus))


#: Plans as `hipipe verify` reads them: ranks share the operations and lists they repeat.
SUBJECTS = {name: read_plan_text(write_plan(make())) for name, make in {
    "hierarchical Simple": lambda: _hierarchical("Simple"),
    "hierarchical LL": lambda: _hierarchical("LL"),
    "in-switch pipeline": lambda: nvls_pipeline_plan(nvls_nodes(4, 2), "p", False, 2),
}.items()}
SUBJECTS["with barriers"] = _with_barriers(SUBJECTS["hierarchical Simple"])


def _found(plan: ExecutionPlan) -> list:
    out = Collector(100_000)
    check_structure(plan, out)
    return out.items


def _afresh(plan: ExecutionPlan) -> list:
    """What the check finds when no threadblock passes for another: every one is checked."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(structure, "_surroundings", lambda *_: object())
        return _found(plan)


def _gpu_edit(change):
    def edit(plan: ExecutionPlan, rank: int, k: int) -> ExecutionPlan:
        gpus = list(plan.gpus)
        gpus[rank] = change(gpus[rank], k)
        return replace(plan, gpus=tuple(gpus))
    return edit


def _tb_edit(change):
    """An edit of the k-th threadblock (cyclically) of the rank, given a list of its own."""
    def edit(g: GpuPlan, k: int) -> GpuPlan:
        tbs = list(g.threadblocks)
        t = k % len(tbs)
        tbs[t] = change(tbs[t], k)
        return replace(g, threadblocks=tuple(tbs))
    return _gpu_edit(edit)


def _shrink(field: str):
    return _gpu_edit(lambda g, k: replace(g, **{field: max(0, getattr(g, field) - k)}))


def _operand_out_of_bounds(tb: Threadblock, k: int) -> Threadblock:
    ops = list(tb.ops)
    i = next((i for i, op in enumerate(ops) if op.name != "pipeline" and any(o.local for o in op.src)), None)
    if i is None:
        return tb
    src = tuple(replace(o, index=1 << 20) if o.local else o for o in ops[i].src)
    ops[i] = replace(ops[i], src=src)
    return replace(tb, ops=tuple(ops))


def _shorter(lists: str, field: str):
    def change(tb: Threadblock, _k: int) -> Threadblock:
        entries = getattr(tb, lists)
        if not entries or not getattr(entries[0], field):
            return tb
        first = replace(entries[0], **{field: getattr(entries[0], field)[:-1]})
        return replace(tb, **{lists: (first, *entries[1:])})
    return change


#: What can change for one rank or one of its threadblocks: its buffers' sizes, a semaphore, a
#: peer buffer, a switch group's member, a threadblock, an operation of a shared list, a list.
EDITS = {
    "input": _shrink("input_chunks"),
    "output": _shrink("output_chunks"),
    "scratch": _shrink("scratch_chunks"),
    "semaphores": _gpu_edit(lambda g, k: replace(g, semaphores=g.semaphores[:-1])),
    "peer buffer type": _gpu_edit(lambda g, k: replace(g, remote_buffers=tuple(
        replace(b, type="i" if b.type != "i" else "o") if i == k % max(1, len(g.remote_buffers)) else b
        for i, b in enumerate(g.remote_buffers)))),
    "peer buffer dropped": _gpu_edit(lambda g, k: replace(g, remote_buffers=g.remote_buffers[:-1])),
    "switch group member": _gpu_edit(lambda g, k: replace(g, channels=tuple(
        replace(c, rank_groups=tuple((*grp[:-1], 10_000) for grp in c.rank_groups)) if c.channel_type == "switch" else c
        for c in g.channels))),
    "last threadblock dropped": _gpu_edit(lambda g, k: replace(g, threadblocks=g.threadblocks[:-1])),
    "an operation of a shared list": _tb_edit(_operand_out_of_bounds),
    "a shorter channel list": _tb_edit(_shorter("channels", "channel_ids")),
    "a shorter buffer list": _tb_edit(_shorter("remote_buffer_refs", "remote_buffer_ids")),
    "a buffer list of the other access type": _tb_edit(lambda tb, k: replace(tb, remote_buffer_refs=tuple(
        replace(b, access_channel_type="port" if b.access_channel_type == "memory" else "memory")
        for b in tb.remote_buffer_refs))),
}


@pytest.mark.parametrize("name", sorted(SUBJECTS))
def test_shared_lists_are_checked_once_and_pass(name):
    plan = SUBJECTS[name]
    lists = {id(tb.ops) for g in plan.gpus for tb in g.threadblocks}
    assert len(lists) < sum(len(g.threadblocks) for g in plan.gpus)  # the memo has something to save
    assert _found(plan) == _afresh(plan) == []


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(sorted(SUBJECTS)), st.sampled_from(sorted(EDITS)), st.data())
def test_a_rank_whose_surroundings_changed_finds_what_a_fresh_check_finds(name, edit, data):
    plan = SUBJECTS[name]
    rank = data.draw(st.integers(1, plan.ngpus - 1), label="rank")  # rank 0 is checked before any other passed
    k = data.draw(st.integers(1, 64), label="by")
    broken = EDITS[edit](plan, rank, k)
    assert _found(broken) == _afresh(broken)


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_every_subject_rank_and_edit_finds_what_a_fresh_check_finds(edit):
    """The sweep the property test samples, at the first, a middle and the last rank."""
    for plan in SUBJECTS.values():
        for rank in sorted({1, plan.ngpus // 2, plan.ngpus - 1}):
            for k in (1, 64):
                broken = EDITS[edit](plan, rank, k)
                assert _found(broken) == _afresh(broken), (plan.name, rank, k)


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_each_change_is_found_on_a_rank_that_repeats_another(edit):
    """The comparison above is not between two empty lists: each edit, on the last rank,
    breaks some subject there, in a threadblock whose list another rank also ran."""
    found = []
    for plan in SUBJECTS.values():
        broken = EDITS[edit](plan, plan.ngpus - 1, 64)
        shared = {tb.id for tb in plan.gpus[-1].threadblocks  # before the edit
                  if any(tb.ops is other.ops for g in plan.gpus[:-1] for other in g.threadblocks)}
        found += [v for v in _found(broken) if v.rank == plan.ngpus - 1 and (v.tb is None or v.tb in shared)]
    assert found, edit
