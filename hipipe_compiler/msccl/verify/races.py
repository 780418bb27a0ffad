"""Races: two threadblocks of a rank touching the same chunk, at least one writing, with no
order between them through dependencies or messages."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..program import Program, Threadblock
from .memory import Memory
from .report import Collector, StepRef
from .table import READS, WRITES, StepTable, level_bounds


#: The race check takes ranks in batches of at most this many vector clock entries and
#: chunk accesses (or one rank), to keep its arrays to tens of MiB.
_CLOCK_ENTRIES = 1 << 22


_BATCH_CHUNKS = 1 << 18


def check_races(p: Program, t: StepTable, conns: dict, inplace: bool, out: Collector) -> None:
    """Conflicting accesses from different threadblocks of a rank must be ordered.

    Each step gets a vector clock over its rank's threadblocks (the last step of each that
    happens before it through threadblock order and dependencies), computed a level at a
    time for a batch of ranks. Accesses to each chunk are taken in level order; every read
    must follow the last write, and every write the last write and the reads since (the
    usual last-writer check, linear in the number of accesses). Pairs left unordered are
    then searched for in the global order, which also runs through messages to other ranks
    and back.
    """
    memory = Memory(p, inplace)
    candidates: list[tuple[StepRef, StepRef, str, int]] = []
    touched = (READS[t.kind].astype(np.int64) + WRITES[t.kind]) * t.cnt  # chunks each step reads and writes
    ends = np.concatenate([[0], np.cumsum(touched)])
    groups: list[tuple[int, int]] = []  # row ranges of whole ranks whose accesses are checked together
    width = 0
    for first, end, ntbs in t.rank_rows:
        if groups and (end - groups[0][0]) * max(width, ntbs) > _CLOCK_ENTRIES:
            candidates += _unordered(t, memory, groups, width)
            groups, width = [], 0
        if groups and ends[end] - ends[groups[-1][0]] <= _BATCH_CHUNKS:
            groups[-1] = (groups[-1][0], end)
        else:
            groups.append((first, end))
        width = max(width, ntbs)
    if groups:
        candidates += _unordered(t, memory, groups, width)
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
    for checked, (a, b, rule, slot) in enumerate(candidates):
        if checked < 200 and _reaches(a, b, msg_next, dep_next, tb_len):
            continue
        r, buf, off = memory.locate(slot)
        out.add(rule, f"threadblocks {a[1]} (step {a[2]}) and {b[1]} (step {b[2]}) both touch {buf}[{off}], "
                f"{'both writing' if rule == 'race.write-write' else 'one writing what the other reads'}, "
                f"with no order between them through dependencies or messages{' (in place)' if inplace else ''}",
                a[0], b[1], b[2])


def _unordered(t: StepTable, memory: Memory, groups: list[tuple[int, int]], width: int) -> list[tuple[StepRef, StepRef, str, int]]:
    """Conflicting pairs of accesses among the rows of `groups` (consecutive row ranges of
    whole ranks) that the ranks' own order (threadblock order and dependencies) leaves
    unordered. Vector clocks are computed for all groups at once, a level at a time; the
    accesses one group at a time."""
    lo, hi = groups[0][0], groups[-1][1]
    n = hi - lo
    if n == 0:
        return []
    srt = np.argsort(t.level[lo:hi], kind="stable")  # a linear extension of each rank's order
    at = np.empty(n, dtype=np.int64)
    at[srt] = np.arange(n)  # row - lo -> its place in srt
    rows = srt + lo
    prev = t.prev[rows]
    prev = np.where(prev >= 0, at[np.maximum(prev - lo, 0)], n)  # n: the clock of no step
    inside = (t.dep_row >= lo) & (t.dep_row < hi)
    d_row = at[t.dep_row[inside] - lo]
    d_tgt = at[t.dep_target[inside] - lo]
    by = np.argsort(d_row, kind="stable")
    d_row, d_tgt = d_row[by], d_tgt[by]
    col, pos = t.col[rows], t.pos[rows]
    clock = np.full((n + 1, width), -1, dtype=np.int32)
    for a, b in level_bounds(t.level[rows]):
        acc = clock[prev[a:b]]
        da, db = np.searchsorted(d_row, (a, b))
        if db > da:
            np.maximum.at(acc, d_row[da:db] - a, clock[d_tgt[da:db]])
        acc[np.arange(b - a), col[a:b]] = pos[a:b]
        clock[a:b] = acc
    out: list[tuple[StepRef, StepRef, str, int]] = []
    for glo, ghi in groups:
        places = np.sort(at[glo - lo:ghi - lo])
        out += _conflicts(t, memory, rows, places, clock, col, pos)
    return out


def _conflicts(t: StepTable, memory: Memory, rows: np.ndarray, places: np.ndarray, clock: np.ndarray,
               col: np.ndarray, pos: np.ndarray) -> list[tuple[StepRef, StepRef, str, int]]:
    """The last-writer check over the accesses of the steps at `places` (in level order)."""
    sel = rows[places]
    kind, cnt, rank = t.kind[sel], t.cnt[sel], t.rank[sel]
    reads, writes = READS[kind], WRITES[kind]
    starts = np.concatenate([memory.start[rank, t.srcbuf[sel]] + t.srcoff[sel], memory.start[rank, t.dstbuf[sel]] + t.dstoff[sel]])
    used = np.concatenate([reads, writes])
    starts, counts = starts[used], np.concatenate([cnt, cnt])[used]
    steps = np.concatenate([places, places])[used]
    wr = np.concatenate([np.zeros(len(sel), dtype=bool), np.ones(len(sel), dtype=bool)])[used]
    if not len(starts):
        return []
    total = int(counts.sum())
    first = np.repeat(np.cumsum(counts) - counts, counts)
    slot = np.repeat(starts, counts) + (np.arange(total) - first)
    step = np.repeat(steps, counts)
    wr = np.repeat(wr, counts)
    srt2 = np.lexsort((~wr, step, slot))  # by cell, then order (a read before a write of one step)
    slot, step, wr = slot[srt2], step[srt2], wr[srt2]
    m = len(slot)
    idx = np.arange(m)
    new_group = np.ones(m, dtype=bool)
    new_group[1:] = slot[1:] != slot[:-1]
    group_start = np.maximum.accumulate(np.where(new_group, idx, 0))
    last_write = np.maximum.accumulate(np.where(wr, idx, -1))
    prev_write = np.full(m, -1, dtype=np.int64)
    prev_write[1:] = last_write[:-1]
    prev_write = np.where(prev_write >= group_start, prev_write, -1)
    # reads: against the last write; writes: against everything since the last write
    first_pair = np.where(wr, np.maximum(prev_write, group_start), prev_write)
    first_pair = np.where(~wr & (prev_write < 0), idx, first_pair)
    npairs = np.where(wr, idx - first_pair, np.where(prev_write >= 0, 1, 0))
    later = np.repeat(idx, npairs)
    offsets = np.arange(int(npairs.sum())) - np.repeat(np.cumsum(npairs) - npairs, npairs)
    earlier = np.repeat(first_pair, npairs) + offsets
    a_step, b_step = step[earlier], step[later]
    ordered = clock[b_step, col[a_step]] >= pos[a_step]
    bad = np.flatnonzero((col[a_step] != col[b_step]) & ~ordered)
    out: list[tuple[StepRef, StepRef, str, int]] = []
    seen: set[tuple[int, int]] = set()
    for k in bad.tolist():
        pair = (int(a_step[k]), int(b_step[k]))
        if pair in seen:
            continue
        seen.add(pair)
        rule = "race.write-write" if wr[earlier[k]] and wr[later[k]] else "race.read-write"
        out.append((t.ref(int(rows[pair[0]])), t.ref(int(rows[pair[1]])), rule, int(slot[later[k]])))
    return out


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
