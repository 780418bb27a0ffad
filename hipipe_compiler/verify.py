"""The verifier: proves a Program correct under the runtime's semantics, or names each
broken rule (msccl-runtime.md sections 7-12).

Checks, in order:
1. structure: the rules the runtime's parser enforces and the ones it silently does not
   (gpus, threadblock ids, peers, channels, connections, step numbering, dependencies and
   nops, offsets and buffer bounds, limits);
2. connections: per (channel, sender, receiver) the send and receive sequences agree in
   number and cnt;
3. execution with the runtime's bounded connection FIFOs at the worst size of the window:
   deadlock freedom (reporting the cycle of waiting steps), and at the same time the
   collective's semantics by symbolic execution (which rank's input chunk sits where);
4. races: two threadblocks of a rank touching the same chunk, at least one writing, with
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
from collections import defaultdict, deque
from dataclasses import dataclass, field

import numpy as np

from .runtime import (
    FIFO_MESSAGES, MAX_CHANNELS, MAX_COUNT, MAX_DEPID, MAX_ITERATIONS, MAX_NODES, MAX_OFFSET, PER_CHANNEL_TBS,
    iterations, max_allowed_count,
)
from .program import (
    BUFFERS, RECEIVING_TYPES, SENDING_TYPES, Gpu, Program, Step, Threadblock, buffer_chunks,
)

MAX_CNT = MAX_COUNT
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
        for side, buf, off, used in (("src", st.srcbuf, st.srcoff, st.type in ("s", "rrs", "rrc", "rrcs", "cpy", "re")),
                                     ("dst", st.dstbuf, st.dstoff, st.type in ("r", "rcs", "rrc", "rrcs", "cpy", "re"))):
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


# -- execution: FIFOs, deadlock and semantics -----------------------------------------------------


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64: deterministic pseudo-random 64-bit weights."""
    x = (x + np.uint64(0x9E3779B97F4A7C15)).astype(np.uint64)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class _Aliasing:
    """Where a (rank, buffer, chunk) really lives when the call is in place (msccl-runtime.md 8.4)."""

    def __init__(self, p: Program, inplace: bool) -> None:
        self.p = p
        self.inplace = inplace
        n, k = p.ngpus, p.nchunksperloop
        self.per = k // n if p.collective in ("allgather", "reducescatter", "alltoall") and k % n == 0 else k

    def key(self, rank: int, buf: str, off: int) -> tuple[int, str, int]:
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


class _Values(_Aliasing):
    """Symbolic buffer contents of every rank: per chunk an identity, a contribution count and
    a 64-bit sum of the contributors' random weights (exact up to a 2^-64 collision chance).

    Each (rank, buffer) is one int64 array of three rows (identity, count, weight sum; the
    sum wraps around as uint64 would), so a step's read, write and reduce are one numpy
    operation each rather than three: the verifier runs one per step of every rank."""

    def __init__(self, p: Program, inplace: bool) -> None:
        super().__init__(p, inplace)
        n, k = p.ngpus, p.nchunksperloop
        self.logical = buffer_chunks(p.collective, n, k)
        ranks = np.arange(n, dtype=np.uint64)
        self.weight = _mix64(ranks * np.uint64(2654435761) + np.uint64(12345)).view(np.int64)
        self.store: dict[tuple[int, str], np.ndarray] = {}
        gpu_s = {g.id: g.s_chunks for g in p.gpus}
        for r in range(n):
            for buf in BUFFERS:
                key = self.key(r, buf, 0)[:2]
                if key in self.store:
                    continue
                size = gpu_s.get(r, 0) if key[1] == "s" else self.logical[key[1]]
                cells = np.zeros((3, size), dtype=np.int64)
                cells[0] = -1
                self.store[key] = cells
        for r in range(n):
            size = self.logical["i"]
            self.write(r, "i", 0, np.stack([self._input_ident(r, size), np.ones(size, dtype=np.int64),
                                            np.full(size, self.weight[r], dtype=np.int64)]))

    def _input_ident(self, r: int, size: int) -> np.ndarray:
        coll = self.p.collective
        idx = np.arange(size, dtype=np.int64)
        if coll in ("allreduce", "reducescatter", "reduce"):
            return idx  # contributions to chunk c are reduced together across ranks
        return r * size + idx  # (origin rank, chunk): the data itself moves

    def read(self, rank: int, buf: str, off: int, cnt: int) -> np.ndarray:
        """Rows (identity, count, weight sum) of cnt chunks from off, as a copy."""
        r, b, o = self.key(rank, buf, off)
        return self.store[(r, b)][:, o:o + cnt].copy()

    def write(self, rank: int, buf: str, off: int, value: np.ndarray) -> None:
        r, b, o = self.key(rank, buf, off)
        self.store[(r, b)][:, o:o + value.shape[1]] = value

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
    reals: list[int]  # positions of real steps
    deps: list[list[tuple[int, int]]]  # per real step: (tb id, step position) it waits for
    index: int = 0  # into reals
    unit: int = 0  # messages of the current step done
    iteration: int = 0
    done: bool = False
    waiting: tuple[int, int, int] | None = None


class _Execution:
    """Runs the program against bounded connection FIFOs and dependency flags.

    FIFOs are counted in messages (a step of cnt chunks is several messages at large sizes)
    and progress is batched: a threadblock moves as many messages of its current step as
    the FIFOs allow. Values, when tracked, move a whole step at a time: every step on a
    connection is matched by exactly one step at the other end, so a step's payload is
    handed over with its first message.
    """

    def __init__(self, p: Program, capacity: int, messages: dict[int, int], loops: int,
                 values: list[_Values], out: _Collector) -> None:
        self.p = p
        self.capacity = capacity
        self.msgs = messages  # cnt -> messages per step
        self.iterations = loops
        self.values = values
        self.out = out
        self.tbs: dict[tuple[int, int], _TbState] = {}
        for g in p.gpus:
            for tb in g.threadblocks:
                reals, deps, pending = [], [], []
                for pos, st in enumerate(tb.steps):
                    if st.depid >= 0:
                        pending.append((st.depid, st.deps))
                    if st.type != "nop":
                        reals.append(pos)
                        deps.append(pending)
                        pending = []
                self.tbs[(g.id, tb.id)] = _TbState(g.id, tb, reals, deps)
        # progress[(rank, tb)] = (iteration, last completed position) for dependency flags
        self.progress: dict[tuple[int, int], tuple[int, int]] = {k: (0, -1) for k in self.tbs}
        self.count: dict[tuple[int, int, int], int] = defaultdict(int)  # messages in each FIFO
        self.payloads: dict[tuple[int, int, int], deque] = defaultdict(deque)  # one per sending step
        self.sender_tb: dict[tuple[int, int, int], tuple[int, int]] = {}
        self.receiver_tb: dict[tuple[int, int, int], tuple[int, int]] = {}
        for (rank, tid), st in self.tbs.items():
            if st.tb.send >= 0:
                self.sender_tb[(st.tb.chan, rank, st.tb.send)] = (rank, tid)
            if st.tb.recv >= 0:
                self.receiver_tb[(st.tb.chan, st.tb.recv, rank)] = (rank, tid)
        self.waiters: dict[tuple[int, int], set[tuple[int, int]]] = defaultdict(set)
        self.semantic_errors = 0
        self.modes = ["in place" if v.inplace else "out of place" for v in values]

    def step(self, st: _TbState) -> Step:
        return st.tb.steps[st.reals[st.index]]

    def units(self, step: Step) -> int:
        if step.type in ("cpy", "re"):
            return 1
        return self.msgs[step.cnt]

    def deps_met(self, st: _TbState, register: bool = False) -> bool:
        for depid, deps in st.deps[st.index]:
            key = (st.rank, depid)
            if key not in self.progress:
                continue
            it, pos = self.progress[key]
            if it < st.iteration or (it == st.iteration and pos < deps):
                if register:
                    self.waiters[key].add((st.rank, st.tb.id))
                return False
        return True

    def out_conn(self, st: _TbState) -> tuple[int, int, int]:
        return (st.tb.chan, st.rank, st.tb.send)

    def in_conn(self, st: _TbState) -> tuple[int, int, int]:
        return (st.tb.chan, st.tb.recv, st.rank)

    def rendezvous_ok(self, st: _TbState, depth: int = 0) -> bool:
        """With no room left, a message can still go if its receiver is waiting for it now
        (and, for a fused receiver, can pass it on in turn)."""
        conn = self.out_conn(st)
        if depth > 64 or self.count[conn]:
            return False
        rk = self.receiver_tb.get(conn)
        if rk is None:
            return False
        rs = self.tbs[rk]
        if rs.done or (rs.unit == 0 and not self.deps_met(rs)):
            return False
        rstep = self.step(rs)
        if rstep.type not in RECEIVING_TYPES:
            return False
        if rstep.type in SENDING_TYPES:
            out = self.out_conn(rs)
            return self.count[out] < self.capacity or self.rendezvous_ok(rs, depth + 1)
        return True

    def run(self) -> list[tuple[int, int]]:
        """Run to completion or to a stop; return the threadblocks left unfinished."""
        queue = deque(sorted(self.tbs))
        queued = set(queue)
        while queue:
            key = queue.popleft()
            queued.discard(key)
            for w in self.advance(self.tbs[key]):
                if w not in queued:
                    queued.add(w)
                    queue.append(w)
        return [k for k, st in self.tbs.items() if not st.done]

    def advance(self, st: _TbState) -> set[tuple[int, int]]:
        woken: set[tuple[int, int]] = set()
        while not st.done:
            if not st.reals:
                self.finish_iteration(st, woken)
                continue
            if st.unit == 0 and not self.deps_met(st, register=True):
                return woken
            step = self.step(st)
            total = self.units(step)
            k = total - st.unit
            receives = step.type in RECEIVING_TYPES
            sends = step.type in SENDING_TYPES
            if receives:
                conn_in = self.in_conn(st)
                k = min(k, self.count[conn_in])
                if k == 0:
                    marker = (st.iteration, st.index, st.unit)
                    if self.capacity == 0 and st.waiting != marker:
                        st.waiting = marker  # a rendezvous sender may hand over now: let it retry once
                        sk = self.sender_tb.get(conn_in)
                        if sk is not None:
                            woken.add(sk)
                    return woken
            if sends:
                conn_out = self.out_conn(st)
                room = self.capacity - self.count[conn_out]
                if room <= 0 and self.rendezvous_ok(st):
                    room = 1
                k = min(k, room)
                if k <= 0:
                    return woken
            if st.unit == 0:
                payload = self.payloads[conn_in].popleft() if receives else None
                result = self.execute(st, step, payload)
                if sends:
                    self.payloads[conn_out].append(result)
            if receives:
                self.count[conn_in] -= k
                sk = self.sender_tb.get(conn_in)
                if sk is not None:
                    woken.add(sk)
            if sends:
                self.count[conn_out] += k
                rk = self.receiver_tb.get(conn_out)
                if rk is not None:
                    woken.add(rk)
            st.unit += k
            if st.unit >= total:
                st.unit = 0
                self.progress[(st.rank, st.tb.id)] = (st.iteration, st.reals[st.index])
                woken.update(self.waiters.pop((st.rank, st.tb.id), ()))
                st.index += 1
                if st.index >= len(st.reals):
                    self.finish_iteration(st, woken)
        return woken

    def finish_iteration(self, st: _TbState, woken: set) -> None:
        st.iteration += 1
        st.index = 0
        if st.reals:
            self.progress[(st.rank, st.tb.id)] = (st.iteration - 1, st.reals[-1])
        if st.iteration >= self.iterations:
            st.done = True
            self.progress[(st.rank, st.tb.id)] = (self.iterations, -1)
        woken.update(self.waiters.pop((st.rank, st.tb.id), ()))

    def execute(self, st: _TbState, step: Step, payload: list | None) -> list | None:
        """A whole step's effect on the tracked values (iteration 0 only); returns what it sends."""
        if st.iteration != 0 or not self.values:
            return None
        rank, tid, pos = st.rank, st.tb.id, st.reals[st.index]
        t, n = step.type, step.cnt
        results = []
        for m, vals in enumerate(self.values):
            local = result = None
            if t in ("s", "rrs", "rrc", "rrcs", "cpy", "re"):
                local = vals.read(rank, step.srcbuf, step.srcoff, n)
                if local[0].min(initial=0) < 0:
                    j = int(np.argmax(local[0] < 0))
                    self.semantic("semantics.uninitialized-read", f"{self.modes[m]}: reads {step.srcbuf}"
                                  f"[{step.srcoff + j}] before anything was written there", rank, tid, pos)
            received = payload[m] if payload is not None else None
            if t in ("s", "cpy"):
                result = local
            elif t in ("r", "rcs"):
                result = received
            elif t in ("rrs", "rrc", "rrcs"):
                result = self.reduce(received, local, rank, tid, pos, step)
            elif t == "re":
                result = self.reduce(vals.read(rank, step.dstbuf, step.dstoff, n), local, rank, tid, pos, step)
            if t in ("r", "rcs", "rrc", "rrcs", "cpy", "re") and result is not None:
                vals.write(rank, step.dstbuf, step.dstoff, result)
            results.append(result)
        return results

    def reduce(self, a, b, rank: int, tid: int, pos: int, step: Step):
        if a is None or b is None:
            return None
        result = a + b  # counts and weight sums add; the identity row is fixed below
        ai, bi = a[0], b[0]
        if not np.array_equal(ai, bi):
            bad = (ai != bi) & (ai >= 0) & (bi >= 0)
            if bad.any():
                j = int(np.argmax(bad))
                self.semantic("semantics.reduce-mismatch",
                              f"reduces chunk identity {int(bi[j])} into {int(ai[j])} at {step.srcbuf}[{step.srcoff + j}]: "
                              "the operands belong to different chunks", rank, tid, pos)
            result[0] = np.where(ai < 0, bi, ai)
        else:
            result[0] = ai
        count = result[1]
        if count.max(initial=0) > self.p.ngpus:
            over = count > self.p.ngpus
            self.semantic("semantics.duplicate", "a reduction counts some rank's contribution twice "
                          f"({int(count[np.argmax(over)])} contributions from {self.p.ngpus} ranks)", rank, tid, pos)
        return result

    def semantic(self, rule: str, message: str, rank: int, tid: int, pos: int) -> None:
        if self.semantic_errors < 20:
            self.out.add(rule, message, rank, tid, pos)
        self.semantic_errors += 1

    # -- deadlock report
    def waiting_for(self, key: tuple[int, int]) -> tuple[str, list[tuple[int, int]]]:
        st = self.tbs[key]
        step = self.step(st)
        pos = st.reals[st.index]
        if st.unit == 0 and not self.deps_met(st):
            targets = []
            for depid, deps in st.deps[st.index]:
                k = (st.rank, depid)
                if k in self.progress:
                    it, done = self.progress[k]
                    if it < st.iteration or (it == st.iteration and done < deps):
                        targets.append(k)
            return f"step {pos} ({step.type}) waits for its dependencies", targets
        if step.type in RECEIVING_TYPES and not self.count[self.in_conn(st)]:
            sk = self.sender_tb.get(self.in_conn(st))
            return f"step {pos} ({step.type}) waits to receive from rank {st.tb.recv} on channel {st.tb.chan}", [sk] if sk else []
        rk = self.receiver_tb.get(self.out_conn(st))
        return f"step {pos} ({step.type}) waits for room to send to rank {st.tb.send} on channel {st.tb.chan}", [rk] if rk else []


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


def _execute(p: Program, conns: dict, opts: VerifyOptions, out: _Collector, modes: list[bool]) -> tuple[bool, _Execution]:
    capacity, max_allowed, loops = fifo_model(p, opts.nbytes, opts.rendezvous)
    if loops > MAX_ITERATIONS:
        out.add("limits.iterations", f"{loops} loop iterations at {opts.nbytes or p.max_bytes} bytes; the flag encoding allows {MAX_ITERATIONS}")
    messages = {c: max(1, math.ceil(c / max_allowed)) for c in range(0, MAX_CNT + 1)}
    values = [_Values(p, inplace) for inplace in modes]
    ex = _Execution(p, capacity, messages, min(loops, 2), values, out)
    stuck = ex.run()
    if stuck:
        _deadlock_report(ex, stuck, out)
        return False, ex
    return True, ex


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


_BUF_INDEX = {"i": 0, "o": 1, "s": 2}


def _races(p: Program, conns: dict, inplace: bool, out: _Collector) -> None:
    """Conflicting accesses from different threadblocks of a rank must be ordered.

    Per rank, accesses to each chunk are taken in a linear extension of the rank's
    happens-before order (threadblock order plus dependencies); every read must follow the
    last write, and every write the last write and the reads since (the usual last-writer
    check, linear in the number of accesses). Pairs left unordered are then searched for in
    the global order, which also runs through messages to other ranks and back.
    """
    alias = _Aliasing(p, inplace)
    stride = max([p.nchunksperloop] + [g.s_chunks for g in p.gpus]) + 1
    candidates: list[tuple[StepRef, StepRef, str, int]] = []
    for g in p.gpus:
        order = _rank_topo_order(g)
        if order is None:
            out.add("dep.cycle", "the dependencies of this rank form a cycle: the runtime would hang", g.id)
            continue
        tb_index = {tb.id: i for i, tb in enumerate(g.threadblocks)}
        tbs = {tb.id: tb for tb in g.threadblocks}
        nsteps = len(order)
        vc = np.full((nsteps, len(tb_index)), -1, dtype=np.int64)
        where: dict[tuple[int, int], int] = {}
        starts, counts, steps_of, writes = [], [], [], []
        for idx, (tid, pos) in enumerate(order):
            tb = tbs[tid]
            row = vc[where[(tid, pos - 1)]].copy() if pos > 0 else vc[idx]
            for dtid, dpos in _step_deps(tb, pos):
                j = where.get((dtid, dpos))
                if j is not None:
                    np.maximum(row, vc[j], out=row)
            row[tb_index[tid]] = pos
            vc[idx] = row
            where[(tid, pos)] = idx
            st = tb.steps[pos]
            if st.type == "nop" or not 1 <= st.cnt <= MAX_CNT:
                continue
            for buf, off, is_write in ((st.srcbuf, st.srcoff, False), (st.dstbuf, st.dstoff, True)):
                if (is_write and st.type in ("r", "rcs", "rrc", "rrcs", "cpy", "re")) or (
                        not is_write and st.type in ("s", "rrs", "rrc", "rrcs", "cpy", "re")):
                    _r, b, o = alias.key(g.id, buf, off)
                    starts.append(_BUF_INDEX[b] * stride + o)
                    counts.append(st.cnt)
                    steps_of.append(idx)
                    writes.append(is_write)
        if not starts:
            continue
        cnt = np.asarray(counts, dtype=np.int64)
        total = int(cnt.sum())
        first = np.repeat(np.cumsum(cnt) - cnt, cnt)
        slot = np.repeat(np.asarray(starts, dtype=np.int64), cnt) + (np.arange(total) - first)
        step = np.repeat(np.asarray(steps_of, dtype=np.int64), cnt)
        wr = np.repeat(np.asarray(writes, dtype=bool), cnt)
        srt = np.lexsort((~wr, step, slot))  # by slot, then execution order (a read before a write of one step)
        slot, step, wr = slot[srt], step[srt], wr[srt]
        n = len(slot)
        idx = np.arange(n)
        new_group = np.ones(n, dtype=bool)
        new_group[1:] = slot[1:] != slot[:-1]
        group_start = np.maximum.accumulate(np.where(new_group, idx, 0))
        last_write = np.maximum.accumulate(np.where(wr, idx, -1))
        prev_write = np.full(n, -1, dtype=np.int64)
        prev_write[1:] = last_write[:-1]
        prev_write = np.where(prev_write >= group_start, prev_write, -1)
        # reads: against the last write; writes: against everything since the last write
        lo = np.where(wr, np.maximum(prev_write, group_start), prev_write)
        lo = np.where(~wr & (prev_write < 0), idx, lo)
        npairs = np.where(wr, idx - lo, np.where(prev_write >= 0, 1, 0))
        later = np.repeat(idx, npairs)
        offsets = np.arange(int(npairs.sum())) - np.repeat(np.cumsum(npairs) - npairs, npairs)
        earlier = np.repeat(lo, npairs) + offsets
        a_step, b_step = step[earlier], step[later]
        order_arr = np.asarray(order, dtype=np.int64)
        a_tb, b_tb = order_arr[a_step, 0], order_arr[b_step, 0]
        a_pos = order_arr[a_step, 1]
        a_tbi = np.asarray([tb_index[t] for t in a_tb.tolist()], dtype=np.int64) if len(a_tb) else a_tb
        diff = a_tb != b_tb
        ordered = vc[b_step, a_tbi] >= a_pos if len(a_tb) else diff
        bad = np.flatnonzero(diff & ~ordered)
        seen: set[tuple[int, int]] = set()
        for k in bad.tolist():
            pair = (int(a_step[k]), int(b_step[k]))
            if pair in seen:
                continue
            seen.add(pair)
            a_ref = (g.id, *order[pair[0]])
            b_ref = (g.id, *order[pair[1]])
            rule = "race.write-write" if wr[earlier[k]] and wr[later[k]] else "race.read-write"
            candidates.append((a_ref, b_ref, rule, int(slot[later[k]])))
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
    names = {v: k for k, v in _BUF_INDEX.items()}
    for checked, (a, b, rule, slot_id) in enumerate(candidates):
        if checked < 200 and _reaches(a, b, msg_next, dep_next, tb_len):
            continue
        where_txt = f"{names[slot_id // stride]}[{slot_id % stride}]"
        out.add(rule, f"threadblocks {a[1]} (step {a[2]}) and {b[1]} (step {b[2]}) both touch {where_txt}, "
                f"{'both writing' if rule == 'race.write-write' else 'one writing what the other reads'}, "
                f"with no order between them through dependencies or messages{' (in place)' if inplace else ''}",
                a[0], b[1], b[2])


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


def _rank_topo_order(g: Gpu) -> list[tuple[int, int]] | None:
    indeg: dict[tuple[int, int], int] = {}
    succ: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    ids = {tb.id for tb in g.threadblocks}
    for tb in g.threadblocks:
        for pos in range(len(tb.steps)):
            node = (tb.id, pos)
            preds = set()
            if pos > 0:
                preds.add((tb.id, pos - 1))
            for dtid, dpos in _step_deps(tb, pos):
                if dtid in ids and dtid != tb.id:
                    preds.add((dtid, dpos))
            indeg[node] = len(preds)
            for pnode in preds:
                succ[pnode].append(node)
    valid = set(indeg)
    for node in list(succ):
        if node not in valid:
            for s in succ.pop(node):
                indeg[s] -= 1
    order = [n for n, d in indeg.items() if d == 0]
    head = 0
    while head < len(order):
        node = order[head]
        head += 1
        for s in succ.get(node, []):
            indeg[s] -= 1
            if indeg[s] == 0:
                order.append(s)
    return order if len(order) == len(indeg) else None


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
    ok, ex = _execute(program, conns, options, out, modes)
    checked.append("deadlock")
    if not ok:
        skipped.append("semantics and races not checked: the program does not run to completion")
    else:
        for vals in ex.values:
            _check_results(program, vals, "in place" if vals.inplace else "out of place", out)
        if modes:
            checked.append("semantics")
        _races(program, conns, program.inplace, out)
        checked.append("races")
    stats = {"ranks": program.ngpus, "steps": program.nsteps, "threadblocks": program.max_threadblocks}
    return Report(tuple(out.items), tuple(checked), tuple(skipped), stats)
