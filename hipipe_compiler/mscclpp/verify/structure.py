"""The rules a plan must follow before it runs: the fields the loader reads (mscclpp.md 2),
every limit of section 6 (most of which the loader does not check), the declarations an
operation relies on, and the pairing of channels (section 3.1)."""

from __future__ import annotations

from collections import Counter

from ...msccl.verify.report import Collector
from ..plan import (BUFFER_TYPES, CHANNEL_OPS, CHANNEL_TYPES, COLLECTIVES, DATA_OPS, MAX_BARRIERS, MAX_CHANNELS,
                    MAX_CHANNELS_PER_OP, MAX_OPERANDS, MAX_OPERATIONS, MAX_SEMAPHORES_PER_OP, MAX_THREADS, OPERATIONS,
                    PACKET_OPS, SEMAPHORE_OPS, SWITCH_OPS, ExecutionPlan, GpuPlan, Op, Operand, Threadblock,
                    largest_message_size, packet_operand)

#: Operations whose first destination is local and later ones may be peers.
LOCAL_FIRST_DST = frozenset({"re", "res", "rre", "rres", "repkt", "respkt", "recpkt", "recspkt", "copy", "upkt", "cpkt", "get"})
#: Operations that write peers only.
REMOTE_DST = frozenset({"put", "pws", "pwsf", "ppkt", "rppkt"})


def check_structure(plan: ExecutionPlan, out: Collector) -> bool:
    """Add a violation per broken rule; True when the plan is sound enough to execute symbolically."""
    before = len(out)
    passed: set[tuple] = set()
    if not plan.name:
        out.add("plan-field", "name: expected a non-empty name (it keys the executor's context cache and the shim's map)")
    if plan.collective not in COLLECTIVES:
        out.add("plan-field", f"collective: expected one of {', '.join(COLLECTIVES)}, got {plan.collective!r}")
    if not 1 <= plan.num_threads_per_block <= MAX_THREADS:
        out.add("thread-limit", f"num_threads_per_block: expected 1 to {MAX_THREADS}, got {plan.num_threads_per_block}")
    if plan.buffer_alignment <= 0 or plan.buffer_alignment % 16:
        out.add("plan-field", f"buffer_alignment: expected a positive multiple of 16, got {plan.buffer_alignment}")
    if plan.min_message_size > plan.max_message_size:
        out.add("plan-field", f"min_message_size {plan.min_message_size} exceeds max_message_size {plan.max_message_size}")
    if plan.max_message_size > (largest := largest_message_size(plan)):
        out.add("offset-limit", f"max_message_size {plan.max_message_size}: above {largest} bytes the executor's uint32 "
                "offsets wrap (the buffers' ends or the scratch pass 4 GiB; mscclpp.md 6)")
    if plan.use_double_scratch_buffer and any(
            o.buffer_id is not None and op.name not in PACKET_OPS for g in plan.gpus for tb in g.threadblocks
            for op in tb.flat_ops() for o in (*op.src, *op.dst)):
        out.add("double-scratch", "use_double_scratch_buffer with a plain access to a peer's buffer: only packet "
                "operations add the half that alternates between launches (mscclpp.md 2.6)")
    if plan.reuse_resources:
        out.add("unsupported", "reuse_resources: plans that share one scratch across calls are not modelled")
    if not plan.gpus:
        out.add("plan-field", "gpus: expected one entry per rank, got none")
    for r, g in enumerate(plan.gpus):
        if g.id != r:
            out.add("plan-field", f"gpus[{r}].id is {g.id}; the loader requires it to equal the position", r)
        if g.input_chunks < 1 or g.output_chunks < 1:
            out.add("plan-field", "input_chunks and output_chunks must be at least 1 (0 divides by zero in the loader)", r)
        if g.scratch_chunks < 0:
            out.add("plan-field", "scratch_chunks must not be negative", r)
        if plan.collective == "allreduce" and g.input_chunks != g.output_chunks:
            out.add("plan-field", "an all-reduce needs input_chunks == output_chunks (one chunk size for both)", r)
        _gpu(plan, g, out, passed)
    _pairing(plan, out)
    _switch_groups(plan, out)
    return len(out) == before


def _gpu(plan: ExecutionPlan, g: GpuPlan, out: Collector, passed: set[tuple]) -> None:
    r = g.id
    for b in g.remote_buffers:
        if not 0 <= b.rank < plan.ngpus or b.rank == r:
            out.add("buffer-declaration", f"remote buffer of rank {b.rank}: expected another rank of the plan", r)
        if b.type not in BUFFER_TYPES:
            out.add("buffer-declaration", f"remote buffer type {b.type!r}: expected i, o or s", r)
        if plan.collective == "allgather" and plan.inplace and b.type == "i":
            out.add("buffer-declaration", "an in-place all-gather must never address a peer's input (mscclpp.md 8.6)", r)
    for c in g.channels:
        if c.channel_type not in CHANNEL_TYPES:
            out.add("plan-field", f"channel type {c.channel_type!r}: expected memory, port or switch", r)
        for p in c.connected_to:
            if not 0 <= p < plan.ngpus or p == r:
                out.add("channel-declaration", f"{c.channel_type} channel to rank {p}: expected another rank of the plan", r)
    tables = {t: g.peers(t) for t in {c.channel_type for c in g.channels}}  # the gpu's, once for its threadblocks
    tables["switch"] = g.switch_groups()
    for k, tb in enumerate(g.threadblocks):
        if tb.id != k:
            out.add("plan-field", f"threadblock {k} has id {tb.id}; emit ids 0..n-1 in array order", r, tb.id)
        _threadblock(plan, g, tb, tables, out, passed)


def _threadblock(plan: ExecutionPlan, g: GpuPlan, tb: Threadblock, tables: dict[str, tuple], out: Collector,
                 passed: set[tuple]) -> None:
    """`tables`: the gpu's channel table of each type (its peers; (buffer, ranks) for switch)."""
    r = g.id
    flat = list(tb.flat_ops())
    if len(flat) > MAX_OPERATIONS:
        out.add("op-limit", f"{len(flat)} operations; the executor runs at most {MAX_OPERATIONS} per threadblock", r, tb.id)
    for c in tb.channels:
        if len(c.channel_ids) > MAX_CHANNELS:
            out.add("channel-limit", f"{len(c.channel_ids)} {c.channel_type} channels; at most {MAX_CHANNELS} per type", r, tb.id)
        table = tables.get(c.channel_type, ())
        for i in c.channel_ids:
            if not 0 <= i < len(table):
                out.add("channel-declaration", f"{c.channel_type} channel {i} is not declared by the gpu", r, tb.id)
    for b in tb.remote_buffer_refs:
        if len(b.remote_buffer_ids) > MAX_CHANNELS:
            out.add("channel-limit", f"{len(b.remote_buffer_ids)} remote buffers of one access type; at most {MAX_CHANNELS}",
                    r, tb.id)
        for i in b.remote_buffer_ids:
            if not 0 <= i < len(g.remote_buffers):
                out.add("buffer-declaration", f"remote buffer {i} is not declared by the gpu", r, tb.id)
            elif b.access_channel_type not in g.remote_buffers[i].access_channel_types:
                out.add("buffer-declaration", f"remote buffer {i} is not declared for {b.access_channel_type} access", r, tb.id)
    seen = (id(tb.ops), tb.channels, tb.remote_buffer_refs, _surroundings(plan, g, tb, tables["switch"]))
    if seen in passed:
        return
    found = len(out)
    for pos, op in enumerate(tb.ops):
        _op(plan, g, tb, op, pos, out)
        for nested in op.ops:
            if nested.name == "pipeline":
                out.add("pipeline", "pipelines do not nest", r, tb.id, pos)
            _op(plan, g, tb, nested, pos, out)
            for o in (*nested.src, *nested.dst):
                if op.num_chunks is not None and o.size != op.num_chunks:
                    out.add("pipeline", f"a nested operand of {o.size} chunks in a pipeline of num_chunks {op.num_chunks} "
                            "underflows the executor's unsigned lengths", r, tb.id, pos)
    if len(out) == found < out.limit:  # none found, and none would have been dropped
        passed.add(seen)


def _surroundings(plan: ExecutionPlan, g: GpuPlan, tb: Threadblock, table: tuple) -> tuple:
    """What the checks of a threadblock's operations read besides the operations and the
    threadblock's own lists: the gpu's counts, and the size of every peer buffer and switch
    group (of the gpu's `table`) the lists name. Ranks that run the same operations amid the
    same surroundings pass alike: a 1024-rank plan is checked once per distinct threadblock,
    not 58 thousand times."""
    def peer_buffer(ref: int) -> tuple | None:
        if not 0 <= ref < len(g.remote_buffers):
            return None
        b = g.remote_buffers[ref]
        if not 0 <= b.rank < plan.ngpus or b.type not in BUFFER_TYPES:
            return b.type, b.rank
        peer = plan.gpus[b.rank]
        return b.type, _chunks(plan, peer, b.type, False), _chunks(plan, peer, b.type, True)

    def group(c: int) -> tuple | None:
        if not 0 <= c < len(table):
            return None
        buffer, ranks = table[c]
        return buffer, tuple(_chunks(plan, plan.gpus[m], buffer, False) if 0 <= m < plan.ngpus and buffer in BUFFER_TYPES
                             else None for m in ranks)

    return (len(g.threadblocks), len(g.semaphores), g.input_chunks, g.output_chunks, g.scratch_chunks,
            tuple(tuple(map(peer_buffer, b.remote_buffer_ids)) for b in tb.remote_buffer_refs),
            tuple(map(group, tb.channel_list("switch"))))


def _op(plan: ExecutionPlan, g: GpuPlan, tb: Threadblock, op: Op, pos: int, out: Collector) -> None:
    r = g.id
    where = (r, tb.id, pos)
    if op.name not in OPERATIONS:
        out.add("plan-field", f"operation {op.name!r}: the executor accepts none of that name", *where)
        return
    if op.name == "gstorepkt":
        out.add("unsupported", "gstorepkt: multicast packets are not modelled by this verifier", *where)
        return
    if op.name in SWITCH_OPS:
        _switch_op(plan, g, tb, op, where, out)
        return
    if op.channel_type == "switch":
        out.add("operand", f"{op.name} does not run on a switch channel: only glres and gstore do", *where)
        return
    if op.tbg is not None:
        out.add("unsupported", "tbg_info: thread-block groups are not modelled by this verifier", *where)
    if op.name == "pipeline":
        if not op.unit_size or op.unit_size <= 0 or not op.num_chunks or op.num_chunks <= 0:
            out.add("pipeline", "iter_context needs a positive unit_size and num_chunks", *where)
        return
    if op.name == "barrier":
        if op.barrier_id is None or not 0 <= op.barrier_id < MAX_BARRIERS:
            out.add("barrier", f"barrier_id must be 0 to {MAX_BARRIERS - 1}", *where)
        if not op.num_threadblocks or not 1 <= op.num_threadblocks <= len(g.threadblocks):
            out.add("barrier", "num_threadblocks must count threadblocks of this gpu", *where)
        return
    if op.name in SEMAPHORE_OPS:
        if not op.semaphore_ids or len(op.semaphore_ids) > MAX_SEMAPHORES_PER_OP:
            out.add("semaphore", f"expected 1 to {MAX_SEMAPHORES_PER_OP} semaphore ids, got {len(op.semaphore_ids)}", *where)
        for s in op.semaphore_ids:
            if not 0 <= s < len(g.semaphores):
                out.add("semaphore", f"semaphore {s} is not declared by the gpu", *where)
        return
    if len(op.channel_ids) > MAX_CHANNELS_PER_OP:
        out.add("channel-limit", f"{len(op.channel_ids)} channel ids; an operation holds at most {MAX_CHANNELS_PER_OP}", *where)
    if len(op.src) > MAX_OPERANDS or len(op.dst) > MAX_OPERANDS:
        out.add("operand-limit", f"{max(len(op.src), len(op.dst))} operands on a side; at most {MAX_OPERANDS}", *where)
    if op.name in CHANNEL_OPS or op.name in ("pws", "pwsf"):
        if op.channel_type not in ("memory", "port"):
            out.add("channel-declaration", f"{op.name} needs a memory or port channel_type, got {op.channel_type!r}", *where)
        if not op.channel_ids and op.name != "flush":
            out.add("channel-declaration", f"{op.name} names no channel", *where)
        for i in op.channel_ids:
            if not 0 <= i < len(tb.channel_list(op.channel_type)):
                out.add("channel-declaration", f"{op.channel_type} channel {i} is not in the threadblock's list", *where)
        if op.name in ("pws", "pwsf") and op.channel_type == "memory":
            out.add("port-source", f"{op.name} on a memory channel is a plain put with no signal", *where)
    if op.name in DATA_OPS:
        _operands(plan, g, tb, op, where, out)


def _operands(plan: ExecutionPlan, g: GpuPlan, tb: Threadblock, op: Op, where: tuple, out: Collector) -> None:
    if not op.src or (op.name not in ("cpkt",) and not op.dst):
        out.add("operand", f"{op.name} needs source and destination operands", *where)
        return
    sizes = {o.size for o in op.src} | {o.size for o in op.dst}
    if len(sizes) > 1 or min(sizes) < 1:
        out.add("operand", f"{op.name} operands of sizes {sorted(sizes)}: expected one positive size", *where)
    remote_src = any(o.buffer_id is not None for o in op.src)
    if remote_src and op.name not in ("rre", "rres", "get"):
        out.add("operand", f"{op.name} cannot read a peer's buffer", *where)
    if op.name in REMOTE_DST and (op.dst[0].local or not op.remote_writes):
        out.add("operand", f"{op.name} writes peers: its destinations must be peer buffers", *where)
    if op.name in LOCAL_FIRST_DST and not op.dst[0].local:
        out.add("operand", f"{op.name} writes its first destination locally", *where)
    if (remote_src or op.remote_writes) and op.channel_type not in ("memory", "port"):
        out.add("operand", f"{op.name} addresses a peer buffer: channel_type must be memory or port", *where)
    remote_dsts = sum(o.buffer_id is not None for o in op.dst)
    if op.channel_type == "port" and op.name in ("put", "pws", "pwsf", "ppkt", "rppkt") and len(op.channel_ids) != remote_dsts:
        out.add("channel-declaration", f"a port {op.name} drives one channel per destination: {remote_dsts} destination(s), "
                f"{len(op.channel_ids)} channel id(s)", *where)
    if op.channel_type == "port" and op.name in ("put", "pws", "pwsf") and any(o.buffer != "s" for o in op.src):
        out.add("port-source", "a port put must read scratch: its source offset omits the in-allocation offset", *where)
    if op.name == "get" and (op.src[0].index != op.dst[0].index or op.dst[0].buffer != "s"):
        out.add("operand", "get swaps its offsets in the kernel: only scratch to scratch at the same index is correct", *where)
    for k, o in enumerate(op.src):
        _operand(plan, g, tb, op, o, packet_operand(op.name, True, k), where, out)
    for k, o in enumerate(op.dst):
        _operand(plan, g, tb, op, o, packet_operand(op.name, False, k), where, out)


def _operand(plan: ExecutionPlan, g: GpuPlan, tb: Threadblock, op: Op, o: Operand, packet_side: bool, where: tuple,
             out: Collector) -> None:
    if o.buffer is not None:
        if o.buffer not in BUFFER_TYPES:
            out.add("operand", f"buffer type {o.buffer!r}: expected i, o or s", *where)
            return
        size = _chunks(plan, g, o.buffer, packet_side)
    elif o.buffer_id is not None:
        refs = tb.buffer_list(op.channel_type)
        if not 0 <= o.buffer_id < len(refs) or not 0 <= refs[o.buffer_id] < len(g.remote_buffers):
            out.add("buffer-declaration", f"buffer_id {o.buffer_id} is not in the threadblock's {op.channel_type} list", *where)
            return
        buf = g.remote_buffers[refs[o.buffer_id]]
        if not 0 <= buf.rank < plan.ngpus or buf.type not in BUFFER_TYPES:
            return
        size = _chunks(plan, plan.gpus[buf.rank], buf.type, packet_side)
        if packet_side and buf.type != "s":
            out.add("packet-scratch", "packets live only in scratch", *where)
    else:
        out.add("operand", "an operand needs type, buffer_id or switch_channel_id", *where)
        return
    if packet_side and o.buffer not in (None, "s"):
        out.add("packet-scratch", "packets live only in scratch", *where)
    if o.index < 0 or o.size < 1 or o.end > size:
        out.add("operand-bounds", f"chunks [{o.index}, {o.end}) of a buffer of {size} chunks", *where)


def _chunks(plan: ExecutionPlan, g: GpuPlan, buf: str, packet: bool) -> int:
    if buf == "i":
        return g.input_chunks
    if buf == "o":
        return g.output_chunks
    # plain operands index C-sized chunks of the scratch; packets take 2C each; LL doubles it
    return g.scratch_chunks * (2 if plan.packets else 1) // (2 if packet else 1)


def _pairing(plan: ExecutionPlan, out: Collector) -> None:
    """The t-th channel A->B pairs with the t-th B->A: counts must agree per pair and type."""
    counts = {}
    for g in plan.gpus:
        for t in ("memory", "port"):
            for p, n in Counter(g.peers(t)).items():
                counts[(g.id, p, t)] = n
    for (a, b, t), n in sorted(counts.items()):
        m = counts.get((b, a, t), 0)
        if a < b and n != m or (a > b and m == 0):
            out.add("channel-pairing", f"rank {a} declares {n} {t} channel(s) to rank {b}, which declares {m} back", a)


def _switch_op(plan: ExecutionPlan, g: GpuPlan, tb: Threadblock, op: Op, where: tuple, out: Collector) -> None:
    """glres: one switch source and one switch destination; gstore: a local source and a
    switch destination (mscclpp.md 4). Every member's buffer must hold the chunks."""
    if op.channel_type != "switch":
        out.add("operand", f"{op.name} needs channel_type switch, got {op.channel_type!r}", *where)
    if op.tbg is not None:
        out.add("unsupported", "tbg_info: thread-block groups are not modelled by this verifier", *where)
    if len(op.src) != 1 or len(op.dst) != 1:
        out.add("operand", f"{op.name} takes one source and one destination", *where)
        return
    (src,), (dst,) = op.src, op.dst
    if op.name == "glres" and src.switch_channel_id is None or op.name == "gstore" and not src.local:
        out.add("operand", f"{op.name}'s source must be {'a switch channel' if op.name == 'glres' else 'a local buffer'}",
                *where)
        return
    if dst.switch_channel_id is None:
        out.add("operand", f"{op.name}'s destination must be a switch channel", *where)
        return
    if src.size != dst.size or src.size < 1:
        out.add("operand", f"{op.name} operands of sizes {src.size} and {dst.size}: expected one positive size", *where)
    if src.local:
        _operand(plan, g, tb, op, src, False, where, out)
    table, channels = g.switch_groups(), tb.channel_list("switch")
    for o in (src, dst):
        if o.switch_channel_id is None:
            continue
        if not 0 <= o.switch_channel_id < len(channels) or not 0 <= channels[o.switch_channel_id] < len(table):
            out.add("channel-declaration", f"switch channel {o.switch_channel_id} is not in the threadblock's list", *where)
            continue
        buffer, ranks = table[channels[o.switch_channel_id]]
        for m in ranks:
            if 0 <= m < plan.ngpus and buffer in BUFFER_TYPES:
                size = _chunks(plan, plan.gpus[m], buffer, False)
                if o.index < 0 or o.end > size:
                    out.add("operand-bounds", f"chunks [{o.index}, {o.end}) of rank {m}'s {buffer} buffer of {size} chunks",
                            *where)
                    break


def _switch_groups(plan: ExecutionPlan, out: Collector) -> None:
    """Each switch channel binds a multicast group collectively (connectNvlsCollective): every
    rank is in each group it declares, and any two members declare the groups they share
    alike and in the same order, or the setup throws or hangs (mscclpp.md 3.1)."""
    shared: dict[tuple[int, int], list] = {}
    for g in plan.gpus:
        for buffer, ranks in g.switch_groups():
            if buffer not in BUFFER_TYPES:
                out.add("channel-declaration", f"switch channel buffer_type {buffer!r}: expected i, o or s", g.id)
            if g.id not in ranks or len(set(ranks)) != len(ranks) or not all(0 <= m < plan.ngpus for m in ranks):
                out.add("switch-group", f"switch channel over ranks {list(ranks)}: expected distinct ranks of the plan, "
                        "this one among them", g.id)
                continue
            if plan.collective == "allgather" and plan.inplace and buffer == "i" and len(ranks) > 1:
                out.add("buffer-declaration", "an in-place all-gather must never address a peer's input (mscclpp.md 8.6)",
                        g.id)
            for m in ranks:
                shared.setdefault((g.id, m), []).append((buffer, tuple(sorted(ranks))))
    for a, b in sorted({(min(k), max(k)) for k in shared if k[0] != k[1]}):
        if shared.get((a, b)) != shared.get((b, a)):
            out.add("switch-group", f"ranks {a} and {b} declare the switch channels they share differently or in another "
                    "order; the multicast setup is collective over each group", a)
