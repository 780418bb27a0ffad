"""What the MSCCL runtime accepts and how it moves data: its limits, the protocols' slice
sizes and connection FIFOs, and how a step's chunks become messages (msccl-runtime.md
sections 8, 9, 11 and 13). Lowering, the verifier and the simulator share these facts.

>>> max_allowed_count("Simple", 1 << 30, 64), max_allowed_count("Simple", 1 << 20, 64)
(1, 71)
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """Runtime limits a program must respect (msccl-runtime.md sections 11 and 18)."""

    max_steps: int = 64
    max_threadblocks: int = 108
    max_channels: int = 32
    max_count: int = 71
    max_offset: int = 32767
    max_nodes: int = 4095
    max_depid: int = 127


MAX_COUNT = 71
MAX_OFFSET = 32767
MAX_DEPID = 127
MAX_CHANNELS = 32
MAX_NODES = 4095
MAX_ITERATIONS = 65535
PER_CHANNEL_TBS = 32

#: Data bytes each loop iteration moves per chunk (the slice P).
SLICE_BYTES = {"Simple": 2 << 20, "LL": 32 << 10, "LL128": 576000}
#: Messages a connection's FIFO holds: 8 slots, a Simple message takes 4, LL/LL128 take 1.
FIFO_MESSAGES = {"Simple": 2, "LL": 8, "LL128": 8}
#: Payload bytes per wire byte.
WIRE_EFFICIENCY = {"Simple": 1.0, "LL128": 120 / 128, "LL": 0.5}


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
