"""fit: a schedule lowered so that its MSCCL++ translation fits the executor's own limits."""

from __future__ import annotations

import pytest

from hipipe_compiler import plan_fitting
from hipipe_compiler.errors import PlanError
from hipipe_compiler.msccl.runtime import MAX_CHANNELS, Limits
from hipipe_compiler.mscclpp.plan import MAX_OPERATIONS
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
