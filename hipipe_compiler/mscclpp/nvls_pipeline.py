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
chunks in one or more lanes; a lane works its chunks in order, one threadblock after the
other, so the pipeline is as deep as the chunk count, and lanes staggered by a fraction of a
chunk hide each other's latencies. The network threadblocks take turns, so one chunk's
latency overlaps the next one's bytes. The reduce and store threadblocks open and close with
a handshake inside the node (a peer's buffers are its caller's until its kernel starts and
after it ends). The network threadblocks need none: a peer's next write into this GPU's
scratch depends on data this GPU sends after its own reads of that scratch (the first
exchange's slots), or after its next kernel started (the sums), so the collective's own
dependencies order the launches (the verifier's slot-reuse rule proves it; a closing
handshake would add a network latency after the last store).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PlanError
from ..topology import Topology
from .plan import (MAX_CHANNELS, MAX_CHANNELS_PER_OP, MAX_MESSAGE_SIZE, MAX_OPERATIONS, Channel,
                   ExecutionPlan, GpuPlan, Op, Operand, RemoteBuffer, TbBuffers, TbChannels, Threadblock, bounded)

#: Operations per chunk of each stage, and the fixed ones of its threadblock (handshakes).
_PER_CHUNK = {"reduce": 3, "network": 11, "store": 3}
_FIXED = {"reduce": 10, "network": 0, "store": 11}


@dataclass(frozen=True)
class Shape:
    """The node size n, the node count K, and the pipeline chunks per GPU, each `units[j]`
    plan chunks long per node (one each where units is empty)."""

    n: int
    nodes: int
    chunks: int
    units: tuple[int, ...] = ()

    def size(self, j: int) -> int:
        """Plan chunks of one part (one node's) of pipeline chunk j."""
        return self.units[j] if self.units else 1

    @property
    def total(self) -> int:
        """Plan chunks of one part of every pipeline chunk."""
        return sum(self.units) if self.units else self.chunks

    def _before(self, j: int) -> int:
        return sum(self.units[:j]) if self.units else j

    def chunk(self, h: int, j: int, part: int = 0) -> int:
        """Input (and output) chunk where part `part` of pipeline chunk j of GPU h's share starts."""
        return (h * self.total + self._before(j)) * self.nodes + part * self.size(j)

    @property
    def block(self) -> int:
        """Scratch parts per pipeline chunk: the node's sum, the parts received, the sums."""
        return 3 * self.nodes - 1

    def node_sum(self, j: int, part: int) -> int:
        return self._before(j) * self.block + part * self.size(j)

    def received(self, j: int, receiver: int, sender: int) -> int:
        return self._before(j) * self.block + (self.nodes + (sender if sender < receiver else sender - 1)) * self.size(j)

    def summed(self, j: int, part: int) -> int:
        return self._before(j) * self.block + (2 * self.nodes - 1 + part) * self.size(j)


def pipeline_shape(topology: Topology, chunks: int, units: tuple[int, ...] = ()) -> Shape:
    """The shape of a plan on this topology, or PlanError where it has none."""
    dims = topology.dimensions
    if len(dims) != 2 or dims[0].nvls is None or dims[1].kind != "switch":
        raise PlanError("in-switch pipelines need an nvls switch inside the node and one switch network across nodes")
    n, nodes = dims[0].size, dims[1].size
    if n - 1 > MAX_CHANNELS or nodes - 1 > MAX_CHANNELS_PER_OP:
        raise PlanError(f"{n} GPUs and {nodes} nodes exceed the executor's channel limits")
    if not 1 <= chunks <= MAX_CHUNKS:
        raise PlanError(f"{chunks} pipeline chunks: expected 1 to {MAX_CHUNKS}")
    if units and (len(units) != chunks or min(units) < 1):
        raise PlanError(f"chunk sizes {units}: expected {chunks} positive numbers")
    return Shape(n, nodes, chunks, units)


#: Pipeline chunks a plan may have: its threadblocks then stay within an H100's SMs.
MAX_CHUNKS = 256

#: Chunks one threadblock of each stage holds within the executor's operation limit.
_PER_TB = {stage: (MAX_OPERATIONS - _FIXED[stage]) // _PER_CHUNK[stage] for stage in _FIXED}


def _split(chunks: int, stage: str) -> int:
    """Threadblocks a stage needs for this many chunks."""
    return -(-chunks // _PER_TB[stage])


def nvls_pipeline_plan(topology: Topology, name: str, inplace: bool, chunks: int, lanes: int = 1,
                       units: tuple[int, ...] = (), min_message_size: int = 0,
                       max_message_size: int = MAX_MESSAGE_SIZE) -> ExecutionPlan:
    """Every rank's plan; PlanError where the topology does not have this shape. The switch
    stages work on `lanes` chunks at once, so that one chunk's latency hides behind another's
    bytes; `units` sizes the chunks (equal where empty)."""
    shape = pipeline_shape(topology, chunks, units)
    if not 1 <= lanes <= chunks:
        raise PlanError(f"{lanes} lanes for {chunks} pipeline chunks: expected 1 to {chunks}")
    stages = {"reduce": _stage_blocks(chunks, lanes, "reduce"), "network": _network_blocks(chunks),
              "store": _stage_blocks(chunks, lanes, "store")}
    gpus = tuple(_gpu(topology, shape, stages, rank, inplace) for rank in range(topology.nranks))
    return bounded(ExecutionPlan(name, "allreduce", "Simple", inplace, gpus, min_message_size=min_message_size,
                                 max_message_size=max_message_size))


@dataclass(frozen=True)
class Block:
    """One threadblock of a stage: its chunks, in order, and the threadblock of the same lane
    that must finish its chunks first (None for a lane's first)."""

    chunks: tuple[int, ...]
    after: int | None = None


Blocks = tuple[Block, ...]


def _stage_blocks(chunks: int, lanes: int, stage: str) -> Blocks:
    """A switch stage's threadblocks: lane l takes every lanes-th chunk from l, in order, in as
    many threadblocks one after the other as the operation limit needs."""
    blocks: list[Block] = []
    for lane in range(lanes):
        mine = tuple(range(lane, chunks, lanes))
        for i in range(0, len(mine), _PER_TB[stage]):
            blocks.append(Block(mine[i:i + _PER_TB[stage]], len(blocks) - 1 if i else None))
    return tuple(blocks)


def _network_blocks(chunks: int) -> Blocks:
    """The network threadblocks take the chunks in turns."""
    count = _split(chunks, "network")
    return tuple(Block(tuple(range(b, chunks, count))) for b in range(count))


def _gpu(topology: Topology, shape: Shape, stages: dict[str, Blocks], rank: int, inplace: bool) -> GpuPlan:
    h, k = topology.coord(rank, 0), topology.coord(rank, 1)
    node = topology.group(rank, 0)
    rail = topology.group(rank, 1)
    # peers in the order of their shift from this rank, so that every rank runs rank 0's plan
    # shifted by its coordinates (which lets the simulator time rank 0 alone)
    node_peers = tuple(topology.shift(rank, 0, delta) for delta in range(1, len(node)))
    rail_peers = tuple(topology.shift(rank, 1, delta) for delta in range(1, len(rail)))
    reduce_blocks, network_blocks, store_blocks = stages["reduce"], stages["network"], stages["store"]
    nr, nn, ns = len(reduce_blocks), len(network_blocks), len(store_blocks)
    semaphores: dict[tuple[object, ...], int] = {}

    def sem(*key: object) -> int:
        return semaphores.setdefault(key, len(semaphores))

    def baton(stage: str, blocks: Blocks, t: int) -> tuple[list[Op], list[Op]]:
        """What threadblock t of a switch stage acquires first and releases last: its lane's baton."""
        take = [Op("sem_acquire", semaphore_ids=(sem(stage, t),)), Op("nop")] if blocks[t].after is not None else []
        nxt = [u for u in range(t + 1, len(blocks)) if blocks[u].after == t]
        return take, [Op("sem_release", semaphore_ids=(sem(stage, nxt[0]),))] if nxt else []

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

    # within a lane, the switch stages work their chunks in order, one threadblock after the
    # other (a baton semaphore), so that the pipeline is as deep as the chunk count
    for a, block in enumerate(reduce_blocks):
        take, give = baton("reduce", reduce_blocks, a)
        ops: list[Op] = [*handshake("memory", len(node_peers)), Op("nop"), *take]
        for j in block.chunks:
            whole = shape.nodes * shape.size(j)
            ops += [Op("glres", "switch", src=(Operand(None, shape.chunk(h, j), whole, switch_channel_id=0),),
                       dst=(Operand(None, shape.node_sum(j, 0), whole, switch_channel_id=1),)),
                    Op("nop"), Op("sem_release", semaphore_ids=(sem("reduced", j),))]
        ops += [*give, *handshake("memory", len(node_peers))]
        tbs.append(_tb(len(tbs), ops, range(memory_tables, memory_tables + len(node_peers)), (src_switch, own_switch)))
        memory_tables += len(node_peers)
    buffers = tuple(RemoteBuffer(p, "s", ("port",)) for p in rail_peers)
    everyone = tuple(range(len(rail_peers)))
    for b, block in enumerate(network_blocks):
        ops = []
        for j in block.chunks:
            u = shape.size(j)
            sends = tuple(Operand("s", shape.node_sum(j, topology.coord(p, 1)), u) for p in rail_peers)
            slots = tuple(Operand(None, shape.received(j, topology.coord(p, 1), k), u, buffer_id=i)
                          for i, p in enumerate(rail_peers))
            mine = Operand("s", shape.summed(j, k), u)
            received = tuple(Operand("s", shape.received(j, k, topology.coord(p, 1)), u) for p in rail_peers)
            ops += [Op("sem_acquire", semaphore_ids=(sem("reduced", j),)), Op("nop"),
                    Op("pws", "port", everyone, src=sends, dst=slots),
                    Op("wait", "port", everyone), Op("nop"),
                    Op("re", src=(Operand("s", shape.node_sum(j, k), u), *received), dst=(mine,)), Op("nop"),
                    Op("pws", "port", everyone, src=(mine,) * len(rail_peers),
                       dst=tuple(Operand(None, shape.summed(j, k), u, buffer_id=i) for i in everyone)),
                    Op("wait", "port", everyone), Op("nop"),
                    Op("sem_release", semaphore_ids=(sem("summed", j),))]
        first = b * len(rail_peers)
        tbs.append(Threadblock(len(tbs), tuple(ops), (TbChannels("port", tuple(range(first, first + len(rail_peers)))),),
                               (TbBuffers("port", tuple(range(len(buffers)))),)))
    for c, block in enumerate(store_blocks):
        take, give = baton("store", store_blocks, c)
        ops = [*handshake("memory", len(node_peers)), Op("nop"), *take]
        for j in block.chunks:
            ops += [Op("sem_acquire", semaphore_ids=(sem("summed", j),)), Op("nop"),
                    Op("gstore", "switch", src=(Operand("s", shape.summed(j, 0), shape.nodes * shape.size(j)),),
                       dst=(Operand(None, shape.chunk(h, j), shape.nodes * shape.size(j), switch_channel_id=0),))]
        ops += [Op("nop"), *give, *handshake("memory", len(node_peers))]
        tbs.append(_tb(len(tbs), ops, range(memory_tables, memory_tables + len(node_peers)), (out_switch,)))
        memory_tables += len(node_peers)
    channels = (tuple(Channel("memory", connected_to=node_peers) for _ in range(nr + ns))
                + tuple(Channel("port", connected_to=rail_peers) for _ in range(nn)) + switch)
    total = shape.n * shape.total * shape.nodes
    return GpuPlan(rank, total, total, shape.total * shape.block, tuple(tbs), channels, buffers,
                   (0,) * len(semaphores))


def staggered(chunks: int, lanes: int) -> tuple[int, ...]:
    """Chunk sizes that start lane l l/lanes of a chunk after lane 0 and end it as much later,
    so that the lanes' switch operations do not pay their latencies at the same moments: every
    chunk `lanes` units, but lane l's first l and its last 2 * lanes - l."""
    if lanes < 1 or (lanes > 1 and chunks < 2 * lanes):
        raise PlanError(f"{lanes} staggered lanes need at least {2 * lanes} pipeline chunks, not {chunks}")
    units = [lanes] * chunks
    for lane in range(1, lanes):
        units[lane] = lane
        units[chunks - lanes + lane] += lanes - lane
    return tuple(units)


def describe(plan: ExecutionPlan) -> tuple[tuple[int, ...], int]:
    """An in-switch pipeline plan's chunk sizes (in plan chunks per part) and lane count, read
    from its first rank's switch-reduce threadblocks."""
    gpu = plan.gpus[0]
    nodes = len(gpu.remote_buffers) + 1  # one scratch buffer per rail peer
    reducers = [tb for tb in gpu.threadblocks if any(op.name == "glres" for op in tb.ops)]
    sizes = {op.src[0].index: op.src[0].size // nodes for tb in reducers for op in tb.ops if op.name == "glres"}
    lanes = sum(1 for tb in reducers if not any(op.name == "sem_acquire" for op in tb.ops))
    return tuple(sizes[i] for i in sorted(sizes)), lanes


def _tb(index: int, ops: list[Op], memory: range, switch: tuple[int, ...]) -> Threadblock:
    return Threadblock(index, tuple(ops), (TbChannels("memory", tuple(memory)), TbChannels("switch", switch)))
