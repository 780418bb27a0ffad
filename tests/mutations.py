"""Deliberately broken programs: each mutation breaks one rule in a known way.

Every mutation takes a program and a site index and returns the broken program, or None
when the program has no site of that kind. `EXPECTED` names the rule(s) the verifier must
report for each mutation.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import replace

from hipipe_compiler.msccl import Program, Step
from hipipe_compiler.msccl.program import RECEIVING_TYPES, SENDING_TYPES, buffer_chunks

#: What reading or writing the wrong chunk breaks.
WRONG_DATA = {"semantics.result", "semantics.reduce-mismatch", "semantics.duplicate", "semantics.uninitialized-read",
              "race.read-write", "race.write-write"}
EXPECTED = {
    "drop_message": {"connection.count"},
    "reduce_to_copy": {"semantics.result"},
    "wrong_chunk": {"semantics.reduce-mismatch"},
    "drop_dependency": {"race.read-write", "race.write-write"},
    # the reader now runs before the writer: a stale read, or accesses the dependency ordered
    # only transitively are left unordered, or the reversed edge closes a cycle
    "reorder_across_dependency": {"semantics.result", "semantics.uninitialized-read", "semantics.reduce-mismatch",
                                  "semantics.duplicate", "race.read-write", "race.write-write", "deadlock.cycle"},
    # doubling a partial sum is caught when the count exceeds the ranks, otherwise in the result;
    # a threadblock that waited for the original reduction now races with the inserted one
    "duplicate_reduction": {"semantics.duplicate", "semantics.result", "race.read-write", "race.write-write"},
    "break_cnt": {"connection.cnt"},
    # data lands or is read at the wrong place: a result misses it, a reduction mixes chunks,
    # a later read finds nothing, or the stray write collides with another threadblock's access
    "wrong_destination": WRONG_DATA,
    "wrong_send_source": WRONG_DATA,
    # two messages of one count on one connection change places: each lands where the other should
    "swap_messages": WRONG_DATA,
    "wrong_peer": {"connection.count", "tb.duplicate-connection", "tb.unused-peer", "deadlock.cycle", "deadlock.starved",
                   *WRONG_DATA},
    "wrong_channel": {"connection.count", "tb.duplicate-connection", "tb.channel", "deadlock.cycle", "deadlock.starved",
                      *WRONG_DATA},
    # waiting for an earlier step of the same threadblock than the one that wrote what it reads
    "weaken_dependency": {"race.read-write", "race.write-write", "dep.hasdep", "dep.nop-target", *WRONG_DATA},
    "write_input_out_of_place": {"semantics.input-written"},
}


def _sites(program: Program, pred) -> list[tuple[int, int, int]]:
    return [(gi, ti, pos) for gi, g in enumerate(program.gpus) for ti, tb in enumerate(g.threadblocks)
            for pos, st in enumerate(tb.steps) if pred(program, g, tb, pos, st)]


def _set_steps(program: Program, gi: int, ti: int, steps: list[Step]) -> Program:
    g = program.gpus[gi]
    tbs = list(g.threadblocks)
    tbs[ti] = replace(tbs[ti], steps=tuple(replace(st, s=i) for i, st in enumerate(steps)))
    gpus = list(program.gpus)
    gpus[gi] = replace(g, threadblocks=tuple(tbs))
    return replace(program, gpus=tuple(gpus))


def _shift_deps(program: Program, gi: int, tb_id: int, at: int, delta: int) -> Program:
    """Renumber dependencies of rank gi that point into threadblock tb_id at positions >= at."""
    g = program.gpus[gi]
    tbs = []
    for tb in g.threadblocks:
        steps = tuple(replace(st, deps=st.deps + delta) if st.depid == tb_id and st.deps >= at else st for st in tb.steps)
        tbs.append(replace(tb, steps=steps))
    gpus = list(program.gpus)
    gpus[gi] = replace(g, threadblocks=tuple(tbs))
    return replace(program, gpus=tuple(gpus))


def _delete(program: Program, gi: int, ti: int, pos: int) -> Program:
    tb = program.gpus[gi].threadblocks[ti]
    steps = list(tb.steps)
    del steps[pos]
    program = _set_steps(program, gi, ti, steps)
    return _shift_deps(program, gi, tb.id, pos + 1, -1)


def _insert(program: Program, gi: int, ti: int, pos: int, step: Step) -> Program:
    tb = program.gpus[gi].threadblocks[ti]
    program = _shift_deps(program, gi, tb.id, pos, +1)
    steps = list(program.gpus[gi].threadblocks[ti].steps)
    steps.insert(pos, step)
    return _set_steps(program, gi, ti, steps)


def _replace_step(program: Program, gi: int, ti: int, pos: int, **changes) -> Program:
    steps = list(program.gpus[gi].threadblocks[ti].steps)
    steps[pos] = replace(steps[pos], **changes)
    return _set_steps(program, gi, ti, steps)


def _pick(sites: list, index: int):
    return sites[index % len(sites)] if sites else None


# -- aliasing and accesses, written independently of the verifier ------------------------------


def slots(program: Program, rank: int, buf: str, off: int, cnt: int) -> set[tuple[str, int]]:
    """The memory a range really covers when the call is in place."""
    per = program.nchunksperloop // program.ngpus
    out = set()
    for c in range(off, off + cnt):
        if program.collective == "allreduce" and buf == "o":
            out.add(("i", c))
        elif program.collective == "allgather" and buf == "i":
            out.add(("o", rank * per + c))
        elif program.collective == "reducescatter" and buf == "o":
            out.add(("i", rank * per + c))
        else:
            out.add((buf, c))
    return out


def accesses(program: Program, rank: int, st: Step) -> tuple[set, set]:
    reads, writes = set(), set()
    if st.type in ("s", "rrs", "rrc", "rrcs", "cpy", "re"):
        reads = slots(program, rank, st.srcbuf, st.srcoff, st.cnt)
    if st.type in ("r", "rcs", "rrc", "rrcs", "cpy", "re"):
        writes = slots(program, rank, st.dstbuf, st.dstoff, st.cnt)
    return reads, writes


def reaches(program: Program, src: tuple[int, int, int], dst: tuple[int, int, int]) -> bool:
    """Whether step src (rank, tb id, pos) happens before dst through threadblock order,
    dependencies (with the nops before a step) and messages."""
    nxt: dict = defaultdict(list)
    sends: dict = defaultdict(list)
    recvs: dict = defaultdict(list)
    for g in program.gpus:
        for tb in g.threadblocks:
            pending = []
            for pos, st in enumerate(tb.steps):
                if pos + 1 < len(tb.steps):
                    nxt[(g.id, tb.id, pos)].append((g.id, tb.id, pos + 1))
                if st.depid >= 0:
                    pending.append((st.depid, st.deps))
                if st.type != "nop":
                    for d in pending:
                        nxt[(g.id, *d)].append((g.id, tb.id, pos))
                    pending = []
                if st.type in SENDING_TYPES:
                    sends[(tb.chan, g.id, tb.send)].append((g.id, tb.id, pos))
                if st.type in RECEIVING_TYPES:
                    recvs[(tb.chan, tb.recv, g.id)].append((g.id, tb.id, pos))
    for conn, ss in sends.items():
        for a, b in zip(ss, recvs.get(conn, [])):
            nxt[a].append(b)
    seen, todo = {src}, deque([src])
    while todo:
        node = todo.popleft()
        if node == dst:
            return True
        for m in nxt.get(node, ()):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return False


# -- the mutations -------------------------------------------------------------------------------


def drop_message(program: Program, index: int) -> Program | None:
    site = _pick(_sites(program, lambda p, g, tb, pos, st: st.type == "s" and not st.hasdep), index)
    return None if site is None else _delete(program, *site)


def reduce_to_copy(program: Program, index: int) -> Program | None:
    site = _pick(_sites(program, lambda p, g, tb, pos, st: st.type in ("rrc", "rrcs") and st.dstoff >= 0), index)
    if site is None:
        return None
    st = program.gpus[site[0]].threadblocks[site[1]].steps[site[2]]
    return _replace_step(program, *site, type="r" if st.type == "rrc" else "rcs", srcbuf="i", srcoff=-1)


def wrong_chunk(program: Program, index: int) -> Program | None:
    size = buffer_chunks(program.collective, program.ngpus, program.nchunksperloop)["i"]

    def ok(p, g, tb, pos, st):
        return st.type in ("rrc", "rrs", "rrcs") and st.srcbuf == "i" and (st.srcoff + st.cnt < size or st.srcoff > 0)
    site = _pick(_sites(program, ok), index)
    if site is None:
        return None
    st = program.gpus[site[0]].threadblocks[site[1]].steps[site[2]]
    off = st.srcoff + 1 if st.srcoff + st.cnt < size else st.srcoff - 1
    return _replace_step(program, *site, srcoff=off)


def _dependency_sites(program: Program) -> list[tuple[int, int, int, int, int]]:
    """(rank index, tb index, pos, target tb id, target pos) of dependencies that order a
    conflicting pair of accesses (one of them a write)."""
    out = []
    for gi, g in enumerate(program.gpus):
        by_id = {tb.id: tb for tb in g.threadblocks}
        for ti, tb in enumerate(g.threadblocks):
            for pos, st in enumerate(tb.steps):
                if st.depid < 0:
                    continue
                real = pos
                while real < len(tb.steps) and tb.steps[real].type == "nop":
                    real += 1
                if real >= len(tb.steps):
                    continue
                target = by_id[st.depid].steps[st.deps]
                tr, tw = accesses(program, g.id, target)
                xr, xw = accesses(program, g.id, tb.steps[real])
                if (tw & (xr | xw)) or (tr & xw):
                    out.append((gi, ti, pos, st.depid, st.deps))
    return out


def drop_dependency(program: Program, index: int) -> Program | None:
    sites = _dependency_sites(program)
    for k in range(len(sites)):
        gi, ti, pos, dep_tb, dep_pos = sites[(index + k) % len(sites)]
        tb = program.gpus[gi].threadblocks[ti]
        if tb.steps[pos].type == "nop":
            mutated = _delete(program, gi, ti, pos)
            real = pos
        else:
            if pos > 0 and tb.steps[pos - 1].type == "nop":
                continue  # the step must keep a dependency after a nop run
            mutated = _replace_step(program, gi, ti, pos, depid=-1, deps=-1)
            real = pos
        while mutated.gpus[gi].threadblocks[ti].steps[real].type == "nop":
            real += 1
        rank = program.gpus[gi].id
        if not reaches(mutated, (rank, dep_tb, dep_pos), (rank, tb.id, real)):
            return mutated
    return None


def reorder_across_dependency(program: Program, index: int) -> Program | None:
    """Reverse a dependency: the step that waited for a writer now runs first, and the writer waits for it."""
    sites = [s for s in _dependency_sites(program)]
    for k in range(len(sites)):
        gi, ti, pos, dep_tb, dep_pos = sites[(index + k) % len(sites)]
        g = program.gpus[gi]
        tb = g.threadblocks[ti]
        x = tb.steps[pos]
        if x.type == "nop" or (pos > 0 and tb.steps[pos - 1].type == "nop"):
            continue
        tidx = next(i for i, t in enumerate(g.threadblocks) if t.id == dep_tb)
        target_tb = g.threadblocks[tidx]
        t = target_tb.steps[dep_pos]
        if t.depid >= 0 or (dep_pos > 0 and target_tb.steps[dep_pos - 1].type == "nop"):
            continue
        tr, tw = accesses(program, g.id, t)
        xr, _xw = accesses(program, g.id, x)
        if not (tw & xr):
            continue  # only a read of what the writer writes becomes stale
        mutated = _replace_step(program, gi, ti, pos, depid=-1, deps=-1, hasdep=True)
        return _replace_step(mutated, gi, tidx, dep_pos, depid=tb.id, deps=pos)
    return None


def duplicate_reduction(program: Program, index: int) -> Program | None:
    site = _pick(_sites(program, lambda p, g, tb, pos, st: st.type in ("rrc", "rrcs") and st.dstoff >= 0), index)
    if site is None:
        return None
    st = program.gpus[site[0]].threadblocks[site[1]].steps[site[2]]
    again = Step(0, "re", st.dstbuf, st.dstoff, st.dstbuf, st.dstoff, st.cnt)
    return _insert(program, site[0], site[1], site[2] + 1, again)


def break_cnt(program: Program, index: int) -> Program | None:
    sizes = buffer_chunks(program.collective, program.ngpus, program.nchunksperloop)

    def ok(p, g, tb, pos, st):
        return st.type in ("r", "rrc") and st.cnt >= 2 or (st.type in ("r", "rrc") and st.dstoff + st.cnt < sizes.get(st.dstbuf, g.s_chunks))
    site = _pick(_sites(program, ok), index)
    if site is None:
        return None
    st = program.gpus[site[0]].threadblocks[site[1]].steps[site[2]]
    return _replace_step(program, *site, cnt=st.cnt - 1 if st.cnt >= 2 else st.cnt + 1)


def _moved(off: int, cnt: int, size: int) -> int | None:
    """Another offset for a range of cnt chunks inside a buffer of size chunks, or None."""
    if off + cnt < size:
        return off + 1
    return off - 1 if off > 0 else None


def wrong_destination(program: Program, index: int) -> Program | None:
    """A receive, reduction or copy writes one chunk off (in an all-gather: the data lands in another
    rank's block of the output)."""
    return _shifted(program, index, ("r", "rcs", "rrc", "rrcs", "cpy"), "dstbuf", "dstoff")


def wrong_send_source(program: Program, index: int) -> Program | None:
    """A send reads its data one chunk off."""
    return _shifted(program, index, ("s",), "srcbuf", "srcoff")


def _shifted(program: Program, index: int, types: tuple[str, ...], buf: str, off: str) -> Program | None:
    """The index-th step of these types with its `off` offset moved one chunk within its buffer."""
    sizes = buffer_chunks(program.collective, program.ngpus, program.nchunksperloop)

    def size_of(g, st) -> int:
        return g.s_chunks if getattr(st, buf) == "s" else sizes[getattr(st, buf)]

    def ok(p, g, tb, pos, st):
        return st.type in types and getattr(st, off) >= 0 and _moved(getattr(st, off), st.cnt, size_of(g, st)) is not None
    site = _pick(_sites(program, ok), index)
    if site is None:
        return None
    g = program.gpus[site[0]]
    st = g.threadblocks[site[1]].steps[site[2]]
    return _replace_step(program, *site, **{off: _moved(getattr(st, off), st.cnt, size_of(g, st))})


def swap_messages(program: Program, index: int) -> Program | None:
    """Two successive sends of one count on one threadblock swap their data (each keeps its
    own dependencies, so one may now also read before its data is ready)."""
    sites = []
    for gi, g in enumerate(program.gpus):
        for ti, tb in enumerate(g.threadblocks):
            sends = [pos for pos, st in enumerate(tb.steps) if st.type == "s"]
            for a, b in zip(sends, sends[1:]):
                x, y = tb.steps[a], tb.steps[b]
                if x.cnt == y.cnt and (x.srcbuf, x.srcoff) != (y.srcbuf, y.srcoff):
                    sites.append((gi, ti, a, b))
    if not sites:
        return None
    gi, ti, a, b = sites[index % len(sites)]
    x, y = program.gpus[gi].threadblocks[ti].steps[a], program.gpus[gi].threadblocks[ti].steps[b]
    mutated = _replace_step(program, gi, ti, a, srcbuf=y.srcbuf, srcoff=y.srcoff)
    return _replace_step(mutated, gi, ti, b, srcbuf=x.srcbuf, srcoff=x.srcoff)


def _replace_tb(program: Program, gi: int, ti: int, **changes) -> Program:
    g = program.gpus[gi]
    tbs = list(g.threadblocks)
    tbs[ti] = replace(tbs[ti], **changes)
    gpus = list(program.gpus)
    gpus[gi] = replace(g, threadblocks=tuple(tbs))
    return replace(program, gpus=tuple(gpus))


def wrong_peer(program: Program, index: int) -> Program | None:
    """A threadblock sends to (even index) or receives from (odd) another rank than the one
    that expects it."""
    side = "send" if index % 2 == 0 else "recv"
    tbs = [(gi, ti) for gi, g in enumerate(program.gpus) for ti, tb in enumerate(g.threadblocks) if getattr(tb, side) >= 0]
    if not tbs or program.ngpus < 3:
        return None
    gi, ti = tbs[index // 2 % len(tbs)]
    tb = program.gpus[gi].threadblocks[ti]
    others = [r for r in range(program.ngpus) if r not in (program.gpus[gi].id, getattr(tb, side))]
    return _replace_tb(program, gi, ti, **{side: others[index % len(others)]})


def wrong_channel(program: Program, index: int) -> Program | None:
    """A threadblock with peers moves to another channel than its peers use (past the last
    channel when there is only one)."""
    tbs = [(gi, ti) for gi, g in enumerate(program.gpus) for ti, tb in enumerate(g.threadblocks) if tb.send >= 0 or tb.recv >= 0]
    if not tbs:
        return None
    gi, ti = tbs[index % len(tbs)]
    tb = program.gpus[gi].threadblocks[ti]
    return _replace_tb(program, gi, ti, chan=(tb.chan + 1) % max(2, program.nchannels))


def weaken_dependency(program: Program, index: int) -> Program | None:
    """A dependency names an earlier step of its target threadblock than the one it needs
    (the wait is kept, but it no longer covers the access it orders)."""
    sites = [s for s in _dependency_sites(program) if s[4] > 0]
    for k in range(len(sites)):
        gi, ti, pos, dep_tb, dep_pos = sites[(index + k) % len(sites)]
        mutated = _replace_step(program, gi, ti, pos, deps=dep_pos - 1)
        real = pos
        steps = mutated.gpus[gi].threadblocks[ti].steps
        while steps[real].type == "nop":
            real += 1
        rank = program.gpus[gi].id
        if not reaches(mutated, (rank, dep_tb, dep_pos), (rank, program.gpus[gi].threadblocks[ti].id, real)):
            return mutated
    return None


def write_input_out_of_place(program: Program, index: int) -> Program | None:
    """Out of place, a step writes the caller's send buffer instead of the output buffer."""
    if not program.outofplace:
        return None
    sizes = buffer_chunks(program.collective, program.ngpus, program.nchunksperloop)
    site = _pick(_sites(program, lambda p, g, tb, pos, st: st.writes_dst and st.dstbuf == "o"
                        and 0 <= st.dstoff and st.dstoff + st.cnt <= sizes["i"]), index)
    return None if site is None else _replace_step(program, *site, dstbuf="i")


MUTATIONS = {
    "drop_message": drop_message, "reduce_to_copy": reduce_to_copy, "wrong_chunk": wrong_chunk,
    "drop_dependency": drop_dependency, "reorder_across_dependency": reorder_across_dependency,
    "duplicate_reduction": duplicate_reduction, "break_cnt": break_cnt, "wrong_destination": wrong_destination,
    "wrong_send_source": wrong_send_source, "swap_messages": swap_messages, "wrong_peer": wrong_peer,
    "wrong_channel": wrong_channel, "weaken_dependency": weaken_dependency,
    "write_input_out_of_place": write_input_out_of_place,
}
