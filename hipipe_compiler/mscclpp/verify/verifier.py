"""The plan verifier: structure and limits (structure.py), then one symbolic launch per buffer
layout the plan may be called with (execution.py).

>>> from hipipe_compiler.presets import preset
>>> from hipipe_compiler.schedule import hierarchical_plan
>>> from hipipe_compiler.lower import lower
>>> from hipipe_compiler.mscclpp.translate import translate
>>> topo = preset("dgx-h100-8x2")
>>> verify_plan(translate(lower(hierarchical_plan(topo, max_bytes=1 << 20)), topo, "demo")).ok
True
"""

from __future__ import annotations

from typing import Sequence

from ...collector import paused
from ...msccl.verify.report import Collector, Report
from ..memory import LAYOUTS
from ..plan import ExecutionPlan
from .execution import execute
from .footprint import ProofTooLarge, proof_footprint, room_shortfall
from .structure import check_structure

CHECKS = ("structure", "limits", "channel pairing", "visibility", "races", "slot reuse", "balance", "deadlock freedom",
          "semantics")


def layouts_of(plan: ExecutionPlan, aliased: bool = False) -> tuple[str, ...]:
    """The buffer layouts a plan meets: its own mode, and for an out-of-place reduce-scatter
    that also serves NCCL's in-place calls (`aliased`), NCCL's layout (mscclpp.md 8.1)."""
    if plan.inplace:
        return ("inplace",)
    return ("separate", "nccl") if aliased and plan.collective == "reducescatter" else ("separate",)


def verify_plan(plan: ExecutionPlan, layouts: Sequence[str] | None = None, max_violations: int = 200,
                available: int | None = None) -> Report:
    """Check every rule; a Report with `ok` True is a proof for the modelled executor. Given the
    bytes `available`, a plan sound in structure whose proof would need more raises ProofTooLarge
    before the proof starts."""
    out = Collector(max_violations)
    with paused():
        if check_structure(plan, out):
            short = None if available is None else room_shortfall(proof_footprint(plan), available)
            if short:
                raise ProofTooLarge(short)
            for layout in layouts or layouts_of(plan):
                if layout not in LAYOUTS:
                    raise ValueError(f"unknown layout {layout!r}")
                if not execute(plan, layout, out):
                    break
    return Report(tuple(out.items), CHECKS)
