"""The Program: the MSCCL IR that lowering builds, the reader parses, and the verifier,
simulator and writer consume (msccl-runtime.md sections 2-10).

It mirrors the XML one to one, including each step's `s` attribute as written, so that
the verifier can judge foreign files exactly as the runtime would read them.

>>> step = Step(0, "s", "i", 0, "o", -1, 1)
>>> step.sends, step.receives
(True, False)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator

COLLECTIVES: tuple[str, ...] = (
    "allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce",
    "send", "recv", "gather", "scatter", "alltoallv",
)
#: What the legacy microsoft/msccl runtime calls its collectives (msccl-runtime.md 3): reduce-scatter
#: has another name there, so no one file serves both runtimes.
LEGACY_COLLECTIVES: tuple[str, ...] = ("allreduce", "allgather", "reduce", "broadcast", "alltoall", "reduce_scatter", "custom")
LEGACY_ONLY: tuple[str, ...] = tuple(c for c in LEGACY_COLLECTIVES if c not in COLLECTIVES)
#: The collectives we plan and compile; the others can be read, verified structurally and simulated.
PLANNED_COLLECTIVES: tuple[str, ...] = ("allreduce", "reducescatter", "allgather")
PROTOCOLS: tuple[str, ...] = ("Simple", "LL", "LL128")
STEP_TYPES: tuple[str, ...] = ("s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re", "nop")
BUFFERS: tuple[str, ...] = ("i", "o", "s")

SENDING_TYPES = frozenset({"s", "rcs", "rrs", "rrcs"})
RECEIVING_TYPES = frozenset({"r", "rcs", "rrs", "rrc", "rrcs"})
REDUCING_TYPES = frozenset({"rrs", "rrc", "rrcs", "re"})
#: Types whose dst operand the kernel writes.
WRITING_TYPES = frozenset({"r", "rcs", "rrc", "rrcs", "cpy", "re"})
#: Types whose src operand the kernel reads (the local operand of a fused reduce included).
READING_TYPES = frozenset({"s", "rrs", "rrc", "rrcs", "cpy", "re"})


@dataclass(frozen=True, slots=True)
class Step:
    """One `<step>`: `s` is the index attribute as written (it must equal the position)."""

    s: int
    type: str
    srcbuf: str = "i"
    srcoff: int = -1
    dstbuf: str = "o"
    dstoff: int = -1
    cnt: int = 0
    depid: int = -1
    deps: int = -1
    hasdep: bool = False

    @property
    def sends(self) -> bool:
        return self.type in SENDING_TYPES

    @property
    def receives(self) -> bool:
        return self.type in RECEIVING_TYPES

    @property
    def reduces_received(self) -> bool:
        """Whether the step sums what it receives into its src (rrs, rrc, rrcs)."""
        return self.type in REDUCING_TYPES and self.type in RECEIVING_TYPES

    @property
    def reads_src(self) -> bool:
        return self.type in READING_TYPES

    @property
    def writes_dst(self) -> bool:
        return self.type in WRITING_TYPES

    @property
    def is_nop(self) -> bool:
        return self.type == "nop"


@dataclass(frozen=True, slots=True)
class Threadblock:
    """One `<tb>`: runs its steps in order; one fixed send peer and one recv peer (-1: none)."""

    id: int
    send: int
    recv: int
    chan: int
    steps: tuple[Step, ...]


@dataclass(frozen=True, slots=True)
class Gpu:
    """One `<gpu>`: a rank's buffer sizes in chunks and its threadblocks."""

    id: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    threadblocks: tuple[Threadblock, ...]


@dataclass(frozen=True)
class Program:
    """One MSCCL algorithm: what one XML file says.

    `max_bytes` is the inclusive upper end of the size window (executor semantics);
    0 means no upper limit.
    """

    name: str
    collective: str
    protocol: str
    nchannels: int
    nchunksperloop: int
    ngpus: int
    inplace: bool
    outofplace: bool
    min_bytes: int
    max_bytes: int
    gpus: tuple[Gpu, ...]

    def threadblocks(self) -> Iterator[tuple[Gpu, Threadblock]]:
        for gpu in self.gpus:
            for tb in gpu.threadblocks:
                yield gpu, tb

    def steps(self) -> Iterator[tuple[Gpu, Threadblock, Step]]:
        for gpu in self.gpus:
            for tb in gpu.threadblocks:
                for step in tb.steps:
                    yield gpu, tb, step

    @property
    def nsteps(self) -> int:
        return sum(len(tb.steps) for _, tb in self.threadblocks())

    @property
    def max_threadblocks(self) -> int:
        return max((len(g.threadblocks) for g in self.gpus), default=0)

    @property
    def max_steps(self) -> int:
        return max((len(tb.steps) for _, tb in self.threadblocks()), default=0)

    def with_window(self, min_bytes: int, max_bytes: int) -> "Program":
        return replace(self, min_bytes=min_bytes, max_bytes=max_bytes)


def buffer_chunks(collective: str, ngpus: int, nchunksperloop: int) -> dict[str, int]:
    """Logical chunk counts of the input and output buffers (msccl-runtime.md 8.2)."""
    k, n = nchunksperloop, ngpus
    if collective == "allgather":
        return {"i": k // n, "o": k}
    if collective == "reducescatter":
        return {"i": k, "o": k // n}
    return {"i": k, "o": k}


def size_multiplier(collective: str, ngpus: int) -> int:
    """The runtime multiplies the call's count by this (msccl-runtime.md 8.1)."""
    return ngpus if collective in ("allgather", "reducescatter", "alltoall") else 1
