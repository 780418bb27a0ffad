"""Structure: the rules the runtime's parser enforces and those it silently does not (gpus,
threadblock ids, peers, channels, connections, step numbering, dependencies and nops,
offsets and buffer bounds, limits), and per connection the agreement of its send and
receive sequences (msccl-runtime.md sections 3-12)."""

from __future__ import annotations

from collections import defaultdict

from ..program import (
    READING_TYPES, RECEIVING_TYPES, SENDING_TYPES, WRITING_TYPES, Gpu, Program, Threadblock, buffer_chunks,
)
from ..runtime import MAX_CHILDREN, MAX_COUNT, MAX_DEPID, MAX_NODES, MAX_OFFSET, MAX_STEPS, PER_CHANNEL_TBS
from .report import Collector, StepRef, VerifyOptions


def check_structure(p: Program, opts: VerifyOptions, out: Collector) -> bool:
    """Parser rules and the rules it does not check. Returns whether execution can be modelled."""
    runnable = True
    target = opts.target
    if not 1 <= p.nchannels <= opts.channel_limit:
        out.add("algo.channels", f"nchannels is {p.nchannels}; expected 1..{opts.channel_limit} ({target.name})")
    if len(p.gpus) > MAX_CHILDREN:
        out.add("limits.children", f"{len(p.gpus)} <gpu> elements: the runtime's reader keeps at most {MAX_CHILDREN} "
                "children per XML node in a fixed array it does not bound-check, so every rank's load writes past it "
                f"(memory corruption); at most {MAX_CHILDREN} ranks per file")
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
        if len(g.threadblocks) > opts.threadblock_limit:
            why = ("all threadblocks must be resident at once" if opts.threadblock_limit < target.max_threadblocks
                   else f"{target.name} refuses more, and it parses every file of the world size when a "
                   "communicator starts: one such file makes init fail")
            out.add("tb.count", f"{len(g.threadblocks)} threadblocks; the limit is {opts.threadblock_limit} ({why})",
                    rank=g.id)
        for tb in g.threadblocks:
            if len(tb.steps) > MAX_CHILDREN:
                out.add("limits.children", f"{len(tb.steps)} <step> elements in one <tb>: the runtime's reader keeps at most "
                        f"{MAX_CHILDREN} children per XML node and writes past its array beyond", g.id, tb.id)
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
                    consequence = (": the executor's loader skips a peer >= ngpus silently when it connects, so this "
                                   "threadblock's messages never arrive (a hang)" if peer >= p.ngpus else "")
                    out.add("tb.peer", f"{kind} peer {peer} must be another rank 0..{p.ngpus - 1} or -1{consequence}",
                            g.id, tb.id)
                    runnable = False
            if tb.chan >= target.max_channels:
                out.add("tb.channel", f"chan {tb.chan} is not below {target.name}'s channel count {target.max_channels}: its "
                        f"loader checks chan > {target.max_channels} where it needs >=, so chan {target.max_channels} "
                        "writes past its channel array", g.id, tb.id)
                runnable = False
            elif not 0 <= tb.chan < p.nchannels:
                out.add("tb.channel", f"chan {tb.chan} is outside 0..{p.nchannels - 1} (nchannels): the runtime sets up "
                        "no connection for it", g.id, tb.id)
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
           opts: VerifyOptions, out: Collector) -> None:
    if len(tb.steps) > opts.max_steps:
        out.add("tb.steps", f"{len(tb.steps)} steps; the runtime allows {opts.max_steps} per threadblock", g.id, tb.id)
    ndeps = 0
    pending_nop = False
    seen_s: set[int] = set()
    for pos, st in enumerate(tb.steps):
        if st.s in seen_s:
            out.add("step.index", f"s={st.s} repeats an earlier step's: the parser bounds s < {MAX_STEPS} but not the "
                    f"number of steps, which it stores at index s, so repeated values overrun its {MAX_STEPS}-entry step "
                    "array", g.id, tb.id, pos)
        elif st.s != pos:
            out.add("step.index", f"s={st.s} but the step is at position {pos}; the kernel numbers steps by position", g.id, tb.id, pos)
        seen_s.add(st.s)
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
                out.add("dep.target", f"depid {st.depid} names no threadblock of this rank; the parser does not check it, "
                        "so the step would wait on a flag that no threadblock raises", g.id, tb.id, pos)
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
        if not 1 <= st.cnt <= MAX_COUNT:
            out.add("step.cnt", f"cnt {st.cnt}; a real step moves 1..{MAX_COUNT} chunks", g.id, tb.id, pos)
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


def check_connections(p: Program, out: Collector) -> dict[tuple[int, int, int], tuple[list[StepRef], list[StepRef]]]:
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
