"""The MSCCL++ execution plan: one frozen dataclass per JSON object of the executor's format
(mscclpp.md section 2), and the executor's limits (section 6), most of which its loader does
not check.

>>> op = Op("put", "memory", src=(Operand("i", 0, 1),), dst=(Operand(None, 0, 1, buffer_id=0),))
>>> op.remote_writes, op.local_reads
(True, (Operand(buffer='i', index=0, size=1, buffer_id=None, switch_channel_id=None),))
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Iterator

#: The executor's constants (src/core/include/execution_common.hpp at 1f5f065d).
MAX_OPERATIONS = 64  # per threadblock, after pipeline flattening: the only limit the loader enforces
MAX_CHANNELS = 16  # per threadblock and channel type; also remote buffers per access type
MAX_CHANNELS_PER_OP = 8
MAX_OPERANDS = 10  # per side of an operation
MAX_BARRIERS = 16
MAX_SEMAPHORES_PER_OP = 16
MAX_THREADS = 1024
MAX_PIPELINE_ITERATIONS = 65535  # read as uint16 on the device
MAX_DEVICE_OFFSET = (1 << 32) - 1  # offsets and sizes are uint32 on the device
DEFAULT_SCRATCH_BYTES = 1 << 27  # the executor's and the NCCL shim's scratch buffer
MAX_MESSAGE_SIZE = (1 << 64) - 1

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "broadcast")
CHANNEL_TYPES = ("memory", "port", "switch")
BUFFER_TYPES = ("i", "o", "s")

#: Operations by family (mscclpp.md section 4).
SYNC_OPS = frozenset({"nop", "barrier"})
SIGNAL_OPS = frozenset({"signal", "rlxsignal"})
WAIT_OPS = frozenset({"wait", "rlxwait"})
CHANNEL_OPS = SIGNAL_OPS | WAIT_OPS | {"flush"}
SEMAPHORE_OPS = frozenset({"sem_acquire", "sem_release"})
PACKET_OPS = frozenset({"cpkt", "upkt", "ppkt", "rppkt", "repkt", "respkt", "recpkt", "recspkt", "gstorepkt"})
PLAIN_DATA_OPS = frozenset({"put", "pws", "pwsf", "get", "copy", "re", "res", "rre", "rres", "glres", "gstore"})
DATA_OPS = PACKET_OPS | PLAIN_DATA_OPS
OPERATIONS = SYNC_OPS | CHANNEL_OPS | SEMAPHORE_OPS | DATA_OPS | {"pipeline"}
#: Operations on a switch channel's multicast view (mscclpp.md 4): NVLS, sm_90 and later.
SWITCH_OPS = frozenset({"glres", "gstore", "gstorepkt"})
#: Operations whose first source is the local operand the others are summed into.
REDUCING_OPS = frozenset({"re", "res", "rre", "rres", "repkt", "respkt", "recpkt", "recspkt", "glres"})


@dataclass(frozen=True, slots=True)
class Operand:
    """`{type|buffer_id|switch_channel_id, index, size}`: chunks [index, index+size) of a local
    buffer (`buffer`), of a peer buffer (`buffer_id`, tb-local) or of a multicast view."""

    buffer: str | None
    index: int
    size: int
    buffer_id: int | None = None
    switch_channel_id: int | None = None

    @property
    def local(self) -> bool:
        return self.buffer is not None

    @property
    def end(self) -> int:
        return self.index + self.size


@dataclass(frozen=True, slots=True)
class Op:
    """One operation; each carries only its own family's fields (the device keeps them in a union)."""

    name: str
    channel_type: str = "none"
    channel_ids: tuple[int, ...] = ()
    src: tuple[Operand, ...] = ()
    dst: tuple[Operand, ...] = ()
    semaphore_ids: tuple[int, ...] = ()
    barrier_id: int | None = None
    num_threadblocks: int | None = None
    tbg: tuple[int, int] | None = None  # (tb_id, tbg_size)
    unit_size: int | None = None  # pipeline only
    num_chunks: int | None = None  # pipeline only
    ops: tuple["Op", ...] = ()  # pipeline only

    @property
    def local_reads(self) -> tuple[Operand, ...]:
        return tuple(o for o in self.src if o.local)

    @property
    def local_writes(self) -> tuple[Operand, ...]:
        return tuple(o for o in self.dst if o.local)

    @property
    def remote_writes(self) -> bool:
        return any(o.buffer_id is not None for o in self.dst)

    @property
    def packet(self) -> bool:
        return self.name in PACKET_OPS


@dataclass(frozen=True, slots=True)
class TbChannels:
    """A threadblock's channels of one type: GPU-level indices; the position is the tb-local index."""

    channel_type: str
    channel_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TbBuffers:
    """A threadblock's peer buffers of one access type: indices into the GPU's remote_buffers."""

    access_channel_type: str
    remote_buffer_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Threadblock:
    id: int
    ops: tuple[Op, ...]
    channels: tuple[TbChannels, ...] = ()
    remote_buffer_refs: tuple[TbBuffers, ...] = ()

    def channel_list(self, channel_type: str) -> tuple[int, ...]:
        return next((c.channel_ids for c in self.channels if c.channel_type == channel_type), ())

    def buffer_list(self, channel_type: str) -> tuple[int, ...]:
        return next((b.remote_buffer_ids for b in self.remote_buffer_refs if b.access_channel_type == channel_type), ())

    def flat_ops(self) -> Iterator[Op]:
        """The operations as the executor counts them: a pipeline's nested ops follow it."""
        for op in self.ops:
            yield op
            yield from op.ops


@dataclass(frozen=True, slots=True)
class Channel:
    """A channel declaration: memory/port to each peer of `connected_to`, or a switch channel."""

    channel_type: str
    connected_to: tuple[int, ...] = ()
    buffer_type: str | None = None  # switch only
    rank_groups: tuple[tuple[int, ...], ...] = ()  # switch only


@dataclass(frozen=True, slots=True)
class RemoteBuffer:
    rank: int
    type: str
    access_channel_types: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GpuPlan:
    id: int
    input_chunks: int
    output_chunks: int
    scratch_chunks: int
    threadblocks: tuple[Threadblock, ...]
    channels: tuple[Channel, ...] = ()
    remote_buffers: tuple[RemoteBuffer, ...] = ()
    semaphores: tuple[int, ...] = ()  # init values

    def peers(self, channel_type: str) -> tuple[int, ...]:
        """The GPU-level channel table of one type: the peer of each index (mscclpp.md 3.1)."""
        return tuple(p for c in self.channels if c.channel_type == channel_type for p in c.connected_to)

    def switch_groups(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """The GPU-level switch channel table: (buffer type, ranks) of each index, one per rank
        group of each switch declaration (mscclpp.md 3.1)."""
        return tuple((c.buffer_type or "", group) for c in self.channels if c.channel_type == "switch"
                     for group in c.rank_groups)


@dataclass(frozen=True)
class ExecutionPlan:
    """One JSON execution plan: what every rank runs for calls within [min, max] bytes. Its
    hash is kept once computed: plans key the compiler's proofs, and one holds every operation
    of every rank."""

    name: str
    collective: str
    protocol: str
    inplace: bool
    gpus: tuple[GpuPlan, ...]
    num_threads_per_block: int = MAX_THREADS
    min_message_size: int = 0
    max_message_size: int = MAX_MESSAGE_SIZE
    buffer_alignment: int = 16
    reuse_resources: bool = False
    use_double_scratch_buffer: bool = False

    def __hash__(self) -> int:
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict:
        """Without the hash kept: another process may hash strings differently."""
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @property
    def ngpus(self) -> int:
        return len(self.gpus)

    @property
    def packets(self) -> bool:
        """LL: the executor doubles the scratch and packet operands use 2C per chunk."""
        return self.protocol == "LL"

    @property
    def max_threadblocks(self) -> int:
        return max((len(g.threadblocks) for g in self.gpus), default=0)

    @property
    def max_ops(self) -> int:
        return max((sum(1 for _ in tb.flat_ops()) for g in self.gpus for tb in g.threadblocks), default=0)

    @property
    def needs_symmetric_memory(self) -> bool:
        """Whether the plan addresses a peer's input or output (a remote buffer, or a switch
        channel bound to it). The executor places those at the peer's allocation base plus this
        rank's own offset in its allocation, so every rank's buffers must sit at the same offset
        in their allocations (mscclpp.md 2.6); a plan that touches peers' scratch alone needs nothing."""
        return any(b.type in ("i", "o") for g in self.gpus for b in g.remote_buffers) or any(
            t in ("i", "o") for g in self.gpus for t, _ranks in g.switch_groups())


def packet_operand(name: str, source: bool, k: int) -> bool:
    """Whether operand k of a side of a packet operation holds packets (2C per chunk) rather than data."""
    if name in ("cpkt", "ppkt"):
        return not source
    if name in ("upkt", "gstorepkt"):
        return source
    if name == "rppkt":
        return True
    if name in ("repkt", "respkt", "recpkt", "recspkt"):
        return k > 0
    return False


def message_sizes(collective: str, nbytes: int, ngpus: int) -> tuple[int, int]:
    """(input, output) bytes of a call of nbytes (the nccl-tests size) as the shim passes them."""
    if collective == "allgather":
        return nbytes // ngpus, nbytes
    if collective == "reducescatter":
        return nbytes, nbytes // ngpus
    return nbytes, nbytes


def largest_message_size(plan: ExecutionPlan) -> int:
    """The largest call (nccl-tests bytes) whose device offsets all fit the executor's uint32
    (mscclpp.md 6): the end of the input, of the output, and of the whole scratch, which holds
    packets at 2C per chunk and whose half, on a double buffer, is itself an offset. Above it
    the offsets wrap, and the kernel reads and writes the wrong bytes."""
    if not plan.gpus:
        return MAX_MESSAGE_SIZE
    units = max(max(g.input_chunks, g.output_chunks, g.scratch_chunks * _scratch_factor(plan)) for g in plan.gpus)
    align = max(plan.buffer_alignment, 1)
    chunk = MAX_DEVICE_OFFSET // max(units, 1) // align * align
    per_rank = chunk * plan.gpus[0].input_chunks
    return per_rank * plan.ngpus if plan.collective == "allgather" else per_rank


def bounded(plan: ExecutionPlan) -> ExecutionPlan:
    """A plan built with no largest size, declared to serve every size its offsets allow."""
    if plan.max_message_size != MAX_MESSAGE_SIZE:
        return plan
    return replace(plan, max_message_size=largest_message_size(plan))


def chunk_bytes(plan: ExecutionPlan, nbytes: int) -> int:
    """C: the one chunk size of every buffer for a call of nbytes (mscclpp.md 2.6)."""
    inp, _ = message_sizes(plan.collective, nbytes, plan.ngpus)
    return inp // plan.gpus[0].input_chunks


def channel_pairs(plan: ExecutionPlan) -> dict[tuple[int, str, int], tuple[int, str, int]]:
    """Endpoint (rank, type, GPU-level index) -> the peer's endpoint it pairs with: the t-th
    channel A->B pairs with the t-th B->A (mscclpp.md 3.1). Unpaired endpoints are left out."""
    towards: dict[tuple[int, str, int], list[int]] = {}  # (position, type, peer) -> its indices to that peer
    for r, g in enumerate(plan.gpus):
        for t in ("memory", "port"):
            for i, p in enumerate(g.peers(t)):
                towards.setdefault((r, t, p), []).append(i)
    out = {}
    for (r, t, p), indices in towards.items():
        me = plan.gpus[r].id
        for i, j in zip(indices, towards.get((p, t, me), [])):
            out[(me, t, i)] = (p, t, j)
    return out


def _scratch_factor(plan: ExecutionPlan) -> int:
    """Scratch bytes per chunk byte: packets carry a flag beside every word, and a double
    buffer keeps two halves."""
    return (2 if plan.packets else 1) * (2 if plan.use_double_scratch_buffer else 1)


def context_scratch_bytes(plan: ExecutionPlan) -> int:
    """The scratch the executor allocates per rank for each context of this plan, at most: a
    context per pair of buffer allocations, never freed, whose scratch is sized by the smaller
    of the send buffer's whole allocation and max_message_size (mscclpp.md 2.6,
    `setupScratchBuffer`). Buffers in allocations of that size or more reach this bound; for
    an all-gather max_message_size is the output's, so it is the ranks' count times the
    scratch of a call at that size."""
    size = plan.max_message_size
    worst = 0
    for g in plan.gpus:
        chunks = g.input_chunks or g.output_chunks
        per = -(-size // chunks) * g.scratch_chunks * _scratch_factor(plan) if chunks else 0
        worst = max(worst, per + -per % max(plan.buffer_alignment, 1))
    return worst


def scratch_per_chunk(plan: ExecutionPlan) -> float:
    """Scratch bytes per byte of a buffer chunk, on the rank that needs the most: what
    `context_scratch_bytes` grows by with max_message_size."""
    return max((g.scratch_chunks * _scratch_factor(plan) / (g.input_chunks or g.output_chunks)
                for g in plan.gpus if g.input_chunks or g.output_chunks), default=0.0)


def largest_size_within_scratch(plan: ExecutionPlan, budget: int) -> int:
    """The largest max_message_size whose `context_scratch_bytes` stays within budget bytes
    per rank (MAX_MESSAGE_SIZE where the plan keeps no scratch)."""
    align = max(plan.buffer_alignment, 1)
    usable = budget // align * align
    largest = MAX_MESSAGE_SIZE
    for g in plan.gpus:
        chunks = g.input_chunks or g.output_chunks
        if g.scratch_chunks and chunks:
            largest = min(largest, usable // (g.scratch_chunks * _scratch_factor(plan)) * chunks)
    return largest
