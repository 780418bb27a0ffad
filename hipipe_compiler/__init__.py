"""hipipe-compiler: pipelined hierarchical collective schedules for multi-dimensional GPU
networks, lowered to MSCCL XML, verified and timed.

>>> import hipipe_compiler as hc
>>> topo = hc.preset("dgx-h100-8x2")
>>> program = hc.lower(hc.hierarchical_plan(topo, "allreduce", chunks=2, max_bytes=1 << 20))
>>> hc.verify(program).ok
True
"""

from .bounds import lower_bound
from .compiler import CompiledWindow, CompileOptions, compile_range, write_directory, write_file
from .errors import InputError, PlanError
from .lower import lower
from .msccl import (
    Gpu, Limits, Program, Report, Step, Threadblock, VerifyOptions, Violation, lexical_issues, read_program,
    save_program, verify, write_program,
)
from .schedule import ChunkPlan, Plan, hierarchical_plan, ring_plan
from .sim import SimResult, render_timeline, simulate
from .topology import Dimension, Topology
from .presets import PRESETS, load_topology, preset
from .training import SimulatedCost, load_profile, plan_training, write_plan
from .units import format_size, parse_size

__all__ = [
    "ChunkPlan", "CompileOptions", "CompiledWindow", "Dimension", "Gpu", "InputError", "Limits", "Plan", "PlanError",
    "PRESETS", "Program", "Report", "SimResult", "SimulatedCost", "Step", "Threadblock", "Topology", "VerifyOptions",
    "Violation", "compile_range", "format_size", "hierarchical_plan", "lexical_issues", "load_profile", "load_topology",
    "lower", "lower_bound", "parse_size", "plan_training", "preset", "read_program", "render_timeline", "ring_plan",
    "save_program", "simulate", "verify", "write_directory", "write_file", "write_plan", "write_program",
]
__version__ = "0.1.0"
