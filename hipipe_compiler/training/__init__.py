"""Training-iteration planning, PipeDAP style: layer profiles, collective costs from our
programs, gradient buckets and their ops, the iteration simulator, the policies compared,
and the planner that writes plan.json with the programs it needs."""

from .commcost import AlphaBetaCost, SimulatedCost
from .planner import POLICIES, plan_training, write_plan
from .profiles import LayerProfile, load_profile

__all__ = ["AlphaBetaCost", "LayerProfile", "POLICIES", "SimulatedCost", "load_profile", "plan_training", "write_plan"]
