"""The simulator (cost-model.md, exactly) and the pictures of its runs."""

from .simulate import SimResult, SimulationError, simulate, simulate_exact
from .timeline import render_timeline

__all__ = ["SimResult", "SimulationError", "render_timeline", "simulate", "simulate_exact"]
