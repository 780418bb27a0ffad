"""The simulator: cost-model.md section 3, exactly. A Program, a topology and a call size in;
time, algbw, busbw and T / T_LB out.

Event driven: each message waits its alpha, then moves its bytes at the minimum over its
resources (ports or directed links) of the resource's capacity divided by the number of
messages moving bytes on it; rates are recomputed whenever a message starts or stops
moving bytes. Threadblocks run their steps in order, iteration after iteration; steps wait
for their dependencies in the same iteration; a send needs fewer than W messages
outstanding on its connection; a receive consumes its connection's next message.

>>> from hipipe_compiler.presets import preset
>>> from hipipe_compiler.schedule import hierarchical_plan
>>> from hipipe_compiler.lower import lower
>>> topo = preset("dgx-h100-8x2")
>>> result = simulate(lower(hierarchical_plan(topo, max_bytes=1 << 20)), topo, 1 << 20)
>>> result.time_us > result.lower_bound_us > 0
True
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict, deque
from dataclasses import dataclass, field, replace
from typing import Any

from ..bounds import bus_factor, lower_bound, one_protocol_bound_us
from ..msccl.program import RECEIVING_TYPES, SENDING_TYPES, Program, Step
from ..hardware import WIRE_EFFICIENCY
from ..msccl.runtime import FIFO_MESSAGES, SLICE_BYTES
from ..topology import Topology
from .network import Message, Network
from .period import Periodic


@dataclass(frozen=True)
class Replay:
    """How the runtime slices a call and how many messages a connection holds: the MSCCL
    runtime's by protocol (cost-model.md 3), or another runtime's (NCCL's tree, say)."""

    slice_bytes: int  # data bytes of a chunk one iteration moves, at most
    window: int  # messages outstanding on a connection before a send waits
    engine_GBps: float | None = None  # a cap on the wire bytes each rank's sends move together
    eager: bool = False  # a send completes once posted (NCCL's kernels), not when it arrives (MSCCL)

    @classmethod
    def msccl(cls, protocol: str) -> "Replay":
        return cls(SLICE_BYTES[protocol], FIFO_MESSAGES[protocol])


class SimulationError(Exception):
    """The program cannot run on this topology: an illegal link, or a deadlock."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class DimensionUsage:
    """What one dimension carried: wire bytes per rank, and the mean busy fraction of its resources."""

    name: str
    bytes_per_rank: float
    busy_fraction: float


@dataclass(frozen=True)
class Interval:
    """One message moving bytes (for timelines): when, where, and which chunk it carried."""

    start_us: float
    end_us: float
    src: int
    dst: int
    dim: int
    iteration: int
    offset: int
    cnt: int
    tb: int
    reduce: bool | None = None  # the receiver reduced it (reduce-scatter work) or copied it


@dataclass(frozen=True)
class SimResult:
    """Time and rates of one simulated call (nccl-tests definitions for algbw and busbw)."""

    collective: str
    nbytes: int
    nranks: int
    time_us: float
    lower_bound_us: float | None
    iterations: int
    dims: tuple[DimensionUsage, ...]
    intervals: tuple[Interval, ...] = field(default=(), repr=False, compare=False)
    one_protocol_bound_us: float | None = None  # T_LB1 (cost-model.md 4.1)
    skipped_iterations: int = field(default=0, compare=False)  # replays timed by the steady state's period

    @property
    def algbw_GBps(self) -> float:
        return self.nbytes / (self.time_us * 1e3) if self.time_us > 0 else math.inf

    @property
    def busbw_GBps(self) -> float:
        return self.algbw_GBps * bus_factor(self.collective, self.nranks)

    @property
    def utilisation(self) -> float | None:
        if self.lower_bound_us is None or self.time_us <= 0:
            return None
        return self.lower_bound_us / self.time_us

    @property
    def utilisation1(self) -> float | None:
        """U1 = T_LB1 / T: the utilisation a one-protocol program is judged by."""
        if self.one_protocol_bound_us is None or self.time_us <= 0:
            return None
        return self.one_protocol_bound_us / self.time_us

    def to_dict(self) -> dict[str, Any]:
        return {
            "collective": self.collective, "nbytes": self.nbytes, "ranks": self.nranks,
            "time_us": self.time_us, "lower_bound_us": self.lower_bound_us, "utilisation": self.utilisation,
            "one_protocol_bound_us": self.one_protocol_bound_us, "utilisation1": self.utilisation1,
            "algbw_GBps": self.algbw_GBps, "busbw_GBps": self.busbw_GBps, "iterations": self.iterations,
            "dimensions": [{"name": d.name, "bytes_per_rank": d.bytes_per_rank, "busy_fraction": d.busy_fraction}
                           for d in self.dims],
        }


class _Message(Message):
    """A message of the MSCCL runtime: its connection, and what a timeline shows of it."""

    __slots__ = ("sender", "conn", "offset", "cnt", "iteration", "src", "dst", "record_index")

    def __init__(self, sender: "_Tb", conn: tuple, resources: tuple, wire_bytes: float, dim: int, alpha: float) -> None:
        super().__init__(sender, resources, dim, wire_bytes, alpha)
        self.sender = sender
        self.conn = conn
        self.record_index = -1


class _Tb:
    __slots__ = ("rank", "id", "send", "recv", "chan", "steps", "deps", "index", "iteration", "phase",
                 "waiting_message", "local_done", "done", "key")

    def __init__(self, rank: int, tb_id: int, send: int, recv: int, chan: int, steps: list[Step],
                 deps: list[list[tuple[int, int]]]) -> None:
        self.rank = rank
        self.id = tb_id
        self.send = send
        self.recv = recv
        self.chan = chan
        self.steps = steps  # real steps only, with their positions
        self.deps = deps
        self.index = 0
        self.iteration = 0
        self.phase = "start"
        self.waiting_message: _Message | None = None
        self.done = not steps
        self.key = (rank, tb_id)


class _Simulator:
    def __init__(self, program: Program, topology: Topology, nbytes: int, record: bool, quotient: bool = False,
                 shortcut: bool = True, replay: Replay | None = None) -> None:
        if program.ngpus != topology.nranks:
            raise SimulationError(f"the program is for {program.ngpus} ranks but the topology has {topology.nranks}", 2)
        self.quotient = quotient
        if quotient and [g.id for g in program.gpus] != [0]:
            raise ValueError("a quotient simulation runs rank 0's program alone")
        self.program = program
        self.topology = topology
        self.nbytes = nbytes
        self.record = record
        self.shortcut = shortcut  # skip the replays' periodic steady state (period.py)
        self.periodic: Periodic | None = None
        self.crossing: dict[tuple, int] = {}  # dependencies between components (period.py)
        self.cross_waits: list[int] = []
        chunk = nbytes / program.nchunksperloop
        replay = replay or Replay.msccl(program.protocol)
        self.iterations = max(1, math.ceil(chunk / replay.slice_bytes)) if nbytes > 0 else 1
        self.chunk_slice = chunk / self.iterations  # data bytes one chunk moves per iteration
        self.efficiency = WIRE_EFFICIENCY[program.protocol]
        self.window = replay.window  # messages outstanding before a send waits
        self.engine = replay.engine_GBps
        self.eager = replay.eager
        self.g = topology.reduce_bandwidth * 1e3 if topology.reduce_bandwidth else None  # bytes per us
        self.net = Network(topology, program.protocol, quotient)
        self.net.on_arrival = self.arrive
        self.tbs: dict[tuple[int, int], _Tb] = {}
        self.progress: dict[tuple[int, int], tuple[int, int]] = {}
        self.waiters: dict[tuple[int, int], list[_Tb]] = defaultdict(list)
        self.fifo: dict[tuple, deque] = defaultdict(deque)  # messages sent, not yet consumed
        self.window_waiter: dict[tuple, _Tb] = {}
        self.recv_waiter: dict[tuple, _Tb] = {}
        self.intervals: list[Interval] = []
        self.recv_queues: dict[tuple[int, int], tuple] = {}
        for gpu in program.gpus:
            for tb in gpu.threadblocks:
                steps, deps, pending = [], [], []
                for pos, st in enumerate(tb.steps):
                    if st.depid >= 0:
                        pending.append((st.depid, st.deps))
                    if st.type != "nop":
                        steps.append((pos, st))
                        deps.append(pending)
                        pending = []
                t = _Tb(gpu.id, tb.id, tb.send, tb.recv, tb.chan, steps, deps)
                self.tbs[t.key] = t
                self.progress[t.key] = (0, -1)
        self.last_done = 0.0

    @property
    def now(self) -> float:
        return self.net.now

    def schedule(self, time: float, kind: str, obj: Any) -> None:
        self.net.schedule(time, kind, obj)

    def run(self) -> float:
        start = self.topology.call_cost(self.program.protocol)  # every tb starts after the per-call cost
        self.last_done = start
        for tb in sorted(self.tbs.values(), key=lambda t: t.key):
            if tb.done:
                self.progress[tb.key] = (self.iterations, -1)
            else:
                self.schedule(start, "try", tb)
        net = self.net
        periodic = Periodic(self) if self.shortcut else None
        self.periodic = periodic
        reference = periodic.reference if periodic is not None and periodic.enabled else None
        while net.events:
            time, _seq, kind, obj, version = heapq.heappop(net.events)
            net.now = time
            if kind == "try":
                self.advance(obj)
            elif kind == "local":
                if self.complete_step(obj):
                    self.advance(obj)
            else:
                net.handle(kind, obj, version)
            if reference is not None and reference.iteration > periodic.seen:  # type: ignore[union-attr]
                periodic.check()  # type: ignore[union-attr]
        stuck = [t for t in self.tbs.values() if not t.done]
        if stuck:
            t = min(stuck, key=lambda x: x.key)
            pos, st = t.steps[t.index]
            raise SimulationError(f"deadlock: rank {t.rank} tb {t.id} never finishes step {pos} ({st.type}) of "
                                  f"iteration {t.iteration}; {len(stuck)} threadblock(s) stuck")
        return self.last_done

    # -- connections
    def send_queue(self, tb: _Tb) -> tuple:
        return (tb.chan, tb.rank, tb.send)

    def recv_queue(self, tb: _Tb) -> tuple:
        """The queue a receive consumes. In a quotient simulation rank 0 stands for every rank:
        what it receives from q is what it sends to -q (q's coordinates negated)."""
        queue = self.recv_queues.get(tb.key)
        if queue is None:
            if self.quotient:
                queue = (tb.chan, tb.rank, self.topology.mirror(tb.recv))
            else:
                queue = (tb.chan, tb.recv, tb.rank)
            self.recv_queues[tb.key] = queue
        return queue

    # -- threadblocks
    def deps_met(self, tb: _Tb) -> bool:
        for depid, deps in tb.deps[tb.index]:
            key = (tb.rank, depid)
            it, pos = self.progress.get(key, (self.iterations, 0))
            if it < tb.iteration or (it == tb.iteration and pos < deps):
                self.waiters[key].append(tb)
                if self.crossing:  # only where the period detector watches components
                    pair = self.crossing.get((tb.key, key))
                    if pair is not None:
                        self.cross_waits[pair] += 1
                return False
        return True

    def step_bytes(self, st: Step) -> float:
        return st.cnt * self.chunk_slice

    def local_time(self, st: Step) -> float:
        return self.step_bytes(st) / self.g if self.g else 0.0

    def advance(self, tb: _Tb) -> None:
        """Move a threadblock forward from its current phase as far as it can go now (a loop:
        a long run of steps that complete at once would otherwise recurse past Python's limit)."""
        while self.advance_step(tb):
            pass

    def advance_step(self, tb: _Tb) -> bool:
        """Move a threadblock through its current step as far as it can go now; True when the
        step completed and the next one may start at once."""
        if tb.done:
            return False
        pos, st = tb.steps[tb.index]
        if tb.phase == "start":
            if not self.deps_met(tb):
                return False
            tb.phase = "recv" if st.type in RECEIVING_TYPES else ("send" if st.type in SENDING_TYPES else "local")
        if tb.phase == "recv":
            conn = self.recv_queue(tb)
            queue = self.fifo[conn]
            if not queue or not queue[0].arrived:
                self.recv_waiter[conn] = tb
                return False
            self.recv_waiter.pop(conn, None)
            msg = queue.popleft()  # consumed now: it stops counting toward the window
            sender = self.window_waiter.pop(conn, None)
            if sender is not None:
                self.schedule(self.now, "try", sender)
            reduces = st.type in ("rrs", "rrc", "rrcs")
            if msg.record_index >= 0:  # a receive into scratch is data a later `re` reduces
                reduced = reduces or (st.type == "r" and st.dstbuf == "s")
                self.intervals[msg.record_index] = replace(self.intervals[msg.record_index], reduce=reduced)
            after = "send" if st.type in SENDING_TYPES else "finish"
            if reduces and self.g:
                tb.phase = "reduce:" + after
                self.schedule(self.now + self.local_time(st), "local", tb)
                return False
            tb.phase = after
        if tb.phase == "local":
            tb.phase = "finish"
            t = self.local_time(st) if st.type in ("cpy", "re") else 0.0
            if t > 0:
                self.schedule(self.now + t, "local", tb)
                return False
        if tb.phase == "send":
            conn = self.send_queue(tb)
            if len(self.fifo[conn]) >= self.window:
                self.window_waiter[conn] = tb
                return False
            self.send_message(tb, st, conn)
            if self.eager:
                tb.waiting_message = None  # posted: the threadblock moves on while it travels
                tb.phase = "finish"
                return self.complete_step(tb)
            tb.phase = "await"
            return False
        if tb.phase == "finish":
            return self.complete_step(tb)
        return False

    def complete_step(self, tb: _Tb) -> bool:
        """Finish the threadblock's current step (or its reduction, before a send); True when
        it should go on advancing now."""
        if tb.phase.startswith("reduce:"):
            tb.phase = tb.phase.split(":")[1]
            if tb.phase == "send":
                return True
        if tb.phase not in ("finish", "await"):
            tb.phase = "finish"
        pos, _st = tb.steps[tb.index]
        self.progress[tb.key] = (tb.iteration, pos)
        self.last_done = max(self.last_done, self.now)
        for w in self.waiters.pop(tb.key, []):
            self.schedule(self.now, "try", w)
        tb.index += 1
        tb.phase = "start"
        if tb.index >= len(tb.steps):
            tb.index = 0
            tb.iteration += 1
            if tb.iteration >= self.iterations:
                tb.done = True
                self.progress[tb.key] = (self.iterations, -1)
                for w in self.waiters.pop(tb.key, []):
                    self.schedule(self.now, "try", w)
                return False
        return True

    # -- messages
    def send_message(self, tb: _Tb, st: Step, conn: tuple) -> None:
        try:
            resources, dim, alpha = self.net.link(tb.rank, tb.send)
        except ValueError as exc:
            raise SimulationError(str(exc), 2) from None
        if self.engine is not None:
            engine = ("engine", tb.rank)
            self.net.add_resource(engine, self.engine)
            resources = (*resources, engine)
        msg = _Message(tb, conn, resources, self.step_bytes(st) / self.efficiency, dim, alpha)
        msg.src, msg.dst = tb.rank, tb.send
        msg.iteration, msg.offset, msg.cnt = tb.iteration, st.srcoff if st.srcoff >= 0 else st.dstoff, st.cnt
        self.fifo[conn].append(msg)
        tb.waiting_message = msg
        self.net.send(msg)

    def arrive(self, msg: Message) -> None:
        assert isinstance(msg, _Message)
        if self.record:
            msg.record_index = len(self.intervals)
            self.intervals.append(Interval(msg.start, self.now, msg.src, msg.dst, msg.dim, msg.iteration,
                                           msg.offset, msg.cnt, msg.sender.id))
        receiver = self.recv_waiter.get(msg.conn)
        if receiver is not None and self.fifo[msg.conn] and self.fifo[msg.conn][0] is msg:
            self.schedule(self.now, "try", receiver)
        sender = msg.sender
        if sender.waiting_message is msg:
            sender.waiting_message = None
            if self.complete_step(sender):
                self.advance(sender)


def probe_ranks(topology: Topology) -> list[int]:
    """A few ranks whose programs, set beside rank 0's, show whether a lowering gives every
    rank the same schedule (coordinates all 1, all n-1, and d+1 in dimension d)."""
    sizes = [d.size for d in topology.dimensions]
    coords = [tuple(1 % n for n in sizes), tuple(n - 1 for n in sizes), tuple((d + 1) % n for d, n in enumerate(sizes))]
    return sorted({topology.rank(c) for c in coords} - {0})


def _shape(gpu, topology: Topology) -> tuple:
    """What decides a rank's timing: its threadblocks' channels, peers relative to the rank,
    and steps (type, count, dependencies), but not the buffer offsets."""
    def rel(q: int):
        return None if q < 0 else topology.offset(gpu.id, q)
    return tuple((tb.chan, rel(tb.send), rel(tb.recv), tuple((st.type, st.cnt, st.depid, st.deps) for st in tb.steps))
                 for tb in gpu.threadblocks)


def symmetric(program: Program, topology: Topology) -> bool:
    """True when every rank in `program` runs rank 0's schedule shifted by its coordinates,
    which makes a quotient simulation of rank 0 exact. A partial program (some ranks only)
    is checked on the ranks it holds, e.g. rank 0 and `probe_ranks`.

    >>> from hipipe_compiler.lower import lower
    >>> from hipipe_compiler.schedule import hierarchical_plan, ring_plan
    >>> from hipipe_compiler.presets import preset
    >>> topo = preset("torus-4x4")
    >>> symmetric(lower(hierarchical_plan(topo, chunks=2, max_bytes=1 << 20)), topo)
    True
    >>> symmetric(lower(ring_plan(topo, max_bytes=1 << 20)), topo)  # one ring through all ranks
    False
    """
    if not program.gpus or program.gpus[0].id != 0 or len(program.gpus) < 2:
        return False
    first = _shape(program.gpus[0], topology)
    return all(_shape(g, topology) == first for g in program.gpus[1:])


def simulate_exact(program: Program, topology: Topology, nbytes: int) -> SimResult:
    """The time of a whole program: rank 0 alone when every rank runs its schedule shifted
    (fast and exact), every rank otherwise."""
    if symmetric(program, topology):
        return simulate(replace(program, gpus=program.gpus[:1]), topology, nbytes, quotient=True)
    return simulate(program, topology, nbytes)


def simulate(program: Program, topology: Topology, nbytes: int, record: bool = False, quotient: bool = False,
             shortcut: bool = True, replay: Replay | None = None) -> SimResult:
    """Time one call of nbytes (the nccl-tests size: all-reduce buffer, reduce-scatter input,
    all-gather output) of `program` on `topology`.

    `quotient` runs rank 0 alone (a program from lower(plan, ranks=[0])): exact when every
    rank runs rank 0's schedule shifted by its coordinates (`symmetric`; `simulate_exact`
    checks it), an estimate otherwise. `shortcut` skips whole periods of the replays' steady
    state, exactly (period.py); False replays every iteration. Raises SimulationError for an
    illegal link or a deadlock. `replay` replaces the MSCCL runtime's slices and connection
    windows (for NCCL's own algorithms, which it times too).
    """
    sim = _Simulator(program, topology, nbytes, record, quotient, shortcut, replay)
    time = sim.run()
    bound = lower_bound(topology, program.collective, nbytes)
    n = topology.nranks
    senders = 1 if quotient else n
    busy = sim.net.busy_fractions(time)
    dims = [DimensionUsage(topology.dim_name(d), sim.net.dim_bytes[d] / senders, busy[d]) for d in range(topology.ndims)]
    return SimResult(program.collective, nbytes, n, time, None if bound is None else bound.total_us,
                     sim.iterations, tuple(dims), tuple(sim.intervals),
                     one_protocol_bound_us(topology, program.collective, nbytes),
                     sim.periodic.skipped if sim.periodic is not None else 0)
