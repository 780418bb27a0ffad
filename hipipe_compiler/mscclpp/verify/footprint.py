"""What proving a plan takes in memory, known before the proof starts: a compile schedules its
proofs by it, and a proof that cannot fit in the machine is refused at once instead of
running out of memory after minutes.

The proof (execution.py) holds, besides a fixed cost per operation, three things that grow
with the plan:
- vector clocks: every threadblock keeps one with an entry per threadblock and per rank, and
  signals and semaphore releases hold snapshots of it until they are taken. This part grows
  with the square of the threadblock count;
- cells: one per chunk of every buffer, each with the accesses of the launch;
- per operation, a part that grows with the rank count: the measurements need it from 512
  ranks up, and it is fitted rather than derived.

The coefficients are fitted to the peak memory of proofs of HiPIPE plans of 32 to 1,024 ranks
(`pod-8x4x8x4` and smaller pods, 256 KiB and 64 MiB) and of a hierarchical plan of 256 ranks at
1 GiB. The estimate comes to 0.9-1.45 times each measured peak: over on the small plans, whose
fixed costs vary, and 7 % under on the 1,024-rank proof, the largest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plan import ExecutionPlan
from .execution import clock_type

#: Bytes per clock entry kept alive, per cell, per operation, and per operation and rank (fitted).
PER_CLOCK_ENTRY, PER_CELL, PER_OP, PER_OP_RANK = 1.0, 80, 300, 2
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
    return Footprint(tbs, int(PER_CLOCK_ENTRY * clocks + PER_CELL * cells + (PER_OP + PER_OP_RANK * plan.ngpus) * ops))


def room_shortfall(footprint: Footprint, free: int) -> str | None:
    """Why a machine with `free` bytes cannot prove the plan, or None where it can."""
    if footprint.estimate <= free:
        return None
    return (f"proving it takes about {_size(footprint.estimate)} of memory and {_size(max(free, 0))} are free "
            f"(each of its {footprint.threadblocks:,} threadblocks keeps a vector clock with an entry per threadblock)")


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.0f} MB"
