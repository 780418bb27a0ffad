"""What a schedule decides, independent of MSCCL: plans (plan.py), their estimates and
default order of work (estimate.py), and the baselines (baselines.py)."""

from .baselines import hierarchical_plan, ring_plan, themis_plan
from .estimate import events, stage_cost, time_floor_us
from .plan import ChunkPlan, Plan, Stage, check_plan

__all__ = ["ChunkPlan", "Plan", "Stage", "check_plan", "events", "hierarchical_plan", "ring_plan", "stage_cost",
           "themis_plan", "time_floor_us"]
