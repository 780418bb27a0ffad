"""Symbolic execution of a plan under the executor's semantics (mscclpp.md 3-4), with vector
clocks for what each threadblock may see:

- a data operation runs on all threads, so a block sees its own earlier writes, and the
  effect of a `wait` or `sem_acquire`, only after a `nop`; a memory-channel `signal`
  publishes only what the block wrote before its last `nop` (section 3.3);
- a port channel's proxy orders each connection: a `put` there becomes visible with the
  next signal on it, and its source is read until the peer's `wait` takes that signal;
- packets need no signal: a packet operation waits until every packet it reads was written
  in this launch. A port `rppkt` writes the peer's packets at once, and its proxy reads the
  source until the peer's first packet operation reads them;
- a switch channel's `glres` reads the region on every member of its group and stores the
  sum to every member of its destination's group; `gstore` stores a local region to every
  member. Both are plain accesses to the members' memory by the issuing block: a member's
  data is visible to them only through a signal, and their stores to a reader only through
  one (mscclpp.md 8.2: a relaxed signal publishes nothing).

A peer's input and output belong to its caller until its kernel starts and after it ends: an
access to them must follow a signal from that peer in this launch, and come before that
peer's kernel ends.

Checked on the way: every read sees data published to it, no two unordered writers, no
write over an unordered read (a slot reused before its reader is done), no deadlock. At the
end: balanced signals and semaphores, the next launch's accesses ordered after this one's,
and every rank holding the collective's result.
"""

from __future__ import annotations

import weakref
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...msccl.verify.report import Collector
from ..memory import where
from ..plan import PACKET_OPS, SWITCH_OPS, ExecutionPlan, Op, Operand, channel_pairs, packet_operand

MASK = (1 << 64) - 1
Value = tuple[int, int, int]  # (identity, contributions, sum of the contributors' weights mod 2^64)


def weights(n: int) -> list[int]:
    """Deterministic pseudo-random 64-bit weights per rank (splitmix64)."""
    out = []
    for r in range(n):
        x = (r * 0x9E3779B97F4A7C15 + 0x2545F4914F6CDD1D) & MASK
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
        out.append(x ^ (x >> 31))
    return out


def clock_type(longest: int) -> type:
    """The narrowest unsigned type that holds a clock of a block running `longest` operations:
    a vector clock has an entry per threadblock of the plan, so on 1024 ranks its width
    decides whether the proof fits in memory (within the executor's 64 operations, a byte)."""
    return next(t for t in (np.uint8, np.uint16, np.uint32) if longest < np.iinfo(t).max)


#: A list kept newest first as (item, rest) pairs, so that the cells an access touches together
#: share one pair for it and everything before it, where lists would copy it into each cell.
Chain = tuple | None


def chain_items(chain: Chain) -> list:
    """A chain's items, oldest first."""
    items = []
    while chain is not None:
        items.append(chain[0])
        chain = chain[1]
    items.reverse()
    return items


@dataclass(slots=True)
class _Cell:
    value: Value | None = None
    writer: tuple[int, int] | None = None  # (tb, clock)
    readers: Chain = None  # (tb, clock) of each read since the last write
    packet: bool = False  # written as packets in this launch
    history: Chain = None  # every (tb, clock, write, heard) of the launch, for the next launch's order


class _Tb:
    __slots__ = ("index", "rank", "id", "ops", "pc", "clock", "vc", "pending", "nop_clock", "blocked", "heard", "snapshots")

    def __init__(self, index: int, rank: int, tb_id: int, ops: list[tuple[int, Op]], ntbs: int) -> None:
        self.index, self.rank, self.id, self.ops = index, rank, tb_id, ops
        self.pc = 0
        self.clock = 0
        self.vc = np.zeros(ntbs, dtype=np.int32)
        self.pending: list[np.ndarray] = []  # what waits and acquires saw, joined at the next nop
        self.nop_clock = 0
        self.blocked: str | None = None
        self.heard = 1 << rank  # the ranks it has heard from in this launch, as bits
        #: the snapshots it gave since its last nop, by their own entry, while something may still
        #: hold them (weakly): read-only, so its signals to many peers share one, where a copy each
        #: would hold a plan-wide clock per waiting signal
        self.snapshots: dict[int, weakref.ref] = {}

    @property
    def done(self) -> bool:
        return self.pc >= len(self.ops)


class Execution:
    """One launch of the plan, every rank, under one buffer layout."""

    def __init__(self, plan: ExecutionPlan, layout: str, out: Collector) -> None:
        self.plan, self.layout, self.out = plan, layout, out
        self.tbs: list[_Tb] = []
        for g in plan.gpus:
            for tb in g.threadblocks:
                ops = [(pos, nested) for pos, op in enumerate(tb.ops)
                       for nested in ((op,) if op.name != "pipeline" else op.ops)]
                self.tbs.append(_Tb(len(self.tbs), g.id, tb.id, ops, 0))
        n = len(self.tbs)
        clocks = clock_type(max((len(t.ops) for t in self.tbs), default=0))
        for t in self.tbs:  # one entry per threadblock, then one per rank: "its kernel has started"
            t.vc = np.zeros(n + plan.ngpus, dtype=clocks)
            t.vc[n + t.rank] = 1
        self.tb_plan = {(t.rank, t.id): plan.gpus[t.rank].threadblocks[t.id] for t in self.tbs}
        self.weight = weights(plan.ngpus)
        self.memory: dict[tuple[int, str], list[_Cell]] = {}
        self.queues: dict[tuple[int, str, int], deque] = defaultdict(deque)
        #: each semaphore's releases not yet acquired (None for its initial count): lists, not
        #: deques, since a plan declares hundreds per rank, each holding one or two at a time
        self.semaphores: dict[tuple[int, int], list] = {}
        self.port_writes: dict[tuple[int, int], list] = defaultdict(list)
        #: (rank, first cell) of packets a proxy put -> the sender's place it reads them from
        self.proxy_sources: dict[tuple[int, int], tuple] = {}
        self.pair = channel_pairs(plan)
        self.blocked_on: dict[tuple, list[_Tb]] = defaultdict(list)
        self.woken: list[tuple] = []  # keys whose waiters the last operation may have unblocked
        self.reported: set[tuple] = set()
        for g in plan.gpus:
            for s, init in enumerate(g.semaphores):
                self.semaphores[(g.id, s)] = [None] * init
            space, base, _ = self._where(g.id, "i", 0, 1)  # where() is affine in the index
            cells, first = self._cells(g.id, space), g.id * g.input_chunks if plan.collective == "allgather" else 0
            for u in range(g.input_chunks):
                cells[base + u].value = (first + u, 1, self.weight[g.id])

    # -- layout -----------------------------------------------------------------------------
    def _where(self, rank: int, buf: str, index: int, size: int) -> tuple[str, int, int]:
        g = self.plan.gpus[rank]
        return where(self.plan.collective, rank, g.input_chunks, g.output_chunks, self.layout, buf, index, size)

    def _cells(self, rank: int, space: str) -> list[_Cell]:
        key = (rank, space)
        if key not in self.memory:
            g = self.plan.gpus[rank]
            size = {"i": g.input_chunks, "o": g.output_chunks, "s": g.scratch_chunks * (2 if self.plan.packets else 1),
                    "io": max(g.input_chunks, g.output_chunks)}[space]
            self.memory[key] = [_Cell() for _ in range(size)]
        return self.memory[key]

    def _endpoint(self, t: _Tb, op: Op, local: int) -> tuple[int, str, int]:
        return (t.rank, op.channel_type, self.tb_plan[(t.rank, t.id)].channel_list(op.channel_type)[local])

    def _place(self, t: _Tb, op: Op, o: Operand, packet: bool) -> tuple[int, str, int, int, bool]:
        """(rank, space, start, end, packet) of an operand, in cells (a packet chunk takes two)."""
        rank, buf = t.rank, o.buffer
        if o.buffer_id is not None:
            g = self.plan.gpus[t.rank]
            ref = g.remote_buffers[self.tb_plan[(t.rank, t.id)].buffer_list(op.channel_type)[o.buffer_id]]
            rank, buf = ref.rank, ref.type
        if packet:
            return rank, "s", 2 * o.index, 2 * o.end, True
        space, start, end = self._where(rank, buf, o.index, o.size)
        return rank, space, start, end, False

    # -- the run ----------------------------------------------------------------------------
    def run(self) -> bool:
        """Run every threadblock as far as it goes; False (with a violation) on a deadlock."""
        ready = deque(self.tbs)
        while ready:
            t = ready.popleft()
            while not t.done and len(self.out) < self.out.limit:
                pos, op = t.ops[t.pc]
                key = self.step(t, op, pos)
                if key is not None:
                    t.blocked = op.name
                    self.blocked_on[key].append(t)
                    break
                t.blocked = None
                t.pc += 1
                for woken in self.woken:
                    ready.extend(self.blocked_on.pop(woken, []))
                self.woken = []
        stuck = [t for t in self.tbs if not t.done]
        if stuck and len(self.out) < self.out.limit:
            first = stuck[0]
            self.out.add("deadlock", f"{len(stuck)} threadblock(s) never finish; the first waits in {first.blocked} "
                         f"(op {first.ops[first.pc][0]})", first.rank, first.id, first.ops[first.pc][0])
        return not stuck

    def _blocked(self, t: _Tb, op: Op) -> tuple | None:
        """What an operation waits for before it can run, or None."""
        if op.name in ("wait", "rlxwait"):
            for c in op.channel_ids:
                e = self._endpoint(t, op, c)
                if not self.queues[e]:
                    return ("q", e)
        elif op.name == "sem_acquire":
            for s in op.semaphore_ids:
                if not self.semaphores[(t.rank, s)]:
                    return ("sem", t.rank, s)
        elif op.name in PACKET_OPS:
            for k, o in enumerate(op.src):
                if packet_operand(op.name, True, k):
                    place = self._place(t, op, o, True)
                    if not all(c.packet for c in self._span(place)):
                        return ("pkt", place[0])
        return None

    def step(self, t: _Tb, op: Op, pos: int) -> tuple | None:
        """Run one operation; the key it is blocked on, or None when it ran."""
        key = self._blocked(t, op)
        if key is not None:
            return key
        name = op.name
        t.clock += 1
        t.vc[t.index] = t.clock
        if name == "nop":
            t.snapshots.clear()
            if t.pending:
                for snapshot in t.pending:
                    np.maximum(t.vc, snapshot, out=t.vc)
                t.pending.clear()
                t.heard = sum(1 << int(r) for r in np.flatnonzero(t.vc[len(self.tbs):]))
            t.vc[t.index] = t.clock
            t.nop_clock = t.clock
        elif name in ("wait", "rlxwait"):
            for c in op.channel_ids:
                snapshot, reads = self.queues[self._endpoint(t, op, c)].popleft()
                if snapshot is not None and name == "wait":
                    t.pending.append(snapshot)
                for place in reads:  # the proxy read a port source until now
                    self._access(t, place, write=False, pos=pos, proxy=True)
        elif name in ("signal", "rlxsignal"):
            for c in op.channel_ids:
                self._signal(t, op, c, relaxed=name == "rlxsignal")
        elif name == "sem_release":
            for s in op.semaphore_ids:
                self.semaphores[(t.rank, s)].append(self._snapshot(t))
                self.woken.append(("sem", t.rank, s))
        elif name == "sem_acquire":
            for s in op.semaphore_ids:
                snapshot = self.semaphores[(t.rank, s)].pop(0)
                if snapshot is not None:
                    t.pending.append(snapshot)
        elif name == "barrier":
            self._report(t, pos, "unsupported", "barrier: device barriers are not modelled by this verifier")
        elif name != "flush":
            self._data(t, op, pos)
        return None

    def _snapshot(self, t: _Tb, own: int | None = None) -> np.ndarray:
        """What t publishes: its clock, with its own entry at `own` (its last nop by default)."""
        own = t.nop_clock if own is None else own
        ref = t.snapshots.get(own)
        snap = ref() if ref is not None else None
        if snap is None:
            snap = t.vc.copy()
            snap[t.index] = own
            t.snapshots[own] = weakref.ref(snap)
        return snap

    def _signal(self, t: _Tb, op: Op, local: int, relaxed: bool = False) -> None:
        mine = self._endpoint(t, op, local)
        peer = self.pair.get(mine)
        if peer is None:
            self._report(t, None, "channel-pairing", f"{op.channel_type} channel {mine[2]} has no paired channel at the peer")
            return
        proxy_reads: list = []
        if op.channel_type == "port":
            for place, values, sources in self.port_writes.pop((t.index, mine[2]), []):
                self._write(t, place, values)
                proxy_reads += sources
        snapshot = None if relaxed else self._snapshot(t, t.clock if op.channel_type == "port" else None)
        self.queues[peer].append((snapshot, proxy_reads))
        self.woken.append(("q", peer))

    # -- data ---------------------------------------------------------------------------------
    def _data(self, t: _Tb, op: Op, pos: int) -> None:
        name = op.name
        if name in SWITCH_OPS:
            self._switch(t, op, pos)
            return
        srcs = [self._place(t, op, o, packet_operand(name, True, k)) for k, o in enumerate(op.src)]
        dsts = [self._place(t, op, o, packet_operand(name, False, k)) for k, o in enumerate(op.dst)]
        values = [self._read(t, place, pos, proxy=op.channel_type == "port" and name in ("put", "pws", "rppkt"))
                  for place in srcs]
        for place in srcs:  # packets a proxy put here: its read of their source ends now
            if place[4] and place[0] == t.rank and (place[0], place[2]) in self.proxy_sources:
                self._access(t, self.proxy_sources.pop((place[0], place[2])), write=False, pos=pos, proxy=True)
        if name in ("re", "res", "rre", "rres", "repkt", "respkt", "recpkt", "recspkt"):
            result = [self._sum(t, pos, [v[j] for v in values]) for j in range(len(values[0]))]
            outs = [(d, result) for d in dsts]
        else:  # one source per destination, or the one source to every destination
            outs = [(d, values[min(k, len(values) - 1)]) for k, d in enumerate(dsts)]
        for k, (place, vals) in enumerate(outs):
            if op.channel_type == "port" and place[0] != t.rank:
                # thread k drives channel k with destination k (handlePut); pwsf returns once the
                # proxy is done, so its sources were read at the op
                channel = op.channel_ids[min(k, len(op.channel_ids) - 1)]
                if name == "rppkt":
                    # packets land whenever the proxy gets to them and announce themselves; the
                    # proxy reads the source until the receiver has read what it put
                    self._write(t, place, vals, pos)
                    self.proxy_sources[(place[0], place[2])] = srcs[min(k, len(srcs) - 1)]
                    continue
                if name != "put" and name not in ("pws", "pwsf"):
                    continue
                read = [srcs[min(k, len(srcs) - 1)]] if name != "pwsf" else []
                self.port_writes[(t.index, self._endpoint(t, op, channel)[2])].append((place, vals, read))
                if name in ("pws", "pwsf"):
                    self._signal(t, op, channel)
                continue
            self._write(t, place, vals, pos)

    def _members(self, t: _Tb, o: Operand) -> list[tuple[int, str, int, int, bool]]:
        """The place of a switch operand on every member of its channel's group."""
        buffer, ranks = self.plan.gpus[t.rank].switch_groups()[self.tb_plan[(t.rank, t.id)].channel_list("switch")[
            o.switch_channel_id]]
        return [(m, *self._where(m, buffer, o.index, o.size), False) for m in ranks]

    def _switch(self, t: _Tb, op: Op, pos: int) -> None:
        """glres: the sum over the source's members, stored to every destination member; gstore:
        a local region stored to every member."""
        src, dst = op.src[0], op.dst[0]
        if op.name == "glres":
            parts = [self._read(t, place, pos) for place in self._members(t, src)]
            values = [self._sum(t, pos, [p[j] for p in parts]) for j in range(len(parts[0]))]
        else:
            values = self._read(t, self._place(t, op, src, False), pos)
        for place in self._members(t, dst):
            self._write(t, place, values, pos)

    def _started(self, t: _Tb, rank: int) -> bool:
        """Whether t has heard from rank in this launch (so rank's kernel has started)."""
        return bool(t.vc[len(self.tbs) + rank])

    def _span(self, place: tuple) -> list[_Cell]:
        rank, space, start, end, _ = place
        cells = self._cells(rank, space)
        return cells[start:end] if end <= len(cells) else cells[start:] + [_Cell() for _ in range(end - len(cells))]

    def _read(self, t: _Tb, place: tuple, pos: int, proxy: bool = False) -> list[Value | None]:
        cells = self._span(place)
        step = 2 if place[4] else 1
        self._access(t, place, write=False, pos=pos, record=not proxy)
        return [cells[j].value for j in range(0, len(cells), step)]

    def _write(self, t: _Tb, place: tuple, values: list, pos: int | None = None) -> None:
        step = 2 if place[4] else 1
        cells = self._span(place)
        for j, cell in enumerate(cells):
            value = values[j // step] if j // step < len(values) else None
            if place[4] and cell.packet and cell.value != value:
                self._report(t, pos, "packet-rewrite", f"a packet slot of rank {place[0]} is written twice in one launch")
            cell.value = value
            cell.packet = place[4]
        self._access(t, place, write=True, pos=pos)
        if place[4]:
            self.woken.append(("pkt", place[0]))

    def _access(self, t: _Tb, place: tuple, write: bool, pos: int | None = None, proxy: bool = False,
                record: bool = True) -> None:
        """The ordering checks of one access to every cell of a place. A proxy's read (`proxy`)
        is recorded when the peer's wait ends it, and checked against writes at the put
        (`record` False)."""
        rank, space = place[0], place[1]
        if space != "s" and not self._started(t, rank):
            self._report(t, pos, "unsynchronised-peer", f"{'writes' if write else 'reads'} {space} of rank {rank} before "
                         f"any signal from rank {rank} in this launch: its caller may still own the buffer")
        ordered: dict[tuple[int, int], bool] = {}  # the cells of a place mostly share their last accesses

        def seen(epoch: tuple[int, int]) -> bool:
            if epoch not in ordered:
                ordered[epoch] = self._ordered(t, epoch)
            return ordered[epoch]

        entry, mine = (t.index, t.clock, write, t.heard), (t.index, t.clock)
        # a cell's chain before this access -> with it, by id (they stay alive); neighbours mostly share one
        histories: dict[int, tuple] = {}
        reads: dict[int, tuple] = {}
        last = last_read = (None, None)
        for cell in self._span(place):
            w = cell.writer
            if not record:
                if w is not None and not place[4] and not seen(w):
                    rule = "nop-hazard" if w[0] == t.index else "unpublished-read"
                    self._report(t, pos, rule, f"a port put reads {space} of rank {rank} before the write by "
                                 f"{self._name(w[0])} is visible to it")
                continue
            past = cell.history
            if past is not last[0] or last[1] is None:
                last = (past, histories.get(id(past)) or histories.setdefault(id(past), (entry, past)))
            cell.history = last[1]
            if write:
                if w is not None and not seen(w):
                    rule = "race" if w[0] != t.index else "nop-hazard"
                    self._report(t, pos, rule, f"writes {space} of rank {rank} while an unordered write by "
                                 f"{self._name(w[0])} may be in flight")
                for r in chain_items(cell.readers):
                    if r != mine and not seen(r):
                        rule = "nop-hazard" if r[0] == t.index else ("slot-reuse" if space == "s" else "race")
                        self._report(t, pos, rule, f"overwrites {space} of rank {rank} before {self._name(r[0])} is "
                                     "done reading it")
                cell.writer = mine
                cell.readers = None
            else:
                if w is not None and not place[4] and not proxy and not seen(w):
                    rule = "nop-hazard" if w[0] == t.index else "unpublished-read"
                    self._report(t, pos, rule, f"reads {space} of rank {rank} before the write by {self._name(w[0])} is "
                                 "made visible to it")
                past = cell.readers
                if past is not last_read[0] or last_read[1] is None:
                    last_read = (past, reads.get(id(past)) or reads.setdefault(id(past), (mine, past)))
                cell.readers = last_read[1]

    def _ordered(self, t: _Tb, epoch: tuple[int, int]) -> bool:
        other, clock = epoch
        if other == t.index:
            return clock <= t.nop_clock
        return bool(t.vc[other] >= clock)

    def _sum(self, t: _Tb, pos: int, parts: list[Value | None]) -> Value | None:
        if any(p is None for p in parts):
            return None
        ident = parts[0][0]
        if any(p[0] != ident for p in parts):
            self._report(t, pos, "semantics", f"reduces chunks of different positions ({sorted({p[0] for p in parts})[:4]})")
            return None
        return ident, sum(p[1] for p in parts), sum(p[2] for p in parts) & MASK

    # -- reports ------------------------------------------------------------------------------
    def _name(self, index: int) -> str:
        other = self.tbs[index]
        return f"rank {other.rank} tb {other.id}"

    def _report(self, t: _Tb, pos: int | None, rule: str, message: str) -> None:
        key = (rule, t.rank, t.id, pos)
        if key not in self.reported:
            self.reported.add(key)
            self.out.add(rule, message, t.rank, t.id, pos)

    # -- after the launch ---------------------------------------------------------------------
    def finish(self) -> None:
        for (rank, kind, index), queue in sorted(self.queues.items()):
            if queue:
                self.out.add("signal-balance", f"{len(queue)} signal(s) on {kind} channel {index} are never waited for; "
                             "counters persist, so the next launch's waits would pass early", rank)
        for (rank, s), queue in sorted(self.semaphores.items()):
            init = self.plan.gpus[rank].semaphores[s]
            if len(queue) != init:
                self.out.add("semaphore-balance", f"semaphore {s} ends at {len(queue)}, not its initial {init}", rank)
        for (tb_index, channel), pending in self.port_writes.items():
            if pending:
                t = self.tbs[tb_index]
                self.out.add("signal-balance", f"a port put on channel {channel} is never followed by a signal", t.rank, t.id)
        self._next_launch()
        self._results()

    def _next_launch(self) -> None:
        """A rank's next launch starts when its kernel ends: every access another rank makes to
        memory it also touches (one of them writing) must be ordered before that end."""
        ends = {}
        for t in self.tbs:
            end = t.vc.copy()
            for snapshot in t.pending:
                np.maximum(end, snapshot, out=end)
            end[t.index] = t.clock
            ends[t.rank] = end if t.rank not in ends else np.maximum(ends[t.rank], end)
        double = self.plan.use_double_scratch_buffer
        rank_of = [t.rank for t in self.tbs]
        for (rank, space), cells in self.memory.items():
            end = ends.get(rank) if space != "s" else None
            seen: set[tuple[bool, int]] = set()  # cells of one region share their history, and so their reports
            for cell in cells:
                if (cell.packet, id(cell.history)) in seen:
                    continue
                seen.add((cell.packet, id(cell.history)))
                history = chain_items(cell.history)
                if end is not None:
                    i = next((i for i, clock, _, _ in history if rank_of[i] != rank and end[i] < clock), None)
                    if i is not None:
                        self._report(self.tbs[i], None, "unfinished-access", f"its access to {space} of rank {rank} is "
                                     f"not ordered before rank {rank}'s kernel ends, so rank {rank}'s caller may reuse "
                                     "the buffer under it")
                if not (double and cell.packet):
                    self._overlapping_launches(rank, space, cell, history, ends, rank_of)

    def _overlapping_launches(self, rank: int, space: str, cell: _Cell, history: Sequence[tuple[int, int, bool, int]],
                              ends: dict[int, np.ndarray], rank_of: list[int]) -> None:
        """Report each access to the cell that another rank's next launch may overlap (one of the
        two writes); the rank named is the one whose first conflicting access comes first.

        An access is safe from rank b's next launch when it is ordered before the end of b's
        kernel, or of the kernel of a rank q that every access of b to the cell has heard
        from in the launch: in the next launch those accesses again follow a signal that q
        sent after its kernel started again, so after this launch's kernel of q ended (an
        opening handshake in place of a closing one)."""
        first: dict[int, int] = {}  # rank -> position of its first access
        first_write: dict[int, int] = {}
        first_read: dict[int, int] = {}
        heard: dict[int, int] = {}  # rank -> the ranks every one of its accesses heard from, as bits
        for y, (j, _, w, bits) in enumerate(history):
            first.setdefault(rank_of[j], y)
            (first_write if w else first_read).setdefault(rank_of[j], y)
            heard[rank_of[j]] = heard.get(rank_of[j], bits) & bits
        if len(first) < 2 or not first_write:
            return
        never = len(history)
        by_first = sorted(first, key=first.__getitem__)
        writers = sorted(first_write, key=first_write.__getitem__)

        def overlaps(b: int, i: int, clock: int) -> bool:
            if ends[b][i] >= clock:
                return False
            bits = heard.get(b, 0) & ~(1 << b)
            while bits:
                q = (bits & -bits).bit_length() - 1
                if q in ends and ends[q][i] >= clock:
                    return False
                bits &= bits - 1
            return True

        for x, (i, clock, write, _) in enumerate(history):
            if not write:
                named = writers
            elif not cell.packet:
                named = by_first
            else:  # a read after this packet write does not count: its flags proved the write had landed
                early = {b: y for b, y in first_read.items() if y < x}
                named = sorted(early.keys() | first_write.keys(),
                               key=lambda b: min(first_write.get(b, never), early.get(b, never)))
            b = next((b for b in named if b != rank_of[i] and b in ends and overlaps(b, i, clock)), None)
            if b is not None:
                rule = "slot-reuse" if space == "s" else "unfinished-write"
                self._report(self.tbs[i], None, rule, f"its access to {space} of rank {rank} is not ordered "
                             f"before rank {b}'s kernel ends, so rank {b}'s next launch may overlap it")

    def _results(self) -> None:
        plan, n = self.plan, self.plan.ngpus
        full = sum(self.weight) & MASK
        for g in plan.gpus:
            wrong = []
            space, base, _ = self._where(g.id, "o", 0, 1)
            cells = self._cells(g.id, space)
            for c in range(g.output_chunks):
                got = cells[base + c].value
                if plan.collective == "allreduce":
                    want = (c, n, full)
                elif plan.collective == "reducescatter":
                    want = (g.id * g.output_chunks + c, n, full)
                elif plan.collective == "allgather":
                    want = (c, 1, self.weight[c // g.input_chunks])
                else:
                    return
                if got != want:
                    wrong.append(c)
            if wrong:
                self.out.add("semantics", f"{len(wrong)} output chunk(s) hold a wrong result, first chunk {wrong[0]}", g.id)
            if self.layout == "separate":
                changed = [u for u in range(g.input_chunks) if self._cells(g.id, "i")[u].value != (
                    (g.id * g.input_chunks + u if plan.collective == "allgather" else u), 1, self.weight[g.id])]
                if changed:
                    self.out.add("semantics", f"the input buffer changes (chunk {changed[0]}): NCCL's out-of-place calls "
                                 "keep it", g.id)


def execute(plan: ExecutionPlan, layout: str, out: Collector) -> bool:
    """Run one launch under a buffer layout; True when it ran to the end."""
    ex = Execution(plan, layout, out)
    finished = ex.run()
    if finished:
        ex.finish()
    return finished


__all__ = ["Execution", "execute", "PACKET_OPS"]
