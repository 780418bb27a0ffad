"""Lowering for a one-sided runtime: a Program (two-sided MSCCL steps) in, an MSCCL++
execution plan out, following mscclpp.md sections 5 and 7.

- Every receive gets a slot in the receiver's scratch: its own, or (`pool`, Simple) one of a
  few its connection's receives take in turn, with a credit back before each is written
  again; the sender writes into it and signals (memory channel), or the proxy does (`pws`
  on a port channel, from a scratch source it never rewrites in the launch); LL sends
  packets into the slot and needs no signal, across nodes through the proxy (`rppkt`), from
  the packets received or from a slot of its own it packs first.
- Dependencies between threadblocks become semaphores, one per (producer, consumer) pair.
- Local hazards get a `nop` (section 3.3): before a signal or release that publishes writes,
  after a wait or acquire before data is used, and between overlapping local operations.
- In a Simple plan, a connection closes with a handshake (the receiver signals once it has
  read all its slots; the sender waits for it) where it must make the next launch's writes
  land after this launch's reads, and the proxy's reads of port sources: where the
  collective's own dependencies already order every slot of the connection, it needs none
  (`handshake_connections`). An LL plan needs none: it moves packets only, on a double scratch buffer that
  alternates halves between launches, and no rank can finish a launch before every other
  rank has started it (its result needs their inputs), so a write of launch N+1 never meets
  a read of launch N-1, the proxy's included (they end before the receiver has the packets).

>>> from hipipe_compiler.presets import preset
>>> from hipipe_compiler.schedule import hierarchical_plan
>>> from hipipe_compiler.lower import lower
>>> topo = preset("dgx-h100-8x2")
>>> plan = translate(lower(hierarchical_plan(topo, max_bytes=1 << 20)), topo, "demo")
>>> plan.ngpus, plan.protocol, plan.max_ops <= 64
(16, 'Simple', True)
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from ..errors import PlanError
from ..msccl.program import Program, Step, buffer_chunks
from ..topology import Topology
from .memory import LAYOUTS, aliased_layout, overlaps, where
from .ordering import Conn, handshake_connections, needless_credits, real_steps, step_graph
from .plan import (MAX_MESSAGE_SIZE, MAX_OPERATIONS, MAX_SEMAPHORES_PER_OP, Channel, ExecutionPlan, GpuPlan, Op,
                   Operand, RemoteBuffer, TbBuffers, TbChannels, Threadblock, bounded)

IN_NODE_LINKS = ("nvlink", "pcie")


def ranks_per_node(topology: Topology) -> int:
    """Ranks that reach each other over CUDA IPC (memory channels): the leading dimensions
    linked by NVLink or PCIe; the innermost dimension alone where no link type is given."""
    n = 1
    for d, dim in enumerate(topology.dimensions):
        if dim.link in IN_NODE_LINKS or (d == 0 and dim.link is None):
            n *= dim.size
        else:
            break
    return n


class TooManyOperations(PlanError):
    """A threadblock needs more operations than the executor runs; `port` when it sends or
    receives across nodes (those steps cost the most operations)."""

    def __init__(self, message: str, port: bool) -> None:
        super().__init__(message)
        self.port = port


@dataclass(frozen=True)
class Slot:
    """Where a receive lands: chunks [index, index+size) of the receiver's scratch, as packets or
    plain. A pooled slot is written again later in the launch: the receiver signals a credit
    once it has read it (`credit_after`), and a sender writing a reused slot first waits for
    the credit of the receive that held it before (`credit_before`)."""

    index: int
    size: int
    packet: bool
    credit_after: bool = False
    credit_before: bool = False


class _Ops:
    """A threadblock's operations, with the nops that section 3.3 requires placed as they are added."""

    def __init__(self, collective: str, rank: int, ni: int, no: int) -> None:
        self.ops: list[Op] = []
        self.touched: list[tuple[tuple[str, int, int], bool]] = []  # since the last nop: (place, written)
        self.dirty = False  # a data operation since the last nop
        self.synced = True  # no wait or acquire since the last nop
        self.places = lambda o: [where(collective, rank, ni, no, layout, o.buffer, o.index, o.size) for layout in LAYOUTS
                                 if layout in ("separate", aliased_layout(collective))]

    def nop(self) -> None:
        self.ops.append(Op("nop"))
        self.touched, self.dirty, self.synced = [], False, True

    def data(self, op: Op) -> None:
        reads = [p for o in op.local_reads for p in self.places(o)]
        writes = [p for o in op.local_writes for p in self.places(o)]
        clash = any(overlaps(w, q) for w in writes for q, _ in self.touched) or any(
            overlaps(r, q) for r in reads for q, written in self.touched if written)
        if clash or not self.synced:
            self.nop()
        self.ops.append(op)
        self.touched += [(r, False) for r in reads] + [(w, True) for w in writes]
        self.dirty = True

    def publish(self, op: Op) -> None:
        if self.dirty:
            self.nop()
        self.ops.append(op)

    def sync_in(self, op: Op) -> None:
        self.ops.append(op)
        self.synced = False


@dataclass
class _Rank:
    """Per rank: channel tables, peer buffers, semaphores and scratch, built as threadblocks are emitted."""

    memory: list[int] = field(default_factory=list)
    port: list[int] = field(default_factory=list)
    channel_of: dict[Conn, tuple[str, int]] = field(default_factory=dict)
    buffers: list[RemoteBuffer] = field(default_factory=list)
    semaphores: int = 0
    plain_end: int = 0
    packet_end: int = 0

    def remote_scratch(self, peer: int, kind: str) -> int:
        buf = RemoteBuffer(peer, "s", (kind,))
        if buf not in self.buffers:
            self.buffers.append(buf)
        return self.buffers.index(buf)

    def staging(self, size: int) -> Operand:
        slot = Operand("s", self.plain_end, size)
        self.plain_end += size
        return slot


def translate(program: Program, topology: Topology, name: str, inplace: bool = False,
              node_size: int | None = None, opening: bool = False,
              handshakes: frozenset[Conn] | None = None, pool: int | None = None) -> ExecutionPlan:
    """The execution plan that runs `program` on MSCCL++; PlanError when it cannot be expressed
    within the executor's limits (the message names the limit). With `opening`, the
    connections that need a handshake open with it instead of closing with it: the receiver
    signals as its threadblock starts and the sender waits before its first send, which costs
    nothing where that send comes a latency or more after the start. `handshakes`: the
    program's `handshake_connections`, where the caller has them already. With `pool`, a Simple
    plan's connection lands its receives in at most that many slots, in turn, with flow control
    (a credit back per slot read before it is written again): its scratch then grows with the
    chunks a connection carries at once, not with all it carries in the launch."""
    if program.protocol == "LL128":
        raise PlanError("MSCCL++ has no LL128: compile for it with Simple or LL")
    if program.ngpus != topology.nranks:
        raise PlanError(f"the program is for {program.ngpus} ranks but the topology has {topology.nranks}")
    node = node_size or ranks_per_node(topology)
    packets = program.protocol == "LL"
    ranks = [_Rank() for _ in program.gpus]
    conns = _connections(program)
    kind = {c: ("memory" if c[1] // node == c[2] // node else "port") for c in conns}
    links: dict[tuple[int, int], list[Conn]] = {}  # the connections between two ranks, either way
    neighbours: dict[int, set[int]] = defaultdict(set)
    for c in conns:
        links.setdefault((min(c[1], c[2]), max(c[1], c[2])), []).append(c)
        neighbours[c[1]].add(c[2])
        neighbours[c[2]].add(c[1])
    for r, state in enumerate(ranks):
        for peer in sorted(neighbours[r]):
            for c in sorted(links[min(r, peer), max(r, peer)]):
                table = state.memory if kind[c] == "memory" else state.port
                state.channel_of[c] = (kind[c], len(table))
                table.append(peer)
    double = packets
    if pool is not None and pool < 1:
        raise PlanError(f"a pool of {pool} slots per connection: expected at least 1")
    if pool is not None and handshakes is not None:
        raise ValueError("a pooled plan's handshakes are its own: a pool can need more than the program's")
    pool = None if packets else pool
    graph = step_graph(program) if pool is not None else None
    needless = needless_credits(graph, pool) if graph is not None else frozenset()
    slots = _receive_slots(program, kind, packets, ranks, pool, needless)
    sends = {key: slot for key, slot in _send_slots(program, slots).items()}
    edges = _semaphores(program, ranks)
    closing = frozenset() if double else handshake_connections(program, pool, graph) if handshakes is None else handshakes
    gpus = []
    logical = buffer_chunks(program.collective, program.ngpus, program.nchunksperloop)
    for gpu in program.gpus:
        state = ranks[gpu.id]
        tbs = []
        for tb in gpu.threadblocks:
            emit = _Emission(program, gpu.id, tb, state, kind, slots, sends, edges, logical, closing, opening)
            tbs.append(emit.threadblock())
        scratch = max(math.ceil(state.plain_end / 2), state.packet_end) if packets else state.plain_end
        channels = tuple(Channel(t, tuple(peers)) for t, peers in (("memory", state.memory), ("port", state.port)) if peers)
        gpus.append(GpuPlan(gpu.id, logical["i"], logical["o"], scratch, tuple(tbs), channels, tuple(state.buffers),
                            (0,) * state.semaphores))
    max_bytes = program.max_bytes or MAX_MESSAGE_SIZE
    return bounded(ExecutionPlan(name, program.collective, "LL" if packets else "Simple", inplace, tuple(gpus),
                                 min_message_size=program.min_bytes, max_message_size=max_bytes,
                                 use_double_scratch_buffer=double))


def opens_handshakes(plan: ExecutionPlan) -> bool:
    """Whether a plan's connections open with their handshakes (translate's `opening`): some
    threadblock signals before anything else, which a closing handshake or a credit never does."""
    return any(tb.ops and tb.ops[0].name == "signal" for g in plan.gpus for tb in g.threadblocks)


def _connections(program: Program) -> set[Conn]:
    out = set()
    for gpu, tb in program.threadblocks():
        if tb.send >= 0:
            out.add((tb.chan, gpu.id, tb.send))
        if tb.recv >= 0:
            out.add((tb.chan, tb.recv, gpu.id))
    return out


def _receive_slots(program: Program, kind: dict[Conn, str], packets: bool, ranks: list[_Rank],
                   pool: int | None = None, needless: frozenset[tuple[int, int, int]] = frozenset()) -> dict:
    """Each receive's slot, keyed (rank, tb, position): packet slots first (they take 2C per
    chunk, mscclpp.md 3.4), then the program's own scratch, then plain slots (one per receive,
    or a connection's `pool` of them in turn, each as large as the largest it takes, with a
    credit before a slot is written again unless the receive is `needless` of one)."""
    out: dict[tuple, Slot] = {}
    for gpu in program.gpus:
        state = ranks[gpu.id]
        steps = [(tb, pos, st) for tb in gpu.threadblocks for pos, st, _ in real_steps(tb.steps)]
        receives = [(tb, pos, st) for tb, pos, st in steps if st.receives]
        for tb, pos, st in receives if packets else ():
            out[(gpu.id, tb.id, pos)] = Slot(state.packet_end, st.cnt, True)
            state.packet_end += st.cnt
        # LL across nodes: the proxy puts packets packed beforehand into a slot of the sender's
        # own, unless it forwards packets received as they are
        for tb, pos, st in steps if packets else ():
            if st.sends and kind[(tb.chan, gpu.id, tb.send)] == "port" and (not st.receives or st.reduces_received):
                out[(gpu.id, tb.id, pos, "packed")] = Slot(state.packet_end, st.cnt, True)
                state.packet_end += st.cnt
        state.plain_end = 2 * state.packet_end + gpu.s_chunks
        plain = [(tb, pos, st) for tb, pos, st in receives if (gpu.id, tb.id, pos) not in out]
        if pool is None:
            for tb, pos, st in plain:
                out[(gpu.id, tb.id, pos)] = Slot(state.plain_end, st.cnt, False)
                state.plain_end += st.cnt
            continue
        per_conn: dict[tuple[int, int], list] = defaultdict(list)
        for tb, pos, st in plain:
            per_conn[(tb.chan, tb.recv)].append((tb, pos, st))
        for occupants in per_conn.values():
            starts = []
            for i in range(min(pool, len(occupants))):
                starts.append(state.plain_end)
                state.plain_end += max(st.cnt for _tb, _pos, st in occupants[i::pool])
            credited = [k >= pool and (gpu.id, tb.id, pos) not in needless for k, (tb, pos, _st) in enumerate(occupants)]
            for k, (tb, pos, st) in enumerate(occupants):
                out[(gpu.id, tb.id, pos)] = Slot(starts[k % pool], st.cnt, False, credit_before=credited[k],
                                                 credit_after=k + pool < len(occupants) and credited[k + pool])
    return out


def _send_slots(program: Program, slots: dict) -> dict:
    """The receiver's slot of each send, keyed (rank, tb, position): the k-th send on a
    connection lands in the slot of the k-th receive on it."""
    queues: dict[Conn, list[Slot]] = defaultdict(list)
    for gpu in program.gpus:
        for tb in gpu.threadblocks:
            for pos, st, _ in real_steps(tb.steps):
                if st.receives:
                    queues[(tb.chan, tb.recv, gpu.id)].append(slots[(gpu.id, tb.id, pos)])
    out = {}
    for gpu in program.gpus:
        for tb in gpu.threadblocks:
            sent = 0
            for pos, st, _ in real_steps(tb.steps):
                if st.sends:
                    queue = queues[(tb.chan, gpu.id, tb.send)]
                    if sent >= len(queue):
                        raise PlanError(f"rank {gpu.id} tb {tb.id} sends more on channel {tb.chan} than rank {tb.send} receives")
                    out[(gpu.id, tb.id, pos)] = queue[sent]
                    sent += 1
    return out


def _semaphores(program: Program, ranks: list[_Rank]) -> dict:
    """One semaphore per cross-threadblock dependency: {(rank, tb, pos): ([acquired], [released])}."""
    out: dict[tuple[int, int, int], tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
    for gpu in program.gpus:
        state = ranks[gpu.id]
        for tb in gpu.threadblocks:
            for pos, _st, deps in real_steps(tb.steps):
                for depid, dep in sorted(set(deps)):
                    if depid == tb.id:
                        continue
                    out[(gpu.id, tb.id, pos)][0].append(state.semaphores)
                    out[(gpu.id, depid, dep)][1].append(state.semaphores)
                    state.semaphores += 1
    return out


class _Emission:
    """One threadblock's operations (the cases of mscclpp.md 5 and 7)."""

    def __init__(self, program: Program, rank: int, tb, state: _Rank, kind: dict, slots: dict, sends: dict,
                 edges: dict, logical: dict[str, int], closing: frozenset[Conn], opening: bool = False) -> None:
        self.program, self.rank, self.tb, self.state = program, rank, tb, state
        self.slots, self.sends, self.edges = slots, sends, edges
        self.closing, self.opening = closing, opening
        self.ops = _Ops(program.collective, rank, logical["i"], logical["o"])
        self.send_conn = (tb.chan, rank, tb.send) if tb.send >= 0 else None
        self.recv_conn = (tb.chan, tb.recv, rank) if tb.recv >= 0 else None
        self.send_kind = kind[self.send_conn] if self.send_conn else None
        self.recv_kind = kind[self.recv_conn] if self.recv_conn else None
        self.channels: dict[str, list[int]] = defaultdict(list)
        self.buffers: dict[str, list[int]] = defaultdict(list)
        self.send_channel = self._local_channel(self.send_conn)
        self.recv_channel = self._local_channel(self.recv_conn)
        self.remote = None
        if self.send_conn is not None:
            gpu_index = state.remote_scratch(tb.send, self.send_kind)
            self.buffers[self.send_kind].append(gpu_index)
            self.remote = len(self.buffers[self.send_kind]) - 1

    def _local_channel(self, conn) -> int | None:
        if conn is None:
            return None
        ctype, index = self.state.channel_of[conn]
        self.channels[ctype].append(index)
        return len(self.channels[ctype]) - 1

    def threadblock(self) -> Threadblock:
        receiving = self.recv_conn in self.closing
        sending = self.send_conn in self.closing
        if receiving and self.opening:  # opening handshake: this launch's kernel has started
            self.ops.publish(Op("signal", self.recv_kind, (self.recv_channel,)))
        for pos, st, _deps in real_steps(self.tb.steps):
            acquired, released = self.edges.get((self.rank, self.tb.id, pos), ([], []))
            for i in range(0, len(acquired), MAX_SEMAPHORES_PER_OP):
                self.ops.sync_in(Op("sem_acquire", semaphore_ids=tuple(acquired[i:i + MAX_SEMAPHORES_PER_OP])))
            if sending and self.opening and st.sends:
                self.ops.sync_in(Op("wait", self.send_kind, (self.send_channel,)))
                sending = False
            self.step(pos, st)
            for i in range(0, len(released), MAX_SEMAPHORES_PER_OP):
                self.ops.publish(Op("sem_release", semaphore_ids=tuple(released[i:i + MAX_SEMAPHORES_PER_OP])))
        if receiving and not self.opening:  # closing handshake: every slot of this connection is read
            self.ops.publish(Op("signal", self.recv_kind, (self.recv_channel,)))
        if sending and not self.opening:
            self.ops.sync_in(Op("wait", self.send_kind, (self.send_channel,)))
        ops = tuple(self.ops.ops)
        if len(ops) > MAX_OPERATIONS:
            raise TooManyOperations(f"rank {self.rank} tb {self.tb.id} needs {len(ops)} operations; the MSCCL++ executor "
                                    f"runs at most {MAX_OPERATIONS} per threadblock (MAX_OPERATION)",
                                    "port" in (self.send_kind, self.recv_kind))
        return Threadblock(self.tb.id, ops,
                           tuple(TbChannels(t, tuple(v)) for t, v in sorted(self.channels.items())),
                           tuple(TbBuffers(t, tuple(v)) for t, v in sorted(self.buffers.items())))

    def local(self, buf: str, off: int, cnt: int) -> Operand:
        if buf == "s":  # the program's own scratch sits after the packet slots
            return Operand("s", 2 * self.state.packet_end + off, cnt)
        return Operand(buf, off, cnt)

    def step(self, pos: int, st: Step) -> None:
        """A step's operations, behind the credit its send waits for where it writes a pooled
        slot again, and before the credit it gives back where its slot is written again."""
        target = self.sends.get((self.rank, self.tb.id, pos)) if st.sends else None
        if target is not None and target.credit_before:
            self.ops.sync_in(Op("wait", self.send_kind, (self.send_channel,)))
        self._step(pos, st)
        if st.receives and self.slots[(self.rank, self.tb.id, pos)].credit_after:
            self.ops.publish(Op("signal", self.recv_kind, (self.recv_channel,)))

    def _step(self, pos: int, st: Step) -> None:
        ops = self.ops
        src, dst = self.local(st.srcbuf, st.srcoff, st.cnt), self.local(st.dstbuf, st.dstoff, st.cnt)
        if st.type == "cpy":
            ops.data(Op("copy", src=(src,), dst=(dst,)))
            return
        if st.type == "re":
            ops.data(Op("re", src=(dst, src), dst=(dst,)))
            return
        slot = None
        if st.receives:
            s = self.slots[(self.rank, self.tb.id, pos)]
            slot = Operand("s", s.index, s.size)
            if not s.packet:
                ops.sync_in(Op("wait", self.recv_kind, (self.recv_channel,)))
        packet_in = slot is not None and self.slots[(self.rank, self.tb.id, pos)].packet
        reduce = st.reduces_received
        store = st.type in ("r", "rrc", "rcs", "rrcs")
        if not st.sends:
            if reduce:
                ops.data(Op("repkt" if packet_in else "re", src=(src, slot), dst=(dst,)))
            else:
                ops.data(Op("upkt" if packet_in else "copy", src=(slot,), dst=(dst,)))
            return
        target = self.sends[(self.rank, self.tb.id, pos)]
        remote = Operand(None, target.index, target.size, buffer_id=self.remote)
        if self.send_kind == "port" and target.packet:
            self.send_port_packets(pos, st, src, dst, slot, reduce, store, remote)
            return
        if self.send_kind == "port":
            self.send_port(st, src, dst, slot, packet_in, reduce, store, remote)
            return
        packet_out = target.packet
        if slot is None:  # s
            ops.data(Op("ppkt" if packet_out else "put", "memory", src=(src,), dst=(remote,)))
        elif packet_in:
            if reduce:
                ops.data(Op("respkt", "memory", src=(src, slot), dst=(dst if store else self.state.staging(st.cnt), remote)))
            else:
                ops.data(Op("rppkt", "memory", src=(slot,), dst=(remote,)))
                ops.data(Op("upkt", src=(slot,), dst=(dst,)))
        elif reduce and not packet_out:
            ops.data(Op("res", "memory", src=(src, slot), dst=(dst if store else slot, remote)))
        else:
            value = slot
            if reduce:
                value = dst if store else slot
                ops.data(Op("re", src=(src, slot), dst=(value,)))
            elif store:
                ops.data(Op("copy", src=(slot,), dst=(dst,)))
            ops.data(Op("ppkt" if packet_out else "put", "memory", src=(value,), dst=(remote,)))
        if not packet_out:
            ops.publish(Op("signal", "memory", (self.send_channel,)))

    def send_port(self, st: Step, src: Operand, dst: Operand, slot: Operand | None, packet_in: bool, reduce: bool,
                  store: bool, remote: Operand) -> None:
        """A send over a port channel: the proxy reads a scratch source asynchronously, so the
        value goes into a slot nothing rewrites within the launch, then `pws` puts and signals
        (`pwsf` also waits until the proxy is done, where the source is a receive slot)."""
        ops = self.ops
        if slot is None:
            value = self.state.staging(st.cnt)
            ops.data(Op("copy", src=(src,), dst=(value,)))
        elif packet_in:
            value = self.state.staging(st.cnt)
            ops.data(Op("repkt" if reduce else "upkt", src=(src, slot) if reduce else (slot,), dst=(value,)))
        else:
            value = slot
            if reduce:
                ops.data(Op("re", src=(src, slot), dst=(slot,)))
        if store:
            ops.data(Op("copy", src=(value,), dst=(dst,)))
        # the sender upstream rewrites a receive slot once this rank has signalled that it read
        # it (a credit, or its next launch): the proxy must be done with it
        name = "pwsf" if value is slot else "pws"
        ops.data(Op(name, "port", (self.send_channel,), src=(value,), dst=(remote,)))

    def send_port_packets(self, pos: int, st: Step, src: Operand, dst: Operand, slot: Operand | None, reduce: bool,
                          store: bool, remote: Operand) -> None:
        """An LL send over a port channel (mscclpp.md 4, as MSCCL++'s own multi-node packet
        programs do): the value is packed into a slot of this rank's scratch, or the packets
        received are forwarded from their slot, and `rppkt` has the proxy put them once their
        flags show; the receiver's packet read needs no signal. The proxy reads the slot until
        the receiver has the packets, which is before any rank can start the launch after next,
        the first to write that half of the double scratch buffer again."""
        ops = self.ops
        if slot is not None and not reduce:
            ops.data(Op("rppkt", "port", (self.send_channel,), src=(slot,), dst=(remote,)))
            if store:
                ops.data(Op("upkt", src=(slot,), dst=(dst,)))
            return
        packed = self.slots[(self.rank, self.tb.id, pos, "packed")]
        packed_slot = Operand("s", packed.index, packed.size)
        if slot is None:
            ops.data(Op("cpkt", src=(src,), dst=(packed_slot,)))
        else:
            ops.data(Op("recpkt", src=(src, slot), dst=(dst if store else self.state.staging(st.cnt), packed_slot)))
        ops.data(Op("rppkt", "port", (self.send_channel,), src=(packed_slot,), dst=(remote,)))
