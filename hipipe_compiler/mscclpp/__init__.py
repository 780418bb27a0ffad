"""The MSCCL++ backend: execution plans (JSON) for the maintained one-sided runtime.

- `plan`: the plan's dataclasses and the executor's limits;
- `translate`: a Program's steps as puts, signals and waits (plan_fitting.py keeps them within
  the limits; sim/plans.py times them);
- `writer`, `reader`: JSON out, JSON in (safely);
- `verify`: the proof that a plan is correct on the executor;
- `register`: plans handed to MSCCL++'s NCCL shim from a PyTorch job (imports mscclpp when called).
"""

from .plan import ExecutionPlan
from .reader import looks_like_plan, read_plan
from .translate import ranks_per_node, translate
from .verify import verify_plan
from .writer import save_plan, write_plan

__all__ = ["ExecutionPlan", "looks_like_plan", "ranks_per_node", "read_plan", "save_plan", "translate", "verify_plan",
           "write_plan"]
