"""What proving a plan takes in memory, known before the proof starts: a compile schedules its
proofs by it, and a proof that cannot fit in the machine is refused at once instead of
running out of memory after minutes.

The proof (execution.py) holds, besides a fixed cost per operation:
- vector clocks: every threadblock keeps one with threadblocks + ranks entries;
- cells: one per chunk of every buffer, each with the accesses of the launch;
- the clock snapshots that signals and semaphore releases hold until their taker's next nop,
  and a part per operation that grows with the rank count. Neither is derived: one fitted term
  per operation and rank stands for both, which the measurements need from 512 ranks up.

The coefficients are fitted to the peak memory of proofs of the plans that `hipipe compile
--backend mscclpp --size` emits for pods of 64 to 1,024 ranks at 64 MiB (HiPIPE up to 512, and
the hierarchical plan on `pod-8x4x8x4`, where the search's pick does not fit the executor), of a
32-rank HiPIPE plan at 256 KiB and of a 256-rank hierarchical plan at 1 GiB. The estimate comes
to 0.9-1.45 times each measured peak, and 0.93 times the largest, the 1,024-rank proof.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import PlanError
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
    clocks: int  # of which the threadblocks' own clocks

    @property
    def reserve(self) -> int:
        """Bytes to set aside for the proof: the estimate with room for the plans it undershoots."""
        return int(self.estimate * ENVELOPE)


def proof_footprint(plan: ExecutionPlan) -> Footprint:
    """The memory `verify_plan` takes for one buffer layout (layouts run one after another)."""
    lengths = [sum(1 for _ in tb.flat_ops()) for g in plan.gpus for tb in g.threadblocks]
    tbs, ops = len(lengths), sum(lengths)
    width = np.dtype(clock_type(max(lengths, default=0))).itemsize
    cells = sum(g.input_chunks + g.output_chunks + g.scratch_chunks * (2 if plan.packets else 1) for g in plan.gpus)
    clocks = int(PER_CLOCK_ENTRY * tbs * (tbs + plan.ngpus) * width)
    return Footprint(tbs, clocks + int(PER_CELL * cells + (PER_OP + PER_OP_RANK * plan.ngpus) * ops), clocks)


class ProofTooLarge(PlanError):
    """A plan whose proof would take more memory than is available; the message says how much."""


def room_shortfall(footprint: Footprint, available: int) -> str | None:
    """Why `available` bytes cannot prove the plan, or None where they may. It goes by the
    estimate, not the reserve: a proof is refused only where it would very likely not fit."""
    if footprint.estimate <= available:
        return None
    return (f"proving it takes about {_size(footprint.estimate)} of memory and at most {_size(max(available, 0))} "
            f"are available (the vector clocks of its {footprint.threadblocks:,} threadblocks take "
            f"{_size(footprint.clocks)}, its cells and operations the rest)")


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.0f} MB"
