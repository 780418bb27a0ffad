"""What proving a plan takes in memory, known before the proof starts: a compile schedules its
proofs by it, and a proof that cannot fit in the machine is refused at once instead of
running out of memory after minutes.

The proof (execution.py) holds two things that grow with the plan:
- vector clocks: every threadblock keeps one with an entry per threadblock and per rank, and
  each signal or semaphore release copies it until it is taken. This part grows with the
  square of the threadblock count, and dominates from about 1,000 ranks;
- cells: one per chunk of every buffer, each with the accesses of the launch.

The coefficients are fitted to proofs measured with tracemalloc: HiPIPE plans of 32-256 ranks
at 256 KiB and 64 MiB, and a hierarchical plan of 256 ranks at 1 GiB. The estimate is within
20 % of each; the hierarchical plan, which keeps the most clock copies in flight, is the one it
undershoots most.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plan import ExecutionPlan
from .execution import clock_type

#: Bytes per clock entry kept alive, per cell and per operation run (fitted; see above).
PER_CLOCK_ENTRY, PER_CELL, PER_OP = 1.0, 225, 400
#: The estimate times this bounds every measured proof: what a scheduler reserves.
ENVELOPE = 1.3


@dataclass(frozen=True)
class Footprint:
    """A plan's proof memory: its estimate in bytes, and the threadblock count that drives it."""

    threadblocks: int
    estimate: int

    @property
    def reserve(self) -> int:
        """Bytes to set aside for the proof: the estimate with room for the plans it undershoots."""
        return int(self.estimate * ENVELOPE)


def proof_footprint(plan: ExecutionPlan) -> Footprint:
    """The memory `verify_plan` takes for one buffer layout (layouts run one after another)."""
    lengths = [sum(len(op.ops) if op.name == "pipeline" else 1 for op in tb.ops)
               for g in plan.gpus for tb in g.threadblocks]
    tbs, ops = len(lengths), sum(lengths)
    width = np.dtype(clock_type(max(lengths, default=0))).itemsize
    cells = sum(g.input_chunks + g.output_chunks + g.scratch_chunks * (2 if plan.packets else 1) for g in plan.gpus)
    clocks = tbs * (tbs + plan.ngpus) * width
    return Footprint(tbs, int(PER_CLOCK_ENTRY * clocks + PER_CELL * cells + PER_OP * ops))


def room_shortfall(footprint: Footprint, free: int) -> str | None:
    """Why a machine with `free` bytes cannot prove the plan, or None where it can."""
    if footprint.estimate <= free:
        return None
    return (f"proving it takes about {_size(footprint.estimate)} of memory and {_size(max(free, 0))} are free "
            f"(each of its {footprint.threadblocks:,} threadblocks keeps a vector clock with an entry per threadblock)")


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.0f} MB"
