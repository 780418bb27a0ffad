"""The time of an MSCCL++ execution plan under cost-model.md, on the network of network.py.

What each operation costs (docs/mscclpp.md of the project has the table):
- a put (memory channel) is a message from this rank to the peer: its bytes at the shared
  rate of its links, and the threadblock moves on when they have arrived; the signal that
  publishes it pays the latency. A packet put (`ppkt`, `rppkt`, `respkt`) publishes itself:
  LL's alpha, then twice the bytes;
- a port channel's put is handed to the proxy: alpha, then its bytes, after the connection's
  earlier puts (the proxy works them in order); the threadblock moves on at once (`pwsf`
  waits for the arrival), and a signal behind it arrives with it;
- a signal arrives after the link's alpha; a wait ends when a signal has arrived; a
  semaphore costs nothing beyond its order; a packet read waits until its packets arrived;
- local work (copy, reduce, packing) runs at the topology's reduce bandwidth (free when it
  has none), before the operation's remote stores;
- `glres` is a switch reduce over its source's group and a multicast store to its
  destination's, both moving at once (each thread stores what its load-reduce returned);
  `gstore` is a multicast store (cost-model.md section 5). A switch channel's group must be
  the ranks of one dimension with `nvls`, or, as a `glres` destination, its GPU alone (a
  store through the switch it reduced on);
- every threadblock starts after the call cost of the plan's protocol, plus the in-switch
  call cost where the plan has switch channels.

>>> from hipipe_compiler.presets import preset
>>> from hipipe_compiler.schedule import hierarchical_plan
>>> from hipipe_compiler.plan_fitting import fit
>>> topo = preset("dgx-h100-8x2")
>>> _, plan = fit(hierarchical_plan(topo, max_bytes=1 << 20), topo, "demo")
>>> result = time_plan(plan, topo, 1 << 20)
>>> result.time_us > result.lower_bound_us > 0
True
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from functools import partial

from ..bounds import lower_bound, one_protocol_bound_us
from ..hardware import WIRE_EFFICIENCY
from ..mscclpp.plan import (PACKET_OPS, SWITCH_OPS, ExecutionPlan, GpuPlan, Op, Operand, channel_pairs,
                            message_sizes, packet_operand)
from ..topology import Topology
from .network import NETWORK_EVENTS, Message, Network
from .simulate import DimensionUsage, Interval, SimResult, SimulationError

#: Operations that write packets into this rank's own scratch, for a later put of them.
PACKS_LOCALLY = frozenset({"cpkt", "recpkt", "recspkt"})
LOCAL_OPS = frozenset({"copy", "re", "res", "rre", "rres", "cpkt", "upkt", "repkt", "respkt", "recpkt", "recspkt"})


class _Run:
    __slots__ = ("rank", "id", "ops", "pc", "phase", "pending", "key")

    def __init__(self, rank: int, tb_id: int, ops: list[Op]) -> None:
        self.rank, self.id, self.ops = rank, tb_id, ops
        self.pc = 0
        self.phase = "start"
        self.pending = 0  # messages the current operation waits for
        self.key = (rank, tb_id)


class _Timer:
    """Runs every rank's threadblocks, or with `orbits` rank 0's alone (exact where
    `symmetric(plan)`): then what rank 0 sends to q, it receives from q's mirror image, and
    each resource stands for its orbit (network.py)."""

    def __init__(self, plan: ExecutionPlan, topology: Topology, nbytes: int, record: bool = False,
                 orbits: bool = False, roles: _Roles | None = None) -> None:
        if plan.ngpus != topology.nranks:
            raise SimulationError(f"the plan is for {plan.ngpus} ranks but the topology has {topology.nranks}", 2)
        inp, out = message_sizes(plan.collective, nbytes, plan.ngpus)
        g0 = plan.gpus[0]
        if inp % (plan.buffer_alignment * g0.input_chunks) or out % (plan.buffer_alignment * g0.output_chunks):
            raise SimulationError(f"{nbytes} bytes do not split into the plan's chunks on {plan.buffer_alignment}-byte "
                                  "boundaries: the executor refuses the call", 2)
        if not plan.min_message_size <= (out if plan.collective == "allgather" else inp) <= plan.max_message_size:
            raise SimulationError(f"{nbytes} bytes are outside the plan's [min_message_size, max_message_size]", 2)
        self.plan, self.topology = plan, topology
        self.chunk = inp / g0.input_chunks
        self.orbits = orbits
        self.mirrors: dict[tuple, tuple[int, str, int]] = {}  # in orbit runs, by what rank 0 signals
        self.rank_tables: dict[int, dict[str, list[tuple]]] = {}  # of rank 0 and its mirror images
        self.net = Network(topology, "Simple", orbits=orbits)
        self.net.on_arrival = self.arrive
        self.g = topology.reduce_bandwidth * 1e3 if topology.reduce_bandwidth else None
        self.runs = [_Run(g.id, tb.id, [n for op in tb.ops for n in ((op,) if op.name != "pipeline" else op.ops)])
                     for g in (plan.gpus[:1] if orbits else plan.gpus) for tb in g.threadblocks]
        self.tb_plan = {(g.id, tb.id): tb for g in plan.gpus for tb in g.threadblocks}
        self.roles = roles or _Roles(plan)
        self.pair = self.roles.pairs
        self.signals: dict[tuple, int] = defaultdict(int)  # arrived, not yet waited for
        self.semaphores: dict[tuple, int] = {(g.id, s): v for g in plan.gpus for s, v in enumerate(g.semaphores)}
        self.packets: set[tuple[int, int]] = set()  # (rank, scratch cell) holding this launch's packets
        self.blocked: dict[tuple, list[_Run]] = defaultdict(list)
        self.port_tail: dict[tuple, Message] = {}  # the last port put on each connection
        self.behind: dict[int, list[tuple]] = defaultdict(list)  # signals that arrive with a message
        self.queued: dict[int, list[Message]] = defaultdict(list)  # port puts waiting for the one before
        self.last = 0.0
        self.record = record
        self.intervals: list[Interval] = []
        self.ordinal: dict[tuple, int] = defaultdict(int)  # data operations started, per (rank, name)
        self.switch_dims = {group: self._switch_dim(rank, group) for rank, g in enumerate(plan.gpus)
                            for _buffer, group in g.switch_groups() if len(group) > 1}

    def _switch_dim(self, rank: int, group: tuple[int, ...]) -> int:
        """The dimension with in-switch reduction whose group of rank is this switch channel's
        (a group of one GPU stores through the switch of the group it reduced over)."""
        for d in self.topology.nvls_dimensions:
            if sorted(group) == list(self.topology.group(rank, d)):
                return d
        raise SimulationError(f"rank {rank}'s switch channel over ranks {list(group)} is not the group of a dimension "
                              "with in-switch reduction (nvls) in this topology", 2)

    def run(self) -> float:
        start = self.topology.call_cost(self.plan.protocol)
        if self.switch_dims:
            start += max(self.topology.dimensions[d].nvls.call_latency for d in self.switch_dims.values())
        self.last = start
        for r in self.runs:
            self.net.schedule(start, "go", r)
        net = self.net
        while net.events:
            time, _seq, kind, obj, version = heapq.heappop(net.events)
            net.now = time
            if kind in NETWORK_EVENTS:
                net.handle(kind, obj, version)
            elif kind == "go":
                self.advance(obj)
            elif kind == "local":
                obj.phase = "remote"
                self.advance(obj)
            elif kind == "signal":
                self.deliver(obj)
        stuck = [r for r in self.runs if r.pc < len(r.ops)]
        if stuck:
            r = stuck[0]
            raise SimulationError(f"deadlock: rank {r.rank} tb {r.id} never finishes op {r.pc} ({r.ops[r.pc].name}); "
                                  f"{len(stuck)} threadblock(s) stuck")
        return self.last

    # -- threadblocks -------------------------------------------------------------------------
    def advance(self, r: _Run) -> None:
        while r.pc < len(r.ops):
            op = r.ops[r.pc]
            if not self.step(r, op):
                return
            r.pc += 1
            r.phase = "start"
            self.last = max(self.last, self.net.now)

    def endpoint(self, r: _Run, op: Op, local: int) -> tuple[int, str, int]:
        return (r.rank, op.channel_type, self.tb_plan[r.key].channel_list(op.channel_type)[local])

    def step(self, r: _Run, op: Op) -> bool:
        """Run an operation as far as it can go now; True when it is complete."""
        name = op.name
        if name in ("nop", "flush", "barrier"):
            return True
        if name in ("wait", "rlxwait"):
            ends = [self.endpoint(r, op, c) for c in op.channel_ids]
            for e in ends:
                if self.signals[e] <= 0:
                    self.blocked[("q", e)].append(r)
                    return False
            for e in ends:
                self.signals[e] -= 1
            return True
        if name in ("signal", "rlxsignal"):
            for c in op.channel_ids:
                self.signal(r, op, c)
            return True
        if name == "sem_release":
            for s in op.semaphore_ids:
                self.semaphores[(r.rank, s)] += 1
                self.wake(("sem", r.rank, s))
            return True
        if name == "sem_acquire":
            for s in op.semaphore_ids:
                if self.semaphores[(r.rank, s)] <= 0:
                    self.blocked[("sem", r.rank, s)].append(r)
                    return False
            for s in op.semaphore_ids:
                self.semaphores[(r.rank, s)] -= 1
            return True
        return self.data(r, op)

    def data(self, r: _Run, op: Op) -> bool:
        if r.phase == "start":
            for k, o in enumerate(op.src):
                if packet_operand(op.name, True, k) and o.buffer is not None:
                    cells = range(2 * o.index, 2 * o.end)
                    if not all((r.rank, c) in self.packets for c in cells):
                        self.blocked[("pkt", r.rank)].append(r)
                        return False
            size = op.src[0].size * self.chunk if op.src else 0.0
            if op.name in LOCAL_OPS and self.g:
                r.phase = "local"
                self.net.schedule(self.net.now + size / self.g, "local", r)
                return False
            r.phase = "remote"
        if r.phase == "remote":
            port = op.channel_type == "port"
            r.pending = 0
            if op.name in SWITCH_OPS:
                self.switch(r, op)
            for k, o in enumerate(op.dst):
                if o.buffer_id is not None:
                    channel = op.channel_ids[min(k, len(op.channel_ids) - 1)] if op.channel_ids else 0
                    self.send(r, op, o, packet_operand(op.name, False, k), not port or op.name == "pwsf", channel)
                    if port and op.name in ("pws", "pwsf"):  # thread k puts and signals on channel k
                        self.signal(r, op, channel)
            for k, o in enumerate(op.dst if op.name in PACKS_LOCALLY else ()):  # can be put once their flags show
                if o.buffer_id is None and packet_operand(op.name, False, k):
                    self.packets.update((r.rank, c) for c in range(2 * o.index, 2 * o.end))
                    self.wake(("pkt", r.rank))
            if r.pending:
                r.phase = "await"
                return False
            return True
        return r.phase == "done"

    def send(self, r: _Run, op: Op, o: Operand, packet: bool, wait: bool, channel: int) -> None:
        ref = self.plan.gpus[r.rank].remote_buffers[self.tb_plan[r.key].buffer_list(op.channel_type)[o.buffer_id]]
        try:
            resources, dim, _ = self.net.link(r.rank, ref.rank)
        except ValueError as exc:
            raise SimulationError(str(exc), 2) from None
        protocol = "LL" if op.name in PACKET_OPS else "Simple"
        # a memory put is stores streaming out: the signal behind it pays the latency
        alpha = self.topology.dimensions[dim].alpha(protocol) if protocol == "LL" or op.channel_type == "port" else 0.0
        lands = 0 if self.orbits else ref.rank  # rank 0 receives the packets it sends, from its mirror image
        msg = Message((r, wait, lands, (2 * o.index, 2 * o.end) if packet else None, self._tag(r, "send", ref.rank)),
                      resources, dim, o.size * self.chunk / WIRE_EFFICIENCY[protocol], alpha)
        if wait:
            r.pending += 1
        if op.channel_type == "port":
            mine = self.endpoint(r, op, channel)
            tail = self.port_tail.get(mine)
            self.port_tail[mine] = msg
            if tail is not None and not tail.arrived:  # the proxy works a connection's puts in order
                self.queued[id(tail)].append(msg)
                return
        self.net.send(msg)

    def switch(self, r: _Run, op: Op) -> None:
        """A glres's switch reduce and multicast store, or a gstore's store, on the network."""
        table = self.plan.gpus[r.rank].switch_groups()
        channels = self.tb_plan[r.key].channel_list("switch")
        nbytes = op.src[0].size * self.chunk
        parts = [("store", op.dst[0])] if op.name != "glres" else [("reduce", op.src[0]), ("store", op.dst[0])]
        dim = None
        for kind, operand in parts:
            group = table[channels[operand.switch_channel_id]][1]
            dim = self.switch_dims[group] if len(group) > 1 or dim is None else dim
            if len(group) == 1 and op.name != "glres":
                raise SimulationError(f"rank {r.rank} multicasts to a group of itself alone: no switch to time it on", 2)
            msg = self.net.switch_message((r, True, r.rank, None, self._tag(r, kind, -1)), kind, r.rank, dim, nbytes,
                                          group)
            r.pending += 1
            self.net.send(msg)

    def _tag(self, r: _Run, kind: str, peer: int) -> tuple[str, int, int] | None:
        """What a recorded message was: its kind, its peer (-1 for the switch) and the ordinal of
        its operation among the rank's operations of that name (in a pipeline, the chunk)."""
        if not self.record:
            return None
        name = r.ops[r.pc].name
        key = (r.rank, name, r.id, r.pc)
        if key not in self.ordinal:
            self.ordinal[key] = self.ordinal[(r.rank, name)]
            self.ordinal[(r.rank, name)] += 1
        return kind, peer, self.ordinal[key]

    def arrive(self, msg: Message) -> None:
        r, wait, rank, packets, tag = msg.owner
        if tag is not None:
            kind, peer, ordinal = tag
            self.intervals.append(Interval(msg.start, self.net.now, r.rank, peer, msg.dim, ordinal, 0, 0, r.id,
                                           {"reduce": True, "store": False}.get(kind)))
        if packets is not None:
            self.packets.update((rank, c) for c in range(*packets))
            self.wake(("pkt", rank))
        for peer in self.behind.pop(id(msg), []):
            self.deliver(peer)
        for queued in self.queued.pop(id(msg), []):
            self.net.send(queued)
        if wait:
            r.pending -= 1
            if r.pending == 0 and r.phase == "await":
                r.phase = "done"
                self.advance(r)
        self.last = max(self.last, self.net.now)

    def signal(self, r: _Run, op: Op, local: int) -> None:
        mine = self.endpoint(r, op, local)
        peer = self.pair.get(mine)
        if peer is None:
            raise SimulationError(f"rank {r.rank} {op.channel_type} channel {mine[2]} has no paired channel", 2)
        _, dim, _ = self.net.link(r.rank, peer[0])
        if self.orbits:  # rank 0 hears what its mirror image signals on the same channel
            peer = self.pair[self.mirrored(peer[0], op.channel_type, mine[2])]
        tail = self.port_tail.get(mine) if op.channel_type == "port" else None
        if tail is not None and not tail.arrived:
            self.behind[id(tail)].append(peer)  # the proxy delivers in order: the signal follows the data
            return
        self.net.schedule(self.net.now + self.topology.dimensions[dim].alpha("Simple"), "signal", peer)

    def mirrored(self, rank: int, channel_type: str, index: int) -> tuple[int, str, int]:
        """The endpoint of the rank whose coordinates are the negatives of rank's (its mirror
        image) that stands where rank 0's channel `index` stands in rank 0's table: what rank 0
        does towards `rank` on that channel, the mirror image does towards rank 0."""
        key = (rank, channel_type, index)
        if key not in self.mirrors:
            mirror = self.topology.mirror(rank)
            mine, theirs = (self.tables(r)[channel_type] for r in (0, mirror))
            place = next(c for c, (_, i) in enumerate(mine) if i == index)
            self.mirrors[key] = (mirror, channel_type, theirs[place][1])
        return self.mirrors[key]

    def tables(self, rank: int) -> dict[str, list[tuple]]:
        if rank not in self.rank_tables:
            self.rank_tables[rank] = _tables(rank, self.roles, self.topology)
        return self.rank_tables[rank]

    def deliver(self, endpoint: tuple) -> None:
        self.signals[endpoint] += 1
        self.wake(("q", endpoint))

    def wake(self, key: tuple) -> None:
        for r in self.blocked.pop(key, []):
            self.net.schedule(self.net.now, "go", r)


def _operand_shape(name: str, source: bool, k: int, o: Operand) -> tuple:
    """What of an operand a time depends on: its place and size, and where it is packets, its
    cells (a packet read waits for those); the offsets of plain data only say which data."""
    return o.buffer, o.size, o.buffer_id, o.switch_channel_id, o.index if packet_operand(name, source, k) else None


def _op_shape(op: Op) -> tuple:
    name, src, dst = op.name, op.src, op.dst
    return (name, op.channel_type, op.channel_ids, op.semaphore_ids, op.barrier_id, op.num_threadblocks, op.tbg,
            op.unit_size, op.num_chunks,
            tuple([_operand_shape(name, True, k, o) for k, o in enumerate(src)]) if src else (),
            tuple([_operand_shape(name, False, k, o) for k, o in enumerate(dst)]) if dst else (),
            tuple(map(_op_shape, op.ops)) if op.ops else ())


def _users(gpu: GpuPlan) -> dict[tuple[str, int], tuple[tuple[int, int], ...]]:
    """Who uses each GPU-level channel: (threadblock id, place in its channel list) per
    (type, index); operations name a channel by that place, in the list `channel_list` reads."""
    users: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for tb in gpu.threadblocks:
        for t in ("memory", "port"):
            for k, i in enumerate(tb.channel_list(t)):
                users[t, i].append((tb.id, k))
    return {key: tuple(v) for key, v in users.items()}


class _Roles:
    """What each rank's channels do, for `_tables`: their users, and the peer channel each
    pairs with (the t-th A->B pairs with the t-th B->A, so their numbering depends on which
    end is which, while their roles are what a shift keeps)."""

    def __init__(self, plan: ExecutionPlan) -> None:
        self.plan = plan
        self.pairs = channel_pairs(plan)
        self.users: dict[int, dict[tuple[str, int], tuple]] = {}

    def of(self, rank: int) -> dict[tuple[str, int], tuple]:
        if rank not in self.users:
            self.users[rank] = _users(self.plan.gpus[rank])
        return self.users[rank]

    def role(self, rank: int, channel_type: str, index: int) -> tuple:
        """The channel's users on this rank and, on its peer, the users of the channel it pairs with."""
        mine = self.of(rank).get((channel_type, index), ())
        peer = self.pairs.get((rank, channel_type, index))
        return mine, () if peer is None else self.of(peer[0]).get(peer[1:], ())


def _tables(rank: int, roles: _Roles, topology: Topology) -> dict[str, list[tuple]]:
    """Each GPU-level table (memory and port channels, switch channels, peer buffers) as
    (what the entry is, with peers as shifts; its index), in an order of the entries alone: the
    indices are names. A channel is its peer and its role (`_Roles.role`), not its place among
    the channels to that peer."""
    gpu = roles.plan.gpus[rank]
    rel = partial(topology.offset, gpu.id)
    out: dict[str, list[tuple]] = {}
    for t in ("memory", "port"):
        out[t] = sorted(((rel(p), roles.role(rank, t, i)), i) for i, p in enumerate(gpu.peers(t)))
    out["switch"] = sorted(((b, tuple(sorted(map(rel, g)))), i) for i, (b, g) in enumerate(gpu.switch_groups()))
    out["buffers"] = sorted(((rel(b.rank), b.type, b.access_channel_types), i) for i, b in enumerate(gpu.remote_buffers))
    return out


def _list_shape(ops: tuple[Op, ...], shapes: dict[int, tuple]) -> tuple:
    """A threadblock's operations' shapes, once per list (by identity)."""
    if id(ops) not in shapes:
        shapes[id(ops)] = tuple(map(_op_shape, ops))
    return shapes[id(ops)]


def _gpu_shape(rank: int, roles: _Roles, topology: Topology, shapes: dict[int, tuple]) -> tuple:
    """A rank's plan with every peer named by its shift from the rank, its tables in a
    canonical order, and data offsets left out. `shapes` keeps each threadblock's operation
    shapes by the list's identity: ranks share the lists they repeat (the reader builds each
    once)."""
    gpu = roles.plan.gpus[rank]
    tables = _tables(rank, roles, topology)
    place = {t: {i: c for c, (_, i) in enumerate(entries)} for t, entries in tables.items()}
    entries = tuple((t, tuple(e for e, _ in tables[t])) for t in sorted(tables))
    blocks = tuple((tb.id, tuple((c.channel_type, tuple(place[c.channel_type][i] for i in c.channel_ids))
                                 for c in tb.channels),
                    tuple((b.access_channel_type, tuple(place["buffers"][i] for i in b.remote_buffer_ids))
                          for b in tb.remote_buffer_refs),
                    _list_shape(tb.ops, shapes)) for tb in gpu.threadblocks)
    return gpu.input_chunks, gpu.output_chunks, gpu.scratch_chunks, gpu.semaphores, entries, blocks


def symmetric(plan: ExecutionPlan, topology: Topology, roles: _Roles | None = None) -> bool:
    """True when every rank runs rank 0's plan shifted by its coordinates (peers, switch
    groups, operations, sizes and packet cells; table order and data offsets may differ):
    then timing rank 0 alone, each resource standing for its orbit, is exact."""
    if plan.ngpus != topology.nranks or plan.ngpus < 2 or any(g.id != i for i, g in enumerate(plan.gpus)):
        return False
    try:
        roles = roles or _Roles(plan)
        shapes: dict[int, tuple] = {}  # by id: the plan keeps every list alive meanwhile
        first = _gpu_shape(0, roles, topology, shapes)
        return all(_gpu_shape(rank, roles, topology, shapes) == first for rank in range(1, plan.ngpus))
    except (KeyError, IndexError, ValueError):  # a table index out of range: the full run names it
        return False


def time_plan(plan: ExecutionPlan, topology: Topology, nbytes: int, record: bool = False,
              orbits: bool | None = None) -> SimResult:
    """Time one call of nbytes (the nccl-tests size) of an execution plan on a topology; with
    `record`, the result keeps every message (for timelines: `iteration` is the ordinal of its
    operation among the rank's of that name, `reduce` True for a switch reduce, False for a
    multicast store and None for a put). `orbits` times rank 0 alone; by default, where that
    is exact (`symmetric`) and nothing is recorded."""
    roles = _Roles(plan)  # the channels' pairs and users, once for the check and the run
    if orbits is None:
        orbits = not record and symmetric(plan, topology, roles)
    timer = _Timer(plan, topology, nbytes, record, orbits, roles)
    time = timer.run()
    bound = lower_bound(topology, plan.collective, nbytes)
    busy = timer.net.busy_fractions(time)
    n = topology.nranks
    senders = 1 if orbits else n
    dims = tuple(DimensionUsage(topology.dim_name(d), timer.net.dim_bytes[d] / senders, busy[d])
                 for d in range(topology.ndims))
    # T_LB1 is the limit of a one-protocol GPU-side program: it does not judge a plan that reduces in the switch
    one = None if timer.switch_dims else one_protocol_bound_us(topology, plan.collective, nbytes)
    return SimResult(plan.collective, nbytes, n, time, None if bound is None else bound.total_us, 1, dims,
                     tuple(timer.intervals), one)
