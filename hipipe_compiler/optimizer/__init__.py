"""HiPIPE, the optimizer: the linear programs (lp.py), the knobs that describe a candidate
plan (knobs.py) and the search that picks one per size window (search.py), judged by the
simulator (judge.py), in worker processes ahead of its asking where there are several
(workers.py)."""

from .knobs import Knobs, build_plan
from .search import Choice, Search, optimize, optimize_window

__all__ = ["Choice", "Knobs", "Search", "build_plan", "optimize", "optimize_window"]
