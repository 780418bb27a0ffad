"""How NCCL 2.30.7 sets an algorithm up for one call: how many channels carry it (fewer for
small calls: enqueue.cc trims them by threads and splits the call into 16 KiB cells), and how
each channel pipelines its share (chunk bytes and chunks in flight per connection).

>>> from hipipe_compiler.topology import Dimension, Topology
>>> from .tuning import System, graphs
>>> s = System.of(Topology((Dimension(8, "switch", 370.8, link="nvlink"),), gpu="H100"))
>>> [channels_for(s, graphs(s), "ring", "Simple", "allreduce", n) for n in (8, 64 << 10, 1 << 20, 16 << 20)]
[1, 2, 22, 24]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .tuning import Graph, System, nvls_channels, runtime_channels

#: Threads per channel NCCL gives each algorithm and protocol (comm->maxThreads).
MAX_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
#: Bytes per thread below which NCCL drops a channel (comm->threadThresholds); a ring's LL
#: threshold is multiplied by the ranks.
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}
#: The least traffic a channel gets (enqueue.cc MinTrafficPerChannel).
MIN_TRAFFIC = 32 << 10


@dataclass(frozen=True)
class Pipelining:
    """A channel's share moves in chunks of at most `chunk_bytes`, `window` of them in flight
    on a connection."""

    chunk_bytes: int
    window: int


#: (algorithm, protocol) -> how a channel pipelines (nccl-spec 2.2): Ring Simple 2 MiB chunks,
#: two in flight (eight 512 KiB steps of FIFO); LL 32 KiB and LL128 576,000 B, eight in flight;
#: Tree Simple 512 KiB, eight in flight.
PIPELINING = {
    ("ring", "Simple"): Pipelining(2 << 20, 2), ("ring", "LL"): Pipelining(32 << 10, 8),
    ("ring", "LL128"): Pipelining(576000, 8), ("tree", "Simple"): Pipelining(512 << 10, 8),
    ("tree", "LL"): Pipelining(32 << 10, 8), ("tree", "LL128"): Pipelining(576000, 8),
}


def traffic_per_byte(collective: str, nranks: int, protocol: str) -> int:
    """Bytes moved per byte of the call, as NCCL's channel split counts them."""
    base = 2 if collective == "allreduce" else nranks
    return base * (4 if protocol == "LL" else 1)


def channels_for(system: System, found: dict[str, Graph], algorithm: str, protocol: str, collective: str,
                 nbytes: int) -> int:
    """The channels that carry a call of `nbytes` (the nccl-tests size): NCCL's thread-based
    trim (rings and trees), then its split into cells of 32 KiB of traffic (every algorithm),
    so no channel gets less than about 16 KiB of an all-reduce."""
    if algorithm in ("nvls", "nvlstree"):
        most = nvls_channels(system)
    else:
        most = runtime_channels(system, found)
        threads = MAX_THREADS[protocol]
        if algorithm == "ring" and protocol == "Simple" and found["ring"].bw_intra * found["ring"].channels <= 12:
            threads = 256
        threshold = THREAD_THRESHOLD[protocol] * (system.nranks if algorithm == "ring" and protocol == "LL" else 1)
        most = max(1, min(most, nbytes // (threads * threshold)))
    per_byte = traffic_per_byte(collective, system.nranks, protocol)
    data = nbytes if collective == "allreduce" else max(1, nbytes // system.nranks)  # bytes per rank's count
    cell = math.ceil(math.ceil(MIN_TRAFFIC / per_byte) / 16) * 16
    cells = max(1, math.ceil(data / cell))
    traffic = max(MIN_TRAFFIC, data * per_byte)
    per_channel = math.ceil(traffic / most / 16) * 16
    cells_per_channel = min(cells, math.ceil(per_channel / (cell * per_byte)))
    return max(1, min(most, math.ceil(cells / cells_per_channel)))


def nvls_chunk(system: System, algorithm: str, channel_bytes: int) -> int:
    """The bytes one head reduces per loop of a channel (enqueue.cc calcCollChunking): 128 KiB
    (64 KiB for NVLSTree from four nodes), smaller for small channel shares."""
    heads = system.ppn
    if algorithm == "nvls":
        chunk = 128 << 10
        if channel_bytes < 64 * heads * chunk:
            chunk = 64 << 10
        if channel_bytes < 8 * heads * (64 << 10):
            chunk = 32 << 10
        if channel_bytes < 2 * heads * (32 << 10):
            chunk = 16 << 10
        return chunk
    chunk = (128 << 10) if system.nodes < 4 else (64 << 10)
    if channel_bytes < 4 * 8 * (128 << 10):
        chunk = min(chunk, 64 << 10)
    if channel_bytes < 8 * (64 << 10):
        chunk = 32 << 10
    return chunk
