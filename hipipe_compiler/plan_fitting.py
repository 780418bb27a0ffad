"""A plan's program lowered so that its MSCCL++ translation fits the executor: a step of the
Program becomes up to nine operations, and a threadblock runs at most 64, so the lowering is
asked for shorter threadblocks (more of them) until the translation fits.

>>> from hipipe_compiler.presets import preset
>>> from hipipe_compiler.schedule import hierarchical_plan
>>> topo = preset("torus-4x4")
>>> schedule = hierarchical_plan(topo, "allgather", max_bytes=1 << 20, protocol="LL")
>>> program, plan = fit(schedule, topo, "demo")
>>> plan.max_ops <= 64, program.max_steps <= 64
(True, True)
"""

from __future__ import annotations

from dataclasses import replace

from .errors import PlanError
from .hardware import gpu_model
from .lower import lower
from .msccl.program import Program
from .msccl.runtime import Limits
from .schedule import Plan
from .topology import Topology
from .mscclpp.plan import ExecutionPlan
from .mscclpp.translate import translate

#: Step limits tried in turn: the longest threadblocks whose translation fits come first.
STEP_BUDGETS = (64, 48, 32, 24, 16, 12, 8, 6, 4, 3, 2)


def threadblock_budget(topology: Topology, limits: Limits) -> Limits:
    """The executor launches one 1024-thread block per threadblock, one per SM, and its spins
    need them all resident: the GPU's SM count is the budget, unless one was set explicitly."""
    sms = gpu_model(topology.gpu).multiprocessors if topology.gpu else 0
    if sms and limits.max_threadblocks == Limits().max_threadblocks:
        return replace(limits, max_threadblocks=sms)
    return limits


def fit(plan: Plan, topology: Topology, name: str, inplace: bool = False, limits: Limits = Limits(),
        node_size: int | None = None) -> tuple[Program, ExecutionPlan]:
    """(program, execution plan) for `plan`; PlanError naming the limit when none fits."""
    error: PlanError | None = None
    limits = threadblock_budget(topology, limits)
    for steps in STEP_BUDGETS:
        if steps > limits.max_steps:
            continue
        try:
            program = lower(plan, replace(limits, max_steps=steps))
        except PlanError as exc:
            error = error or exc
            break  # shorter threadblocks only need more of them
        try:
            return program, translate(program, topology, name, inplace, node_size)
        except PlanError as exc:
            error = exc
            if "operations" not in str(exc):
                break
    raise error or PlanError("no step budget fits")
