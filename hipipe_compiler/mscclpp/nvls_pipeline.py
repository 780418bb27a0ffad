"""All-reduce across NVLS nodes as a pipelined MSCCL++ plan: the switch reduces each chunk
inside the node, the network all-reduces it across nodes, and the switch multicasts the sum
back, with the three stages busy at once on different chunks (the NVLS issue's schedule).

The topology is a switch with `nvls` (the node) times one switch dimension (the network).
Every GPU h of a node owns 1/n of the message, cut into `chunks` pipeline chunks, each cut
into one part per node. Per chunk:
1. a reduce threadblock runs `glres` on the node's switch channel over the inputs, storing
   the node's sum into a switch channel whose group is this GPU alone (the executor has no
   load-reduce without a multicast store; a one-GPU group makes the store local);
2. a network threadblock sends part p of that sum to GPU h of node p (port puts with
   signal), sums the parts it receives into its own part, and sends that to every other node;
3. a store threadblock multicasts the K summed parts into every GPU's output (`gstore`).
Semaphores pass each chunk from stage to stage. The reduce and the store stages work their
chunks in order, one threadblock after the other, so the pipeline is as deep as the chunk
count; the network threadblocks take turns, so one chunk's latency overlaps the next one's
bytes. The reduce and store threadblocks open with a handshake inside the node (a peer's
buffers are its caller's until its kernel starts), and every threadblock closes with one
with the peers it touched.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PlanError
from ..topology import Topology
from .plan import (MAX_CHANNELS, MAX_CHANNELS_PER_OP, MAX_MESSAGE_SIZE, MAX_OPERATIONS, MAX_SEMAPHORES_PER_OP, Channel,
                   ExecutionPlan, GpuPlan, Op, Operand, RemoteBuffer, TbBuffers, TbChannels, Threadblock)

#: Operations per chunk of each stage, and the fixed ones of its threadblock (handshakes).
_PER_CHUNK = {"reduce": 3, "network": 11, "store": 3}
_FIXED = {"reduce": 10, "network": 5, "store": 11}


@dataclass(frozen=True)
class Shape:
    """The node size n, the node count K, and the pipeline chunks per GPU."""

    n: int
    nodes: int
    chunks: int

    def chunk(self, h: int, j: int, part: int = 0) -> int:
        """Input (and output) chunk of part `part` of pipeline chunk j of GPU h's share."""
        return (h * self.chunks + j) * self.nodes + part

    @property
    def block(self) -> int:
        """Scratch chunks per pipeline chunk: the node's sum, the parts received, the sums."""
        return 3 * self.nodes - 1

    def node_sum(self, j: int, part: int) -> int:
        return j * self.block + part

    def received(self, j: int, receiver: int, sender: int) -> int:
        return j * self.block + self.nodes + (sender if sender < receiver else sender - 1)

    def summed(self, j: int, part: int) -> int:
        return j * self.block + 2 * self.nodes - 1 + part


def pipeline_shape(topology: Topology, chunks: int) -> Shape:
    """The shape of a plan on this topology, or PlanError where it has none."""
    dims = topology.dimensions
    if len(dims) != 2 or dims[0].nvls is None or dims[1].kind != "switch":
        raise PlanError("in-switch pipelines need an nvls switch inside the node and one switch network across nodes")
    n, nodes = dims[0].size, dims[1].size
    if n - 1 > MAX_CHANNELS or nodes - 1 > MAX_CHANNELS_PER_OP:
        raise PlanError(f"{n} GPUs and {nodes} nodes exceed the executor's channel limits")
    if not 1 <= chunks or _split(chunks, "network") > MAX_SEMAPHORES_PER_OP:
        raise PlanError(f"{chunks} pipeline chunks: expected 1 to {MAX_SEMAPHORES_PER_OP * _PER_TB['network']}, so "
                        "that a store threadblock releases every network one in one operation")
    return Shape(n, nodes, chunks)


#: Chunks one threadblock of each stage holds within the executor's operation limit.
_PER_TB = {stage: (MAX_OPERATIONS - _FIXED[stage]) // _PER_CHUNK[stage] for stage in _FIXED}


def _split(chunks: int, stage: str) -> int:
    """Threadblocks a stage needs for this many chunks."""
    return -(-chunks // _PER_TB[stage])


def nvls_pipeline_plan(topology: Topology, name: str, inplace: bool, chunks: int,
                       min_message_size: int = 0, max_message_size: int = MAX_MESSAGE_SIZE) -> ExecutionPlan:
    """Every rank's plan; PlanError where the topology does not have this shape."""
    shape = pipeline_shape(topology, chunks)
    counts = {stage: _split(chunks, stage) for stage in ("reduce", "network", "store")}
    gpus = tuple(_gpu(topology, shape, counts, rank, inplace) for rank in range(topology.nranks))
    return ExecutionPlan(name, "allreduce", "Simple", inplace, gpus, min_message_size=min_message_size,
                         max_message_size=max_message_size)


def _gpu(topology: Topology, shape: Shape, counts: dict[str, int], rank: int, inplace: bool) -> GpuPlan:
    h, k = topology.coord(rank, 0), topology.coord(rank, 1)
    node = topology.group(rank, 0)
    rail = topology.group(rank, 1)
    node_peers = tuple(p for p in node if p != rank)
    rail_peers = tuple(p for p in rail if p != rank)
    nr, nn, ns = counts["reduce"], counts["network"], counts["store"]
    # semaphores: reduce tb a -> network tb b, then network tb b -> store tb c
    def sem_rn(a: int, b: int) -> int:
        return a * nn + b

    def sem_ns(b: int, c: int) -> int:
        return nr * nn + b * ns + c

    def sem_done(c: int, b: int) -> int:  # store tb c has read every sum: network tb b may close
        return nr * nn + nn * ns + c * nn + b

    def baton(stage: str, t: int) -> int:  # the stage's threadblock t may start on its chunks
        return nr * nn + 2 * nn * ns + (t - 1 if stage == "reduce" else nr - 1 + t - 1)

    per_r, per_s = -(-shape.chunks // nr), -(-shape.chunks // ns)

    # switch channels: the node over the input, this GPU alone over scratch, the node over the output
    switch = (Channel("switch", buffer_type="i", rank_groups=(node,)), Channel("switch", buffer_type="s",
                                                                           rank_groups=((rank,),)))
    switch += () if inplace else (Channel("switch", buffer_type="o", rank_groups=(node,)),)
    src_switch, own_switch, out_switch = 0, 1, (0 if inplace else 2)
    tbs: list[Threadblock] = []
    memory_tables = 0

    def handshake(kind: str, peers: int) -> list[Op]:
        groups = [tuple(range(i, min(i + MAX_CHANNELS_PER_OP, peers))) for i in range(0, peers, MAX_CHANNELS_PER_OP)]
        return [Op("signal", kind, g) for g in groups] + [Op("wait", kind, g) for g in groups]

    # the reduce and store stages each work their chunks in order, one threadblock after the
    # other (a baton semaphore), so that the pipeline is as deep as the chunk count
    for a in range(nr):
        ops: list[Op] = [*handshake("memory", len(node_peers)), Op("nop")]
        ops += [Op("sem_acquire", semaphore_ids=(baton("reduce", a),)), Op("nop")] if a else []
        for j in range(a * per_r, min(shape.chunks, (a + 1) * per_r)):
            ops += [Op("glres", "switch", src=(Operand(None, shape.chunk(h, j), shape.nodes, switch_channel_id=0),),
                       dst=(Operand(None, shape.node_sum(j, 0), shape.nodes, switch_channel_id=1),)),
                    Op("nop"), Op("sem_release", semaphore_ids=(sem_rn(a, j % nn),))]
        ops += [Op("sem_release", semaphore_ids=(baton("reduce", a + 1),))] if a + 1 < nr else []
        ops += handshake("memory", len(node_peers))
        tbs.append(_tb(len(tbs), ops, range(memory_tables, memory_tables + len(node_peers)), (src_switch, own_switch)))
        memory_tables += len(node_peers)
    buffers = tuple(RemoteBuffer(p, "s", ("port",)) for p in rail_peers)
    everyone = tuple(range(len(rail_peers)))
    for b in range(nn):
        ops = []
        for j in range(b, shape.chunks, nn):
            sends = tuple(Operand("s", shape.node_sum(j, topology.coord(p, 1)), 1) for p in rail_peers)
            slots = tuple(Operand(None, shape.received(j, topology.coord(p, 1), k), 1, buffer_id=i)
                          for i, p in enumerate(rail_peers))
            mine = Operand("s", shape.summed(j, k), 1)
            received = tuple(Operand("s", shape.received(j, k, topology.coord(p, 1)), 1) for p in rail_peers)
            ops += [Op("sem_acquire", semaphore_ids=(sem_rn(j // per_r, b),)), Op("nop"),
                    Op("pws", "port", everyone, src=sends, dst=slots),
                    Op("wait", "port", everyone), Op("nop"),
                    Op("re", src=(Operand("s", shape.node_sum(j, k), 1), *received), dst=(mine,)), Op("nop"),
                    Op("pws", "port", everyone, src=(mine,) * len(rail_peers),
                       dst=tuple(Operand(None, shape.summed(j, k), 1, buffer_id=i) for i in everyone)),
                    Op("wait", "port", everyone), Op("nop"),
                    Op("sem_release", semaphore_ids=(sem_ns(b, j // per_s),))]
        # the peers write this GPU's sums, which the store threadblocks read: close after them
        ops += [Op("sem_acquire", semaphore_ids=tuple(sem_done(c, b) for c in range(ns))), Op("nop"),
                Op("signal", "port", everyone), Op("wait", "port", everyone)]
        first = b * len(rail_peers)
        tbs.append(Threadblock(len(tbs), tuple(ops), (TbChannels("port", tuple(range(first, first + len(rail_peers)))),),
                               (TbBuffers("port", tuple(range(len(buffers)))),)))
    for c in range(ns):
        ops = [*handshake("memory", len(node_peers)), Op("nop")]
        ops += [Op("sem_acquire", semaphore_ids=(baton("store", c),)), Op("nop")] if c else []
        for j in range(c * per_s, min(shape.chunks, (c + 1) * per_s)):
            ops += [Op("sem_acquire", semaphore_ids=(sem_ns(j % nn, c),)), Op("nop"),
                    Op("gstore", "switch", src=(Operand("s", shape.summed(j, 0), shape.nodes),),
                       dst=(Operand(None, shape.chunk(h, j), shape.nodes, switch_channel_id=0),))]
        ops += [Op("nop"), Op("sem_release", semaphore_ids=tuple(sem_done(c, b) for b in range(nn)))]
        ops += [Op("sem_release", semaphore_ids=(baton("store", c + 1),))] if c + 1 < ns else []
        ops += handshake("memory", len(node_peers))
        tbs.append(_tb(len(tbs), ops, range(memory_tables, memory_tables + len(node_peers)), (out_switch,)))
        memory_tables += len(node_peers)
    channels = (tuple(Channel("memory", connected_to=node_peers) for _ in range(nr + ns))
                + tuple(Channel("port", connected_to=rail_peers) for _ in range(nn)) + switch)
    total = shape.n * shape.chunks * shape.nodes
    return GpuPlan(rank, total, total, shape.chunks * shape.block, tuple(tbs), channels, buffers,
                   (0,) * (nr * nn + 2 * nn * ns + nr - 1 + ns - 1))


def _tb(index: int, ops: list[Op], memory: range, switch: tuple[int, ...]) -> Threadblock:
    return Threadblock(index, tuple(ops), (TbChannels("memory", tuple(memory)), TbChannels("switch", switch)))
