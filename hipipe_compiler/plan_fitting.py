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
from .mscclpp.translate import TooManyOperations, translate

#: Step limits tried in turn: the longest threadblocks whose translation fits come first.
STEP_BUDGETS = (64, 48, 32, 24, 16, 12, 8, 6, 4, 3, 2)


def threadblock_budget(topology: Topology, limits: Limits) -> Limits:
    """The executor launches one 1024-thread block per threadblock, one per SM, and its spins
    need them all resident: the GPU's SM count is the budget, unless one was set explicitly."""
    sms = gpu_model(topology.gpu).multiprocessors if topology.gpu else 0
    if sms and limits.max_threadblocks == Limits().max_threadblocks:
        return replace(limits, max_threadblocks=sms)
    return limits


#: No bound: where a limit belongs to MSCCL XML's reader and not to the MSCCL++ executor.
UNBOUNDED = 1 << 30


def executor_limits(limits: Limits) -> Limits:
    """The lowering's limits for a JSON plan: the threadblock budget and the step budgets stay,
    but those of the MSCCL XML reader (32 channels, 4,096 XML nodes per rank, int8 dependency
    ids, int16 chunk offsets) bind nothing in MSCCL++, whose own limits (mscclpp.md 6) the
    translation and the verifier check: they would only keep fitting schedules out."""
    return replace(limits, max_channels=UNBOUNDED, max_nodes=UNBOUNDED, max_depid=UNBOUNDED, max_offset=UNBOUNDED)


def fit(plan: Plan, topology: Topology, name: str, inplace: bool = False, limits: Limits = Limits(),
        node_size: int | None = None, pool: int | None = None,
        shorter_than: int | None = None, opening: bool = False) -> tuple[Program, ExecutionPlan]:
    """(program, execution plan) for `plan`; PlanError naming the limit when none fits. `pool`
    and `opening` as in `translate` (credits and handshakes cost operations too); `shorter_than` skips the step limits
    from that one up (a caller whose program of that many steps was too long).

    Steps across nodes cost the most operations (a staging copy and its nop besides the
    put), so the outer axes, where the network is, are cut shorter first, and the inner
    ones only when their own threadblocks overflow."""
    limits = executor_limits(threadblock_budget(topology, limits))
    outer = range(1, len(plan.algorithms)) if not plan.flat else range(0)
    budgets = [s for s in STEP_BUDGETS if s <= limits.max_steps and (shorter_than is None or s < shorter_than)]
    if not budgets:
        raise PlanError(f"no threadblock length under {shorter_than} steps is left to try")
    inner_at, outer_at = 0, 0
    failed: tuple[Program, TooManyOperations] | None = None
    while True:
        steps = {a: budgets[outer_at] for a in outer}
        try:
            program = lower(plan, replace(limits, max_steps=budgets[inner_at]), axis_steps=steps)
        except PlanError as exc:
            raise PlanError(f"no threadblock length fits the MSCCL++ executor: {exc}") from None
        if failed is not None and failed[0] == program:  # a budget its threadblocks were within already
            refusal = failed[1]
        else:
            try:
                return program, translate(program, topology, name, inplace, node_size, opening=opening, pool=pool)
            except TooManyOperations as exc:
                refusal = exc
        failed = (program, refusal)
        if refusal.port and outer and outer_at + 1 < len(budgets):
            outer_at += 1
        elif inner_at + 1 < len(budgets):
            inner_at += 1
            outer_at = max(outer_at, inner_at)
        else:
            raise refusal
