"""hipipe-compiler: pipelined hierarchical collective schedules for multi-dimensional GPU
networks, lowered to MSCCL XML, verified and timed.

>>> import hipipe_compiler as hc
>>> topo = hc.preset("dgx-h100-8x2")
>>> program = hc.lower(hc.hierarchical_plan(topo, "allreduce", chunks=2, max_bytes=1 << 20))
>>> hc.verify(program).ok
True
"""

from .errors import InputError, PlanError
from .lowering import lower
from .runtime import Limits
from .msccl_xml import lexical_issues, read_program, save_program, write_program
from .plan import ChunkPlan, Plan, hierarchical_plan, ring_plan
from .program import Gpu, Program, Step, Threadblock
from .topology import PRESETS, Dimension, Topology, load_topology, preset
from .units import format_size, parse_size
from .verify import Report, Violation, VerifyOptions, verify

__all__ = [
    "ChunkPlan", "Dimension", "Gpu", "InputError", "Limits", "Plan", "PlanError", "PRESETS", "Program",
    "Report", "Step", "Threadblock", "Topology", "VerifyOptions", "Violation", "format_size",
    "hierarchical_plan", "lexical_issues", "load_topology", "lower", "parse_size", "preset",
    "read_program", "ring_plan", "save_program", "verify", "write_program",
]
__version__ = "0.1.0"
