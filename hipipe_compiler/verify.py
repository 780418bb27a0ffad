"""The verifier: proves a Program correct under the runtime's semantics, or names each
broken rule (msccl-runtime.md sections 7-12).

Checks, in order:
1. structure: the rules the runtime's parser enforces and the ones it silently does not
   (gpus, threadblock ids, peers, channels, connections, step numbering, dependencies and
   nops, offsets and buffer bounds, limits);
2. connections: per (channel, sender, receiver) the send and receive sequences agree in
   number and cnt;
3. execution with the runtime's bounded connection FIFOs at the worst size of the window:
   deadlock freedom (reporting the cycle of waiting steps); on the way every step gets a
   level (one more than the steps it follows), so steps of one level are unordered;
4. semantics by symbolic execution, a level at a time in array operations (which rank's
   input chunk sits where);
5. races: two threadblocks of a rank touching the same chunk, at least one writing, with
   no order between them through dependencies or messages.

>>> from hipipe_compiler.topology import preset
>>> from hipipe_compiler.plan import hierarchical_plan
>>> from hipipe_compiler.lowering import lower
>>> report = verify(lower(hierarchical_plan(preset("dgx-h100-8x2"), max_bytes=1 << 20)))
>>> report.ok, report.violations
(True, ())
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from itertools import accumulate
from collections import defaultdict, deque
from dataclasses import dataclass, field

import numpy as np

from .collector import paused
from .runtime import (
    FIFO_MESSAGES, MAX_CHANNELS, MAX_COUNT, MAX_DEPID, MAX_ITERATIONS, MAX_NODES, MAX_OFFSET, PER_CHANNEL_TBS,
    iterations, max_allowed_count,
)
from .program import (
    BUFFERS, READING_TYPES, RECEIVING_TYPES, REDUCING_TYPES, SENDING_TYPES, STEP_TYPES, WRITING_TYPES, Gpu, Program,
    Step, Threadblock, buffer_chunks,
)

MAX_CNT = MAX_COUNT

_BUF_INDEX = {"i": 0, "o": 1, "s": 2}
_TYPE_INDEX = {t: i for i, t in enumerate(STEP_TYPES)}


def _type_mask(types: frozenset[str] | set[str]) -> np.ndarray:
    return np.array([t in types for t in STEP_TYPES])


_READS, _WRITES = _type_mask(READING_TYPES), _type_mask(WRITING_TYPES)
_TAKES = _type_mask(RECEIVING_TYPES)  # the received payload is (an operand of) the result
_REDUCES = _type_mask(REDUCING_TYPES)
_RE = _TYPE_INDEX["re"]
SEMANTIC_COLLECTIVES = ("allreduce", "reducescatter", "allgather", "alltoall")


@dataclass(frozen=True)
class Violation:
    """One broken rule: a stable rule name, where (rank, threadblock, step) and what was expected."""

    rule: str
    message: str
    rank: int | None = None
    tb: int | None = None
    step: int | None = None

    def __str__(self) -> str:
        where = " ".join(f"{k} {v}" for k, v in (("rank", self.rank), ("tb", self.tb), ("step", self.step)) if v is not None)
        return f"{self.rule}: {where + ': ' if where else ''}{self.message}"

    def to_dict(self) -> dict:
        return {"rule": self.rule, "rank": self.rank, "tb": self.tb, "step": self.step, "message": self.message}


@dataclass(frozen=True)
class VerifyOptions:
    """What to check against. `nbytes` is the call size for the FIFO model (default: maxBytes)."""

    max_steps: int = 64
    max_threadblocks: int = 1024
    max_channels: int = MAX_CHANNELS
    rendezvous: bool = False
    nbytes: int | None = None
    max_violations: int = 200


@dataclass(frozen=True)
class Report:
    """The verdict. `ok` means every checked rule holds; `skipped` names checks that could not run."""

    violations: tuple[Violation, ...]
    checked: tuple[str, ...]
    skipped: tuple[str, ...] = ()
    stats: dict = field(default_factory=dict, compare=False)

    @property
    def ok(self) -> bool:
        return not self.violations

    def rules(self) -> set[str]:
        return {v.rule for v in self.violations}

    def summary(self) -> str:
        if self.ok:
            return (f"verified: {', '.join(self.checked)} hold"
                    + (f" ({'; '.join(self.skipped)})" if self.skipped else ""))
        return f"{len(self.violations)} violation(s) of {len(self.rules())} rule(s): {', '.join(sorted(self.rules()))}"


class _Collector:
    def __init__(self, limit: int) -> None:
        self.items: list[Violation] = []
        self.limit = limit

    def add(self, rule: str, message: str, rank: int | None = None, tb: int | None = None, step: int | None = None) -> None:
        if len(self.items) < self.limit:
            self.items.append(Violation(rule, message, rank, tb, step))

    def __len__(self) -> int:
        return len(self.items)


# -- structure ----------------------------------------------------------------------------------


def _structure(p: Program, opts: VerifyOptions, out: _Collector) -> bool:
    """Parser rules and the rules it does not check. Returns whether execution can be modelled."""
    runnable = True
    if not 1 <= p.nchannels <= opts.max_channels:
        out.add("algo.channels", f"nchannels is {p.nchannels}; expected 1..{opts.max_channels}")
    if p.max_bytes and p.min_bytes > p.max_bytes:
        out.add("algo.window", f"minBytes {p.min_bytes} > maxBytes {p.max_bytes}: the program is never selected")
    if not p.inplace and not p.outofplace:
        out.add("algo.never-selected", "neither inplace nor outofplace is set: the program is never selected")
    if p.collective in ("allgather", "reducescatter", "alltoall") and p.nchunksperloop % p.ngpus:
        out.add("algo.nchunksperloop", f"nchunksperloop {p.nchunksperloop} is not a multiple of ngpus {p.ngpus}")
        runnable = False
    ids = [g.id for g in p.gpus]
    seen: set[int] = set()
    for gid in ids:
        if gid in seen:
            out.add("gpu.duplicate", f"more than one <gpu> has id {gid}", rank=gid)
            runnable = False
        seen.add(gid)
        if not 0 <= gid < p.ngpus:
            out.add("gpu.id", f"gpu id {gid} is outside 0..{p.ngpus - 1}", rank=gid)
            runnable = False
    for r in range(p.ngpus):
        if r not in seen:
            out.add("gpu.missing", f"no <gpu> for rank {r}: it would launch no threadblocks and hang its peers", rank=r)
            runnable = False
    logical = buffer_chunks(p.collective, p.ngpus, p.nchunksperloop)
    for g in p.gpus:
        nodes = 1 + len(p.gpus) + len(g.threadblocks) + sum(len(tb.steps) for tb in g.threadblocks)
        if nodes > MAX_NODES:
            out.add("limits.nodes", f"loading this rank stores {nodes} XML nodes; the runtime's reader holds {MAX_NODES}", rank=g.id)
        if min(g.i_chunks, g.o_chunks, g.s_chunks) < 0:
            out.add("gpu.buffers", "buffer chunk counts must be >= 0", rank=g.id)
            runnable = False
        if len(g.threadblocks) > opts.max_threadblocks:
            out.add("tb.count", f"{len(g.threadblocks)} threadblocks; the limit is {opts.max_threadblocks} "
                    "(all threadblocks must be resident at once)", rank=g.id)
        tb_ids = sorted(tb.id for tb in g.threadblocks)
        if tb_ids != list(range(len(tb_ids))):
            out.add("tb.ids", f"threadblock ids must be exactly 0..{len(tb_ids) - 1}; got {_short(tb_ids)}", rank=g.id)
            runnable = False
        sends: dict[tuple[int, int], int] = {}
        recvs: dict[tuple[int, int], int] = {}
        per_chan_send: dict[int, int] = defaultdict(int)
        per_chan_recv: dict[int, int] = defaultdict(int)
        tb_by_id = {tb.id: tb for tb in g.threadblocks}
        for tb in g.threadblocks:
            for peer, kind in ((tb.send, "send"), (tb.recv, "recv")):
                if peer != -1 and not (0 <= peer < p.ngpus and peer != g.id):
                    out.add("tb.peer", f"{kind} peer {peer} must be another rank 0..{p.ngpus - 1} or -1", g.id, tb.id)
                    runnable = False
            if not 0 <= tb.chan < p.nchannels:
                out.add("tb.channel", f"chan {tb.chan} is outside 0..{p.nchannels - 1} (nchannels)", g.id, tb.id)
                runnable = False
            if tb.send >= 0:
                per_chan_send[tb.chan] += 1
                if (tb.chan, tb.send) in sends:
                    out.add("tb.duplicate-connection", f"threadblocks {sends[(tb.chan, tb.send)]} and {tb.id} both send to {tb.send} on channel {tb.chan}", g.id, tb.id)
                    runnable = False
                sends[(tb.chan, tb.send)] = tb.id
            if tb.recv >= 0:
                per_chan_recv[tb.chan] += 1
                if (tb.chan, tb.recv) in recvs:
                    out.add("tb.duplicate-connection", f"threadblocks {recvs[(tb.chan, tb.recv)]} and {tb.id} both receive from {tb.recv} on channel {tb.chan}", g.id, tb.id)
                    runnable = False
                recvs[(tb.chan, tb.recv)] = tb.id
            _steps(p, g, tb, tb_by_id, logical, opts, out)
            has_send = any(s.type in SENDING_TYPES for s in tb.steps)
            has_recv = any(s.type in RECEIVING_TYPES for s in tb.steps)
            if has_send and tb.send < 0:
                out.add("tb.no-peer", "a sending step in a threadblock without a send peer", g.id, tb.id)
                runnable = False
            if has_recv and tb.recv < 0:
                out.add("tb.no-peer", "a receiving step in a threadblock without a recv peer", g.id, tb.id)
                runnable = False
            if tb.send >= 0 and not has_send:
                out.add("tb.unused-peer", f"declares send peer {tb.send} but never sends (wastes a per-channel slot)", g.id, tb.id)
            if tb.recv >= 0 and not has_recv:
                out.add("tb.unused-peer", f"declares recv peer {tb.recv} but never receives (wastes a per-channel slot)", g.id, tb.id)
        for chan, count in sorted(per_chan_send.items()):
            if count > PER_CHANNEL_TBS:
                out.add("tb.channel-budget", f"{count} sending threadblocks on channel {chan}; at most {PER_CHANNEL_TBS}", rank=g.id)
        for chan, count in sorted(per_chan_recv.items()):
            if count > PER_CHANNEL_TBS:
                out.add("tb.channel-budget", f"{count} receiving threadblocks on channel {chan}; at most {PER_CHANNEL_TBS}", rank=g.id)
    return runnable and not any(v.rule.startswith(("dep.target", "step.bounds", "step.cnt", "step.offset")) for v in out.items)


def _short(values: list[int]) -> str:
    return str(values) if len(values) <= 8 else f"[{', '.join(map(str, values[:6]))}, ...]"


def _buffer_size(p: Program, g: Gpu, buf: str, logical: dict[str, int]) -> int:
    if buf == "s":
        return g.s_chunks
    return logical[buf]


def _steps(p: Program, g: Gpu, tb: Threadblock, tb_by_id: dict[int, Threadblock], logical: dict[str, int],
           opts: VerifyOptions, out: _Collector) -> None:
    if len(tb.steps) > opts.max_steps:
        out.add("tb.steps", f"{len(tb.steps)} steps; the runtime allows {opts.max_steps} per threadblock", g.id, tb.id)
    ndeps = 0
    pending_nop = False
    for pos, st in enumerate(tb.steps):
        if st.s != pos:
            out.add("step.index", f"s={st.s} but the step is at position {pos}; the kernel numbers steps by position", g.id, tb.id, pos)
        if st.depid >= 0:
            ndeps += 1
            target = tb_by_id.get(st.depid)
            if st.deps < 0:
                out.add("dep.target", f"depid {st.depid} with deps {st.deps}: deps must be >= 0", g.id, tb.id, pos)
            elif st.depid > MAX_DEPID:
                out.add("dep.target", f"depid {st.depid} > {MAX_DEPID}: stored as int8, it would read another flag", g.id, tb.id, pos)
            elif st.depid == tb.id:
                out.add("dep.self", f"depends on its own threadblock {tb.id}; in-order execution already covers it", g.id, tb.id, pos)
            elif target is None:
                out.add("dep.target", f"depid {st.depid} names no threadblock of this rank", g.id, tb.id, pos)
            elif st.deps >= len(target.steps):
                out.add("dep.target", f"deps {st.deps} is past the end of threadblock {st.depid} ({len(target.steps)} steps)", g.id, tb.id, pos)
            else:
                tstep = target.steps[st.deps]
                if tstep.type == "nop":
                    out.add("dep.nop-target", f"depends on a nop (threadblock {st.depid} step {st.deps}); nops publish no progress", g.id, tb.id, pos)
                elif not tstep.hasdep:
                    out.add("dep.hasdep", f"threadblock {st.depid} step {st.deps} is a dependency target but has hasdep=0: "
                            "its flag only advances at a later hasdep step", g.id, tb.id, pos)
        elif st.deps >= 0:
            out.add("dep.target", f"deps {st.deps} without a depid", g.id, tb.id, pos)
        if st.type == "nop":
            if st.depid < 0:
                out.add("dep.nop-without-dependency", "a nop without a dependency shifts the kernel's step numbering", g.id, tb.id, pos)
            pending_nop = True
            continue
        if pending_nop and st.depid < 0:
            out.add("dep.nop-chain", "the step after a run of nops must itself carry a dependency (the parser rejects it)", g.id, tb.id, pos)
        pending_nop = False
        if not 1 <= st.cnt <= MAX_CNT:
            out.add("step.cnt", f"cnt {st.cnt}; a real step moves 1..{MAX_CNT} chunks", g.id, tb.id, pos)
            continue
        for side, buf, off, used in (("src", st.srcbuf, st.srcoff, st.type in READING_TYPES),
                                     ("dst", st.dstbuf, st.dstoff, st.type in WRITING_TYPES)):
            if off > MAX_OFFSET:
                out.add("step.offset", f"{side}off {off} > {MAX_OFFSET}: stored as int16 it wraps around", g.id, tb.id, pos)
                continue
            if not used:
                continue
            size = _buffer_size(p, g, buf, logical)
            if off < 0:
                out.add("step.bounds", f"{side}off {off} on an operand the kernel uses", g.id, tb.id, pos)
            elif off + st.cnt > size:
                out.add("step.bounds", f"{side} {buf}[{off}..{off + st.cnt - 1}] is past the end of buffer {buf} ({size} chunks)", g.id, tb.id, pos)
            else:
                declared = {"i": g.i_chunks, "o": g.o_chunks, "s": g.s_chunks}[buf]
                if buf != "s" and off >= declared:
                    out.add("step.bounds", f"{side}off {off} >= {buf}_chunks {declared} declared for this rank: the parser rejects it", g.id, tb.id, pos)
    if ndeps > opts.max_steps:
        out.add("tb.steps", f"{ndeps} dependencies; at most {opts.max_steps} per threadblock", g.id, tb.id)


# -- connections ----------------------------------------------------------------------------------

# A connection is (channel, sender rank, receiver rank); its messages are step references.
StepRef = tuple[int, int, int]  # (rank, tb id, step position)


def _connections(p: Program, out: _Collector) -> dict[tuple[int, int, int], tuple[list[StepRef], list[StepRef]]]:
    """Pair the sending steps of each connection with its receiving steps, in order."""
    conns: dict[tuple[int, int, int], tuple[list[StepRef], list[StepRef]]] = defaultdict(lambda: ([], []))
    steps = {}
    for g in p.gpus:
        for tb in g.threadblocks:
            for pos, st in enumerate(tb.steps):
                steps[(g.id, tb.id, pos)] = st
                if st.type in SENDING_TYPES and tb.send >= 0:
                    conns[(tb.chan, g.id, tb.send)][0].append((g.id, tb.id, pos))
                if st.type in RECEIVING_TYPES and tb.recv >= 0:
                    conns[(tb.chan, tb.recv, g.id)][1].append((g.id, tb.id, pos))
    for (chan, a, b), (sends, recvs) in sorted(conns.items()):
        if len(sends) != len(recvs):
            ref = (sends or recvs)[0]
            out.add("connection.count", f"channel {chan}, rank {a} -> rank {b}: {len(sends)} sending step(s) but {len(recvs)} "
                    "receiving step(s); every message needs exactly one matching receive", *ref)
            continue
        for i, (s, r) in enumerate(zip(sends, recvs)):
            if steps[s].cnt != steps[r].cnt:
                out.add("connection.cnt", f"message {i} on channel {chan}, rank {a} -> rank {b}: sent with cnt {steps[s].cnt} "
                        f"(rank {s[0]} tb {s[1]} step {s[2]}) but received with cnt {steps[r].cnt}; the slicing would desynchronise", *r)
                break
    return conns


# -- execution: FIFOs, deadlock and levels --------------------------------------------------------


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64: deterministic pseudo-random 64-bit weights."""
    x = (x + np.uint64(0x9E3779B97F4A7C15)).astype(np.uint64)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class _Memory:
    """Every rank's buffers laid end to end in one array, in-place aliasing resolved
    (msccl-runtime.md 8.4): chunk `off` of buffer b on rank r lives at start[r, b] + off.
    One extra cell at the end (`size`) takes the accesses a step does not make."""

    def __init__(self, p: Program, inplace: bool) -> None:
        self.p = p
        self.inplace = inplace
        n, k = p.ngpus, p.nchunksperloop
        self.per = k // n if p.collective in ("allgather", "reducescatter", "alltoall") and k % n == 0 else k
        self.logical = buffer_chunks(p.collective, n, k)
        gpu_s = {g.id: g.s_chunks for g in p.gpus}
        regions: dict[tuple[int, str], int] = {}
        self.start = np.zeros((n, len(BUFFERS)), dtype=np.int64)
        size = 0
        for r in range(n):
            for b, buf in enumerate(BUFFERS):
                r2, buf2, shift = self.key(r, buf, 0)
                if (r2, buf2) not in regions:
                    regions[(r2, buf2)] = size
                    size += gpu_s.get(r2, 0) if buf2 == "s" else self.logical[buf2]
                self.start[r, b] = regions[(r2, buf2)] + shift
        self.size = size
        self.regions = sorted((start, key) for key, start in regions.items())

    def locate(self, cell: int) -> tuple[int, str, int]:
        """The (rank, buffer, chunk) a cell belongs to."""
        i = bisect_right(self.regions, (cell, (math.inf, ""))) - 1
        start, (rank, buf) = self.regions[i]
        return rank, buf, cell - start

    def key(self, rank: int, buf: str, off: int) -> tuple[int, str, int]:
        """The (rank, buffer, chunk) that (rank, buf, off) really is."""
        if not self.inplace:
            return rank, buf, off
        coll = self.p.collective
        if coll in ("allreduce", "alltoall", "broadcast", "reduce") and buf == "o":
            return rank, "i", off
        if coll == "allgather" and buf == "i":
            return rank, "o", rank * self.per + off
        if coll == "reducescatter" and buf == "o":
            return rank, "i", rank * self.per + off
        return rank, buf, off


class _Values:
    """Symbolic contents of every rank's buffers: per chunk an identity, a contribution count
    and a 64-bit sum of the contributors' random weights (exact up to a 2^-64 collision
    chance): one int64 row of three per `_Memory` cell, so a chunk moves as one 24-byte
    copy (the sum wraps around as uint64 would)."""

    def __init__(self, p: Program, memory: _Memory) -> None:
        self.p = p
        self.memory = memory
        self.logical = memory.logical
        n = p.ngpus
        self.per = memory.per
        ranks = np.arange(n, dtype=np.uint64)
        self.weight = _mix64(ranks * np.uint64(2654435761) + np.uint64(12345)).view(np.int64)
        self.cells = np.zeros((memory.size + 1, 3), dtype=np.int64)
        self.cells[:, 0] = -1
        size = self.logical["i"]
        for r in range(n):
            self.write(r, "i", 0, np.stack([self._input_ident(r, size), np.ones(size, dtype=np.int64),
                                            np.full(size, self.weight[r], dtype=np.int64)]))

    def _input_ident(self, r: int, size: int) -> np.ndarray:
        coll = self.p.collective
        idx = np.arange(size, dtype=np.int64)
        if coll in ("allreduce", "reducescatter", "reduce"):
            return idx  # contributions to chunk c are reduced together across ranks
        return r * size + idx  # (origin rank, chunk): the data itself moves

    def read(self, rank: int, buf: str, off: int, cnt: int) -> np.ndarray:
        """Rows (identity, count, weight sum) of cnt chunks from off."""
        at = int(self.memory.start[rank, _BUF_INDEX[buf]]) + off
        return self.cells[at:at + cnt].T

    def write(self, rank: int, buf: str, off: int, value: np.ndarray) -> None:
        at = int(self.memory.start[rank, _BUF_INDEX[buf]]) + off
        self.cells[at:at + value.shape[1]] = value.T

    def expected_output(self, rank: int) -> np.ndarray:
        coll, n = self.p.collective, self.p.ngpus
        size = self.logical["o"]
        idx = np.arange(size, dtype=np.int64)
        full = self.weight.sum(dtype=np.int64)  # wraps around like the sums it is compared with
        if coll == "allreduce":
            return np.stack([idx, np.full(size, n, dtype=np.int64), np.full(size, full, dtype=np.int64)])
        if coll == "reducescatter":
            return np.stack([rank * size + idx, np.full(size, n, dtype=np.int64), np.full(size, full, dtype=np.int64)])
        if coll == "allgather":
            origin = idx // self.per
            return np.stack([idx, np.ones(size, dtype=np.int64), self.weight[origin]])
        # alltoall: output block q (chunks q*per..) comes from rank q's input block for this rank
        per_peer = size // n
        origin = idx // per_peer
        src_chunk = rank * per_peer + idx % per_peer
        return np.stack([origin * size + src_chunk, np.ones(size, dtype=np.int64), self.weight[origin]])


@dataclass
class _TbState:
    rank: int
    tb: Threadblock
    col: int  # the threadblock's index on its rank
    me: int  # index into _Execution.states
    reals: list[int]  # positions of real steps
    # per position: index into reals of the step whose completion a wait for that position
    # waits for (the first real step at or after it; the last one, for trailing nops; -1: none)
    done_by: list[int]
    # per real step: (position, receives, sends, messages, dependencies as (state index, position))
    plan: list[tuple[int, bool, bool, int, tuple[tuple[int, int], ...]]]
    conn_in: int = -1  # index of the connection it receives on
    conn_out: int = -1  # and sends on
    index: int = 0  # into reals
    unit: int = 0  # messages of the current step done
    iteration: int = 0
    done: bool = False
    waiting: tuple[int, int, int] | None = None
    level: int = -1  # level of the step started last
    levels: list[int] = field(default_factory=list)  # per real step: its level in iteration 0 (-1: not started)
    # per receiving real step of iteration 0: (state index, real step index) of the send it took
    received_from: dict[int, tuple[int, int]] = field(default_factory=dict)

    def started(self) -> int:
        """How many real steps of the first iteration have started (all, once it is over)."""
        return len(self.reals) if self.iteration else self.index + (self.unit > 0)


def _done_by(nsteps: int, reals: list[int]) -> list[int]:
    """Per position of a threadblock of nsteps steps with real steps at `reals`: the index
    into reals of the step whose completion satisfies a wait for that position. Progress is
    published by real steps, so a wait for a nop ends with the first real step after it."""
    out = [len(reals) - 1] * nsteps  # past the last real step: the iteration's end
    for i in range(len(reals) - 1, -1, -1):
        for pos in range(reals[i - 1] + 1 if i else 0, reals[i] + 1):
            out[pos] = i
    return out


class _Execution:
    """Runs the program against bounded connection FIFOs and dependency flags.

    FIFOs are counted in messages (a step of cnt chunks is several messages at large sizes)
    and progress is batched: a threadblock moves as many messages of its current step as
    the FIFOs allow. On the way it gives every step of the first iteration a level, one more
    than the levels of the steps it follows (in its threadblock, through dependencies and
    through the message it receives): steps of one level are unordered, so the semantics and
    the race check can take each level in one vectorised step. Threadblocks and connections
    are numbered, so the inner loop works on lists.
    """

    def __init__(self, p: Program, capacity: int, messages: dict[int, int], loops: int) -> None:
        self.capacity = capacity
        self.iterations = loops
        keys = [(g.id, tb.id) for g in p.gpus for tb in g.threadblocks]
        number = {key: i for i, key in enumerate(keys)}
        conns: dict[tuple[int, int, int], int] = {}
        self.states: list[_TbState] = []
        for g in p.gpus:
            for col, tb in enumerate(g.threadblocks):
                reals, pending, plan = [], [], []
                for pos, st in enumerate(tb.steps):
                    if st.depid >= 0:
                        pending.append((st.depid, st.deps))
                    if st.type != "nop":
                        reals.append(pos)
                        waits = tuple((number[(g.id, d)], q) for d, q in pending if (g.id, d) in number) if pending else ()
                        units = 1 if st.type in ("cpy", "re") else messages[st.cnt]
                        plan.append((pos, st.type in RECEIVING_TYPES, st.type in SENDING_TYPES, units, waits))
                        if pending:
                            pending = []
                state = _TbState(g.id, tb, col, len(self.states), reals, _done_by(len(tb.steps), reals), plan,
                                 levels=[-1] * len(reals))
                if tb.recv >= 0:
                    state.conn_in = conns.setdefault((tb.chan, tb.recv, g.id), len(conns))
                if tb.send >= 0:
                    state.conn_out = conns.setdefault((tb.chan, g.id, tb.send), len(conns))
                self.states.append(state)
        self.tbs: dict[tuple[int, int], _TbState] = dict(zip(keys, self.states))
        self.count = [0] * len(conns)  # messages in each FIFO
        # per connection, its first iteration's sends not yet taken: (level, state, real step index)
        self.sent: list[deque] = [deque() for _ in conns]
        self.sender = [-1] * len(conns)
        self.receiver = [-1] * len(conns)
        for st in self.states:
            if st.conn_out >= 0:
                self.sender[st.conn_out] = st.me
            if st.conn_in >= 0:
                self.receiver[st.conn_in] = st.me
        # dependency flags: the iteration and last completed position of each threadblock
        self.done_iteration = [0] * len(self.states)
        self.done_pos = [-1] * len(self.states)
        self.waiters: dict[int, set[int]] = defaultdict(set)

    def step(self, st: _TbState) -> Step:
        return st.tb.steps[st.reals[st.index]]

    def unmet(self, st: _TbState) -> list[int]:
        """The threadblocks whose progress the current step still waits for."""
        return [t for t, q in st.plan[st.index][4] if self.done_iteration[t] < st.iteration
                or (self.done_iteration[t] == st.iteration and self.done_pos[t] < q)]

    def deps_met(self, st: _TbState, register: bool = False) -> bool:
        done_iteration, done_pos, iteration = self.done_iteration, self.done_pos, st.iteration
        for t, q in st.plan[st.index][4]:
            it = done_iteration[t]
            if it < iteration or (it == iteration and done_pos[t] < q):
                if register:
                    self.waiters[t].add(st.me)
                return False
        return True

    def rendezvous_ok(self, st: _TbState, depth: int = 0) -> bool:
        """With no room left, a message can still go if its receiver is waiting for it now
        (and, for a fused receiver, can pass it on in turn)."""
        conn = st.conn_out
        if depth > 64 or self.count[conn]:
            return False
        r = self.receiver[conn]
        if r < 0:
            return False
        rs = self.states[r]
        if rs.done or (rs.unit == 0 and not self.deps_met(rs)):
            return False
        _pos, receives, sends, _units, _waits = rs.plan[rs.index]
        if not receives:
            return False
        if sends:
            return self.count[rs.conn_out] < self.capacity or self.rendezvous_ok(rs, depth + 1)
        return True

    def run(self) -> list[tuple[int, int]]:
        """Run to completion or to a stop; return the threadblocks left unfinished."""
        order = sorted(range(len(self.states)), key=lambda i: (self.states[i].rank, self.states[i].tb.id))
        queue = deque(order)
        queued = set(queue)
        states = self.states
        while queue:
            i = queue.popleft()
            queued.discard(i)
            for w in self.advance(states[i]):
                if w not in queued:
                    queued.add(w)
                    queue.append(w)
        return [(st.rank, st.tb.id) for st in states if not st.done]

    def advance(self, st: _TbState) -> set[int]:
        woken: set[int] = set()
        count, capacity = self.count, self.capacity
        while not st.done:
            if not st.reals:
                self.finish_iteration(st, woken)
                continue
            pos, receives, sends, total, waits = st.plan[st.index]
            if waits and st.unit == 0 and not self.deps_met(st, register=True):
                return woken
            k = total - st.unit
            if receives:
                conn_in = st.conn_in
                k = min(k, count[conn_in])
                if k == 0:
                    marker = (st.iteration, st.index, st.unit)
                    if capacity == 0 and st.waiting != marker:
                        st.waiting = marker  # a rendezvous sender may hand over now: let it retry once
                        woken.add(self.sender[conn_in])
                    return woken
            if sends:
                conn_out = st.conn_out
                room = capacity - count[conn_out]
                if room <= 0 and self.rendezvous_ok(st):
                    room = 1
                k = min(k, room)
                if k <= 0:
                    return woken
            if st.unit == 0 and st.iteration == 0:
                # both ends of a connection take part in the first iteration only: they stay in step
                level = st.level
                if receives:
                    sent_level, sender, index = self.sent[conn_in].popleft()
                    st.received_from[st.index] = (sender, index)
                    level = max(level, sent_level)
                for t, q in waits:
                    target = self.states[t]
                    if 0 <= q < len(target.done_by) and target.done_by[q] >= 0:
                        level = max(level, target.levels[target.done_by[q]])
                st.level = st.levels[st.index] = level + 1
                if sends:
                    self.sent[conn_out].append((st.level, st.me, st.index))
            if receives:
                count[conn_in] -= k
                woken.add(self.sender[conn_in])
            if sends:
                count[conn_out] += k
                woken.add(self.receiver[conn_out])
            st.unit += k
            if st.unit >= total:
                st.unit = 0
                self.done_iteration[st.me], self.done_pos[st.me] = st.iteration, pos
                woken.update(self.waiters.pop(st.me, ()))
                st.index += 1
                if st.index >= len(st.reals):
                    self.finish_iteration(st, woken)
        return woken

    def finish_iteration(self, st: _TbState, woken: set) -> None:
        st.iteration += 1
        st.index = 0
        if st.reals:
            self.done_iteration[st.me], self.done_pos[st.me] = st.iteration - 1, st.reals[-1]
        if st.iteration >= self.iterations:
            st.done = True
            self.done_iteration[st.me], self.done_pos[st.me] = self.iterations, -1
        woken.update(self.waiters.pop(st.me, ()))

    # -- deadlock report
    def waiting_for(self, key: tuple[int, int]) -> tuple[str, list[tuple[int, int]]]:
        st = self.tbs[key]
        step = self.step(st)
        pos = st.reals[st.index]
        if st.unit == 0 and not self.deps_met(st):
            targets = [(self.states[t].rank, self.states[t].tb.id) for t in self.unmet(st)]
            return f"step {pos} ({step.type}) waits for its dependencies", targets
        if step.type in RECEIVING_TYPES and not self.count[st.conn_in]:
            s = self.sender[st.conn_in]
            return (f"step {pos} ({step.type}) waits to receive from rank {st.tb.recv} on channel {st.tb.chan}",
                    [(self.states[s].rank, self.states[s].tb.id)] if s >= 0 else [])
        r = self.receiver[st.conn_out]
        return (f"step {pos} ({step.type}) waits for room to send to rank {st.tb.send} on channel {st.tb.chan}",
                [(self.states[r].rank, self.states[r].tb.id)] if r >= 0 else [])


def _deadlock_report(ex: _Execution, stuck: list[tuple[int, int]], out: _Collector) -> None:
    graph: dict[tuple[int, int], list[tuple[int, int]]] = {}
    why: dict[tuple[int, int], str] = {}
    stuck_set = set(stuck)
    for key in stuck:
        text, targets = ex.waiting_for(key)
        why[key] = text
        graph[key] = [t for t in targets if t in stuck_set]
    cycle = _find_cycle(graph)
    if cycle:
        parts = [f"rank {r} tb {t} {why[(r, t)]}" for r, t in cycle]
        r0, t0 = cycle[0]
        st = ex.tbs[(r0, t0)]
        out.add("deadlock.cycle", "with bounded connection FIFOs these steps wait for each other in a cycle: "
                + " -> ".join(parts) + " -> back to the first", r0, t0, st.reals[st.index])
        return
    key = min(stuck)
    st = ex.tbs[key]
    out.add("deadlock.starved", f"rank {key[0]} tb {key[1]} {why[key]}, which never happens "
            f"({len(stuck)} threadblock(s) cannot finish)", key[0], key[1], st.reals[st.index])


def _find_cycle(graph: dict) -> list | None:
    color: dict = {}
    for start in sorted(graph):
        if start in color:
            continue
        stack = [(start, iter(graph[start]))]
        path = [start]
        color[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                path.pop()
                color[node] = 2
                continue
            if color.get(nxt) == 1:
                return path[path.index(nxt):]
            if nxt not in color:
                color[nxt] = 1
                stack.append((nxt, iter(graph.get(nxt, []))))
                path.append(nxt)
    return None


def fifo_model(p: Program, nbytes: int | None = None, rendezvous: bool = False) -> tuple[int, int, int]:
    """(messages a connection holds, chunks per message, iterations) at a call of nbytes.

    The default size is the window's worst case, maxBytes (0 = unbounded: one chunk per
    message, and two iterations to catch threadblocks that run ahead).
    """
    size = p.max_bytes if nbytes is None else nbytes
    max_allowed = max_allowed_count(p.protocol, size, p.nchunksperloop)
    loops = iterations(p.protocol, size, p.nchunksperloop) if size > 0 else 2
    capacity = 0 if rendezvous else FIFO_MESSAGES[p.protocol]
    return capacity, max_allowed, loops


def _execute(p: Program, opts: VerifyOptions, out: _Collector) -> tuple[bool, _Execution]:
    capacity, max_allowed, loops = fifo_model(p, opts.nbytes, opts.rendezvous)
    if loops > MAX_ITERATIONS:
        out.add("limits.iterations", f"{loops} loop iterations at {opts.nbytes or p.max_bytes} bytes; the flag encoding allows {MAX_ITERATIONS}")
    messages = {c: max(1, math.ceil(c / max_allowed)) for c in range(0, MAX_CNT + 1)}
    ex = _Execution(p, capacity, messages, min(loops, 2))
    stuck = ex.run()
    if stuck:
        _deadlock_report(ex, stuck, out)
        return False, ex
    return True, ex


# -- semantics: symbolic execution a level at a time ------------------------------------------


@dataclass(frozen=True)
class _Table:
    """The real steps of the first iteration that started (every one, when the program runs
    to completion) as numpy columns, one row per step, grouped by rank (in the program's
    order) and threadblock, in step order."""

    rank: np.ndarray
    tid: np.ndarray
    col: np.ndarray  # the threadblock's index on its rank
    pos: np.ndarray
    level: np.ndarray
    kind: np.ndarray  # index into STEP_TYPES
    srcbuf: np.ndarray
    srcoff: np.ndarray
    dstbuf: np.ndarray
    dstoff: np.ndarray
    cnt: np.ndarray
    prev: np.ndarray  # row of the threadblock's previous real step, or -1
    dep_row: np.ndarray  # each dependency on another threadblock: the waiting row...
    dep_target: np.ndarray  # ...and the row whose completion it waits for (_TbState.done_by)
    send_of: np.ndarray  # for a receiving row: the row of the sending step it is matched with, else -1
    rank_rows: tuple[tuple[int, int, int], ...]  # per rank: (first row, end row, threadblocks)
    order: np.ndarray  # the rows by level: every step after those it follows

    def ref(self, row: int) -> StepRef:
        return int(self.rank[row]), int(self.tid[row]), int(self.pos[row])


def _table(p: Program, ex: _Execution) -> _Table:
    # typed arrays: a Python list of ints would hold tens of bytes per step and column
    cols: dict[str, array] = {name: array("q") for name in ("rank", "tid", "col", "pos", "level", "kind", "srcbuf",
                                                             "srcoff", "dstbuf", "dstoff", "cnt", "prev")}
    dep_row: list[int] = []
    dep_target: list[int] = []
    base = list(accumulate((st.started() for st in ex.states), initial=0))  # first row of each state
    rank_rows = []
    i = 0  # states come rank by rank, in the program's order
    for g in p.gpus:
        ntb = len(g.threadblocks)
        rank_rows.append((base[i], base[i + ntb], ntb))
        i += ntb
    send_of = np.full(base[-1], -1, dtype=np.int64)
    for st in ex.states:
        tb = st.tb
        reals = st.reals[:st.started()]
        steps = [tb.steps[pos] for pos in reals]
        m, b = len(steps), base[st.me]
        cols["rank"].extend([st.rank] * m)
        cols["tid"].extend([tb.id] * m)
        cols["col"].extend([st.col] * m)
        cols["pos"].extend(reals)
        cols["level"].extend(st.levels[:m])
        cols["kind"].extend([_TYPE_INDEX[s.type] for s in steps])
        cols["srcbuf"].extend([_BUF_INDEX.get(s.srcbuf, 0) for s in steps])
        cols["srcoff"].extend([s.srcoff for s in steps])
        cols["dstbuf"].extend([_BUF_INDEX.get(s.dstbuf, 0) for s in steps])
        cols["dstoff"].extend([s.dstoff for s in steps])
        cols["cnt"].extend([s.cnt for s in steps])
        cols["prev"].extend(array("q", range(b - 1, b + m - 1)))
        if m:
            cols["prev"][-m] = -1
        for i, step_plan in enumerate(st.plan[:m]):
            for t, q in step_plan[4]:
                target = ex.states[t]
                if target is not st and 0 <= q < len(target.done_by) and target.done_by[q] >= 0:
                    dep_row.append(b + i)
                    dep_target.append(base[t] + target.done_by[q])
        for i, (sender, index) in st.received_from.items():
            send_of[b + i] = base[sender] + index
    arrays = {name: np.frombuffer(values, dtype=np.int64) if len(values) else np.zeros(0, dtype=np.int64)
              for name, values in cols.items()}
    return _Table(**arrays, dep_row=np.asarray(dep_row, dtype=np.int64), dep_target=np.asarray(dep_target, dtype=np.int64),
                  send_of=send_of, rank_rows=tuple(rank_rows), order=np.argsort(arrays["level"], kind="stable"))


def _level_bounds(levels: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of equal values in a sorted array."""
    cuts = np.flatnonzero(levels[1:] != levels[:-1]) + 1
    edges = [0, *cuts.tolist(), len(levels)]
    return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def _semantics(p: Program, t: _Table, inplace: bool, out: _Collector, budget: int) -> tuple[_Values, int]:
    """Symbolic execution of the first iteration in one mode (in place or out of place), one
    level at a time: each level's steps read, receive, reduce and write all their chunks in
    a few array operations. Steps of one level are unordered, so where they touch the same
    chunk they race (reported when the run completes). What a level sends is kept until the last level that
    receives it. Reports at most `budget` violations; returns the values and what is left."""
    memory = _Memory(p, inplace)
    values = _Values(p, memory)
    cells = values.cells
    mode = "in place" if inplace else "out of place"
    nrows = len(t.level)
    order = t.order
    bounds = _level_bounds(t.level[order])
    sizes = [b - a for a, b in bounds]
    level_of = np.empty(nrows, dtype=np.int64)  # row -> index into bounds
    level_of[order] = np.repeat(np.arange(len(bounds)), sizes)
    cnt = t.cnt[order]
    first = np.cumsum(cnt) - cnt
    within = np.empty(nrows, dtype=np.int64)  # row -> its first chunk's place in its level's arrays
    within[order] = first - np.repeat(first[[a for a, _b in bounds]], sizes)
    receivers = np.flatnonzero(t.send_of >= 0)
    last_use = np.full(len(bounds), -1, dtype=np.int64)  # the last level receiving what a level sends
    np.maximum.at(last_use, level_of[t.send_of[receivers]], level_of[receivers])
    src_of = np.where(_READS[t.kind], memory.start[t.rank, t.srcbuf] + t.srcoff, memory.size)  # per row
    dst_of = np.where(_WRITES[t.kind], memory.start[t.rank, t.dstbuf] + t.dstoff, memory.size)
    kept: dict[int, np.ndarray] = {}
    n = p.ngpus
    for li, (sa, sb) in enumerate(bounds):
        rows, c = order[sa:sb], cnt[sa:sb]
        row = np.repeat(rows, c)
        j = np.arange(int(c.sum()), dtype=np.int64) - np.repeat(first[sa:sb] - first[sa], c)
        kind = np.repeat(t.kind[rows], c)
        reads, writes, takes, reduces = _READS[kind], _WRITES[kind], _TAKES[kind], _REDUCES[kind]
        src = np.repeat(src_of[rows], c) + np.where(reads, j, 0)
        dst = np.repeat(dst_of[rows], c) + np.where(writes, j, 0)
        local = cells[src]
        result = local.copy()
        take_at = np.flatnonzero(takes)
        if len(take_at):
            sender = t.send_of[row[take_at]]
            from_level = level_of[sender]
            from_place = within[sender] + j[take_at]
            for lv in np.unique(from_level).tolist():
                sel = from_level == lv
                result[take_at[sel]] = kept[lv][from_place[sel]]
        found: list[tuple[int, int, str, str]] = []  # (element, check, rule, message)
        red_at = np.flatnonzero(reduces)
        if len(red_at):
            x = result[red_at]  # the received operand, or for `re` the destination's own value
            re_at = red_at[kind[red_at] == _RE]
            if len(re_at):
                x[np.searchsorted(red_at, re_at)] = cells[dst[re_at]]
            y = local[red_at]
            total = x + y  # counts and weight sums add; identities must agree
            total[:, 0] = np.where(x[:, 0] < 0, y[:, 0], x[:, 0])
            result[red_at] = total
            if budget > 0:
                mismatch = np.flatnonzero((x[:, 0] != y[:, 0]) & (x[:, 0] >= 0) & (y[:, 0] >= 0))
                for k in _first_per_step(mismatch, row[red_at]):
                    e = int(red_at[k])
                    found.append((e, 1, "semantics.reduce-mismatch",
                                  f"reduces chunk identity {int(y[k, 0])} into {int(x[k, 0])} at "
                                  f"{BUFFERS[int(t.srcbuf[row[e]])]}[{int(t.srcoff[row[e]] + j[e])}]: the operands belong to different chunks"))
                for k in _first_per_step(np.flatnonzero(total[:, 1] > n), row[red_at]):
                    found.append((int(red_at[k]), 2, "semantics.duplicate", "a reduction counts some rank's contribution "
                                  f"twice ({int(total[k, 1])} contributions from {n} ranks)"))
        if budget > 0:
            for e in _first_per_step(np.flatnonzero(reads & (local[:, 0] < 0)), row):
                found.append((e, 0, "semantics.uninitialized-read", f"{mode}: reads "
                              f"{BUFFERS[int(t.srcbuf[row[e]])]}[{int(t.srcoff[row[e]] + j[e])}] before anything was written there"))
        for e, _check, rule, message in sorted(found, key=lambda f: (int(row[f[0]]), f[1])):
            if budget > 0:
                out.add(rule, message, *t.ref(int(row[e])))
            budget -= 1
        cells[dst] = result
        if last_use[li] > li:
            kept[li] = result
        for lv in [lv for lv in kept if last_use[lv] <= li]:
            del kept[lv]
    return values, budget


def _first_per_step(elements: np.ndarray, row: np.ndarray) -> list[int]:
    """Of the given (sorted) indices into `row`, the first of each step."""
    if not len(elements):
        return []
    rows = row[elements]
    keep = np.ones(len(elements), dtype=bool)
    keep[1:] = rows[1:] != rows[:-1]
    return elements[keep].tolist()


def _check_results(p: Program, values: _Values, mode: str, out: _Collector) -> None:
    errors = 0
    for rank in range(p.ngpus):
        got = values.read(rank, "o", 0, values.logical["o"])
        want = values.expected_output(rank)
        bad = (got != want).any(axis=0)
        if bad.any():
            j = int(np.argmax(bad))
            if got[0][j] < 0:
                detail = "was never written"
            elif got[0][j] != want[0][j]:
                detail = f"holds chunk identity {int(got[0][j])}, expected {int(want[0][j])}"
            elif got[1][j] != want[1][j]:
                detail = f"holds {int(got[1][j])} contribution(s), expected {int(want[1][j])}"
            else:
                detail = "holds the right number of contributions but from the wrong ranks"
            out.add("semantics.result", f"{mode}: output chunk {j} {detail} "
                    f"({int(bad.sum())} wrong chunk(s) on this rank)", rank)
            errors += 1
            if errors >= 10:
                return


# -- races ------------------------------------------------------------------------------------


#: The race check takes ranks in batches of at most this many vector clock entries and
#: chunk accesses (or one rank), to keep its arrays to tens of MiB.
_CLOCK_ENTRIES = 1 << 22
_BATCH_CHUNKS = 1 << 18


def _races(p: Program, t: _Table, conns: dict, inplace: bool, out: _Collector) -> None:
    """Conflicting accesses from different threadblocks of a rank must be ordered.

    Each step gets a vector clock over its rank's threadblocks (the last step of each that
    happens before it through threadblock order and dependencies), computed a level at a
    time for a batch of ranks. Accesses to each chunk are taken in level order; every read
    must follow the last write, and every write the last write and the reads since (the
    usual last-writer check, linear in the number of accesses). Pairs left unordered are
    then searched for in the global order, which also runs through messages to other ranks
    and back.
    """
    memory = _Memory(p, inplace)
    candidates: list[tuple[StepRef, StepRef, str, int]] = []
    touched = (_READS[t.kind].astype(np.int64) + _WRITES[t.kind]) * t.cnt  # chunks each step reads and writes
    ends = np.concatenate([[0], np.cumsum(touched)])
    groups: list[tuple[int, int]] = []  # row ranges of whole ranks whose accesses are checked together
    width = 0
    for first, end, ntbs in t.rank_rows:
        if groups and (end - groups[0][0]) * max(width, ntbs) > _CLOCK_ENTRIES:
            candidates += _unordered(t, memory, groups, width)
            groups, width = [], 0
        if groups and ends[end] - ends[groups[-1][0]] <= _BATCH_CHUNKS:
            groups[-1] = (groups[-1][0], end)
        else:
            groups.append((first, end))
        width = max(width, ntbs)
    if groups:
        candidates += _unordered(t, memory, groups, width)
    if not candidates:
        return
    # confirm with the global happens-before graph (orders through other ranks' messages)
    msg_next: dict[StepRef, list[StepRef]] = defaultdict(list)
    for (_chan, _a, _b), (sends, recvs) in conns.items():
        for s_ref, r_ref in zip(sends, recvs):
            msg_next[s_ref].append(r_ref)
    dep_next: dict[StepRef, list[StepRef]] = defaultdict(list)
    tb_len: dict[tuple[int, int], int] = {}
    for g in p.gpus:
        for tb in g.threadblocks:
            tb_len[(g.id, tb.id)] = len(tb.steps)
            for pos in range(len(tb.steps)):
                for dtid, dpos in _step_deps(tb, pos):
                    dep_next[(g.id, dtid, dpos)].append((g.id, tb.id, pos))
    for checked, (a, b, rule, slot) in enumerate(candidates):
        if checked < 200 and _reaches(a, b, msg_next, dep_next, tb_len):
            continue
        r, buf, off = memory.locate(slot)
        out.add(rule, f"threadblocks {a[1]} (step {a[2]}) and {b[1]} (step {b[2]}) both touch {buf}[{off}], "
                f"{'both writing' if rule == 'race.write-write' else 'one writing what the other reads'}, "
                f"with no order between them through dependencies or messages{' (in place)' if inplace else ''}",
                a[0], b[1], b[2])


def _unordered(t: _Table, memory: _Memory, groups: list[tuple[int, int]], width: int) -> list[tuple[StepRef, StepRef, str, int]]:
    """Conflicting pairs of accesses among the rows of `groups` (consecutive row ranges of
    whole ranks) that the ranks' own order (threadblock order and dependencies) leaves
    unordered. Vector clocks are computed for all groups at once, a level at a time; the
    accesses one group at a time."""
    lo, hi = groups[0][0], groups[-1][1]
    n = hi - lo
    if n == 0:
        return []
    srt = np.argsort(t.level[lo:hi], kind="stable")  # a linear extension of each rank's order
    at = np.empty(n, dtype=np.int64)
    at[srt] = np.arange(n)  # row - lo -> its place in srt
    rows = srt + lo
    prev = t.prev[rows]
    prev = np.where(prev >= 0, at[np.maximum(prev - lo, 0)], n)  # n: the clock of no step
    inside = (t.dep_row >= lo) & (t.dep_row < hi)
    d_row = at[t.dep_row[inside] - lo]
    d_tgt = at[t.dep_target[inside] - lo]
    by = np.argsort(d_row, kind="stable")
    d_row, d_tgt = d_row[by], d_tgt[by]
    col, pos = t.col[rows], t.pos[rows]
    clock = np.full((n + 1, width), -1, dtype=np.int32)
    for a, b in _level_bounds(t.level[rows]):
        acc = clock[prev[a:b]]
        da, db = np.searchsorted(d_row, (a, b))
        if db > da:
            np.maximum.at(acc, d_row[da:db] - a, clock[d_tgt[da:db]])
        acc[np.arange(b - a), col[a:b]] = pos[a:b]
        clock[a:b] = acc
    out: list[tuple[StepRef, StepRef, str, int]] = []
    for glo, ghi in groups:
        places = np.sort(at[glo - lo:ghi - lo])
        out += _conflicts(t, memory, rows, places, clock, col, pos)
    return out


def _conflicts(t: _Table, memory: _Memory, rows: np.ndarray, places: np.ndarray, clock: np.ndarray,
               col: np.ndarray, pos: np.ndarray) -> list[tuple[StepRef, StepRef, str, int]]:
    """The last-writer check over the accesses of the steps at `places` (in level order)."""
    sel = rows[places]
    kind, cnt, rank = t.kind[sel], t.cnt[sel], t.rank[sel]
    reads, writes = _READS[kind], _WRITES[kind]
    starts = np.concatenate([memory.start[rank, t.srcbuf[sel]] + t.srcoff[sel], memory.start[rank, t.dstbuf[sel]] + t.dstoff[sel]])
    used = np.concatenate([reads, writes])
    starts, counts = starts[used], np.concatenate([cnt, cnt])[used]
    steps = np.concatenate([places, places])[used]
    wr = np.concatenate([np.zeros(len(sel), dtype=bool), np.ones(len(sel), dtype=bool)])[used]
    if not len(starts):
        return []
    total = int(counts.sum())
    first = np.repeat(np.cumsum(counts) - counts, counts)
    slot = np.repeat(starts, counts) + (np.arange(total) - first)
    step = np.repeat(steps, counts)
    wr = np.repeat(wr, counts)
    srt2 = np.lexsort((~wr, step, slot))  # by cell, then order (a read before a write of one step)
    slot, step, wr = slot[srt2], step[srt2], wr[srt2]
    m = len(slot)
    idx = np.arange(m)
    new_group = np.ones(m, dtype=bool)
    new_group[1:] = slot[1:] != slot[:-1]
    group_start = np.maximum.accumulate(np.where(new_group, idx, 0))
    last_write = np.maximum.accumulate(np.where(wr, idx, -1))
    prev_write = np.full(m, -1, dtype=np.int64)
    prev_write[1:] = last_write[:-1]
    prev_write = np.where(prev_write >= group_start, prev_write, -1)
    # reads: against the last write; writes: against everything since the last write
    first_pair = np.where(wr, np.maximum(prev_write, group_start), prev_write)
    first_pair = np.where(~wr & (prev_write < 0), idx, first_pair)
    npairs = np.where(wr, idx - first_pair, np.where(prev_write >= 0, 1, 0))
    later = np.repeat(idx, npairs)
    offsets = np.arange(int(npairs.sum())) - np.repeat(np.cumsum(npairs) - npairs, npairs)
    earlier = np.repeat(first_pair, npairs) + offsets
    a_step, b_step = step[earlier], step[later]
    ordered = clock[b_step, col[a_step]] >= pos[a_step]
    bad = np.flatnonzero((col[a_step] != col[b_step]) & ~ordered)
    out: list[tuple[StepRef, StepRef, str, int]] = []
    seen: set[tuple[int, int]] = set()
    for k in bad.tolist():
        pair = (int(a_step[k]), int(b_step[k]))
        if pair in seen:
            continue
        seen.add(pair)
        rule = "race.write-write" if wr[earlier[k]] and wr[later[k]] else "race.read-write"
        out.append((t.ref(int(rows[pair[0]])), t.ref(int(rows[pair[1]])), rule, int(slot[later[k]])))
    return out


def _step_deps(tb: Threadblock, pos: int) -> list[tuple[int, int]]:
    """The (tb, step) pairs step `pos` waits for: its own dependency and those of the nops before it."""
    deps = []
    st = tb.steps[pos]
    if st.depid >= 0:
        deps.append((st.depid, st.deps))
    j = pos - 1
    while j >= 0 and tb.steps[j].type == "nop" and st.type != "nop":
        if tb.steps[j].depid >= 0:
            deps.append((tb.steps[j].depid, tb.steps[j].deps))
        j -= 1
    return deps


def _reaches(a: StepRef, b: StepRef, msg_next: dict, dep_next: dict, tb_len: dict, limit: int = 200000) -> bool:
    seen = {a}
    stack = [a]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node == b:
            return True
        rank, tid, pos = node
        nxt = []
        if pos + 1 < tb_len[(rank, tid)]:
            nxt.append((rank, tid, pos + 1))
        nxt.extend(dep_next.get(node, ()))
        nxt.extend(msg_next.get(node, ()))
        for m in nxt:
            if m not in seen:
                seen.add(m)
                stack.append(m)
    return False


# -- entry point ------------------------------------------------------------------------------


def verify(program: Program, options: VerifyOptions = VerifyOptions()) -> Report:
    """Check every rule; a Report with `ok` True is a proof for the modelled runtime."""
    with paused():  # the run builds a state per threadblock and step: collections would walk them all
        return _verify(program, options)


def _verify(program: Program, options: VerifyOptions) -> Report:
    out = _Collector(options.max_violations)
    checked, skipped = ["structure"], []
    runnable = _structure(program, options, out)
    conns = _connections(program, out)
    checked.append("connections")
    if any(v.rule.startswith("connection.") for v in out.items):
        runnable = False
    if not runnable:
        skipped.append("execution, semantics and races not checked: fix the structural rules first")
        return Report(tuple(out.items), tuple(checked), tuple(skipped))
    semantic = program.collective in SEMANTIC_COLLECTIVES
    modes = [m for m, on in ((True, program.inplace), (False, program.outofplace)) if on] if semantic else []
    if not semantic:
        skipped.append(f"semantics not checked: no reference semantics for {program.collective} (the XML names no root)")
    ok, ex = _execute(program, options, out)
    checked.append("deadlock")
    table = _table(program, ex)
    del ex  # the run's state per step is not needed any more: free it before the symbolic execution
    budget = 20  # semantic violations reported, over both modes
    for inplace in modes:  # one at a time: each mode's values are as large as every rank's buffers
        values, budget = _semantics(program, table, inplace, out, budget)
        if ok:
            _check_results(program, values, "in place" if inplace else "out of place", out)
        del values
    if not ok:  # what went wrong on the way may explain the deadlock
        skipped.append("results and races not checked: the program does not run to completion")
    else:
        if modes:
            checked.append("semantics")
        _races(program, table, conns, program.inplace, out)
        checked.append("races")
    stats = {"ranks": program.ngpus, "steps": program.nsteps, "threadblocks": program.max_threadblocks}
    return Report(tuple(out.items), tuple(checked), tuple(skipped), stats)
