"""fit: a schedule lowered so that its MSCCL++ translation fits the executor's own limits."""

from __future__ import annotations

import pytest

from hipipe_compiler import plan_fitting
from hipipe_compiler.errors import PlanError
from hipipe_compiler.msccl.runtime import MAX_CHANNELS, Limits
from hipipe_compiler.mscclpp.plan import MAX_OPERATIONS
from hipipe_compiler.mscclpp.translate import TooManyOperations
from hipipe_compiler.mscclpp.verify import verify_plan
from hipipe_compiler.plan_fitting import executor_limits, fit, threadblock_budget
from hipipe_compiler.presets import preset
from hipipe_compiler.schedule import hierarchical_plan


def test_the_xml_readers_limits_do_not_keep_a_schedule_from_the_executor(monkeypatch):
    topo = preset("torus-4x4")
    schedule = hierarchical_plan(topo, "reducescatter", chunks=12, protocol="Simple", max_bytes=1 << 26)
    with monkeypatch.context() as patch:  # held to MSCCL XML's 32 channels, no threadblock length fits
        patch.setattr(plan_fitting, "executor_limits", lambda limits: limits)
        with pytest.raises(PlanError, match="channels"):
            fit(schedule, topo, "xml-limits")
    program, plan = fit(schedule, topo, "executor-limits")
    assert max(tb.chan for gpu in program.gpus for tb in gpu.threadblocks) >= MAX_CHANNELS
    assert plan.max_ops <= MAX_OPERATIONS
    assert plan.max_threadblocks <= threadblock_budget(topo, Limits()).max_threadblocks
    assert verify_plan(plan).ok


def test_executor_limits_keep_the_budgets_that_bind_the_executor():
    limits = Limits(max_threadblocks=40, max_steps=24)
    lifted = executor_limits(limits)
    assert (lifted.max_threadblocks, lifted.max_steps, lifted.max_count) == (40, 24, limits.max_count)
    assert min(lifted.max_channels, lifted.max_nodes, lifted.max_depid, lifted.max_offset) > 1 << 20


def test_a_budget_that_leaves_the_program_as_it_was_is_not_translated_again(monkeypatch):
    """A shorter step budget often cuts no threadblock the last one did not: the same program
    would fail the same way, so fit moves on without translating it, and picks what it did."""
    topo = preset("dgx-h100-8x2")
    schedule = hierarchical_plan(topo, "allreduce", chunks=4, protocol="Simple", max_bytes=1 << 26)
    lowered, translated = [], []
    real_lower, real_translate = plan_fitting.lower, plan_fitting.translate
    monkeypatch.setattr(plan_fitting, "lower", lambda *a, **k: lowered.append(real_lower(*a, **k)) or lowered[-1])
    monkeypatch.setattr(plan_fitting, "translate", lambda p, *a, **k: translated.append(p) or real_translate(p, *a, **k))
    program, plan = fit(schedule, topo, "retries")
    assert len(lowered) > len(translated) >= 2  # some budgets were passed over
    assert all(a != b for i, a in enumerate(translated) for b in translated[i + 1:])
    assert program is lowered[-1] is translated[-1] and plan.max_ops <= MAX_OPERATIONS
    for skipped in (p for p in lowered if not any(p is t for t in translated)):
        with pytest.raises(TooManyOperations):
            real_translate(skipped, topo, "retries")
