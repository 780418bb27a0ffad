"""What the MSCCL runtime accepts and how it moves data: its limits, the protocols' slice
sizes and connection FIFOs, and how a step's chunks become messages (msccl-runtime.md
sections 8, 9, 11 and 13). Lowering, the verifier and the simulator share these facts.

>>> max_allowed_count("Simple", 1 << 30, 64), max_allowed_count("Simple", 1 << 20, 64)
(1, 71)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_COUNT = 71  # cnt of a step: MSCCL_MAX_COUNT = 72, exclusive
MAX_OFFSET = 32767  # chunk offsets are stored as int16
MAX_DEPID = 127  # depid is stored as int8
MAX_STEPS = 64  # MSCCL_MAX_NUM_STEPS, per threadblock
MAX_NODES = 4095  # MAX_NODES = 4096 handled XML nodes per rank's load, the algo node included
MAX_CHILDREN = 1024  # MAX_SUBS: children of one XML node, in a fixed array with no bounds check
MAX_ITERATIONS = 65535  # MSCCL_MAX_ITER, in the dependency flags' encoding
PER_CHANNEL_TBS = 32  # MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL, per direction
#: Threadblocks per rank that a compiled program may use by default: all must be resident at
#: once, and an A100 has 108 SMs.
DEFAULT_THREADBLOCK_BUDGET = 108
#: Algorithms microsoft/msccl loads from MSCCL_XML_FILES; it skips the rest without a word.
LEGACY_MAX_ALGORITHMS = 4


@dataclass(frozen=True)
class Runtime:
    """A runtime that loads MSCCL XML, by the limits in which runtimes differ (msccl-runtime.md
    section 11). Both parse every file of the communicator's size when it starts, so a single
    file over a limit makes communicator init fail, whichever call would have picked it."""

    name: str
    max_threadblocks: int  # threadblocks per rank its parser accepts (ids 0..max-1)
    max_channels: int  # MAXCHANNELS: a threadblock's chan must stay below it
    what: str


#: The runtimes we compile for, by `--runtime` name.
RUNTIMES: dict[str, Runtime] = {
    "executor": Runtime("executor", 1024, 32, "msccl-executor-nccl, NVIDIA GPUs"),
    "rccl": Runtime("rccl", 64, 128, "RCCL, AMD GPUs"),
}
MAX_CHANNELS = RUNTIMES["executor"].max_channels


def runtime(name: str) -> Runtime:
    """The runtime of that name; ValueError names the known ones."""
    try:
        return RUNTIMES[name]
    except KeyError:
        raise ValueError(f"unknown runtime {name!r}; expected one of {', '.join(RUNTIMES)}") from None


@dataclass(frozen=True)
class Limits:
    """Runtime limits a compiled program must respect (msccl-runtime.md sections 11 and 18):
    the runtime's own, and a threadblock budget that keeps every threadblock resident.

    >>> Limits.for_runtime("rccl").max_threadblocks, Limits.for_runtime("executor", 132).max_threadblocks
    (64, 132)
    """

    max_steps: int = MAX_STEPS
    max_threadblocks: int = DEFAULT_THREADBLOCK_BUDGET
    max_channels: int = MAX_CHANNELS
    max_count: int = MAX_COUNT
    max_offset: int = MAX_OFFSET
    max_nodes: int = MAX_NODES
    max_depid: int = MAX_DEPID
    max_children: int = MAX_CHILDREN
    runtime: str = "executor"

    @classmethod
    def for_runtime(cls, name: str, budget: int = DEFAULT_THREADBLOCK_BUDGET) -> "Limits":
        """The limits of a runtime, with the threadblock budget capped by what it accepts."""
        target = runtime(name)
        return cls(max_threadblocks=min(budget, target.max_threadblocks), max_channels=target.max_channels,
                   runtime=target.name)


#: Data bytes each loop iteration moves per chunk (the slice P).
SLICE_BYTES = {"Simple": 2 << 20, "LL": 32 << 10, "LL128": 576000}
#: Messages a connection's FIFO holds: 8 slots, a Simple message takes 4, LL/LL128 take 1.
FIFO_MESSAGES = {"Simple": 2, "LL": 8, "LL128": 8}


def max_allowed_count(protocol: str, nbytes: int, nchunksperloop: int) -> int:
    """Chunks the runtime packs into one message for a call of nbytes (8.6); 0 bytes = unbounded."""
    if nbytes <= 0:
        return 1
    chunk_bytes = nbytes / nchunksperloop
    return max(1, min(MAX_COUNT, int(SLICE_BYTES[protocol] // chunk_bytes))) if chunk_bytes > 0 else MAX_COUNT


def iterations(protocol: str, nbytes: int, nchunksperloop: int) -> int:
    """How many times the runtime replays the program for a call of nbytes (8.5)."""
    if nbytes <= 0:
        return 1
    return max(1, math.ceil(nbytes / nchunksperloop / SLICE_BYTES[protocol]))


def piece_count(protocol: str, max_bytes: int, nchunksperloop: int, ring: bool) -> int:
    """The largest cnt a send that runs before its matching receive may have.

    A send-first exchange is deadlock-free when each such send fits in the connection's
    FIFO at the window's largest size. In a ring the next step is a fused receive-and-send,
    which the runtime only starts when the outgoing FIFO has room for one more message.
    """
    messages = FIFO_MESSAGES[protocol] - (1 if ring else 0)
    return min(MAX_COUNT, max(1, messages) * max_allowed_count(protocol, max_bytes, nchunksperloop))
