"""Semantics by symbolic execution, a level at a time in array operations: which rank's input
chunk sits where, every reduction of matching chunks counted once, and every output as the
collective defines it (msccl-runtime.md sections 7-8)."""

from __future__ import annotations

import numpy as np

from ..program import BUFFERS, Program
from .memory import Memory
from .report import Collector
from .table import BUF_INDEX, RE, READS, REDUCES, TAKES, WRITES, StepTable, level_bounds


SEMANTIC_COLLECTIVES = ("allreduce", "reducescatter", "allgather", "alltoall")


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64: deterministic pseudo-random 64-bit weights."""
    x = (x + np.uint64(0x9E3779B97F4A7C15)).astype(np.uint64)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class _Values:
    """Symbolic contents of every rank's buffers: per chunk an identity, a contribution count
    and a 64-bit sum of the contributors' random weights (exact up to a 2^-64 collision
    chance): one int64 row of three per `Memory` cell, so a chunk moves as one 24-byte
    copy (the sum wraps around as uint64 would)."""

    def __init__(self, p: Program, memory: Memory) -> None:
        self.p = p
        self.memory = memory
        self.logical = memory.logical
        n = p.ngpus
        self.per = memory.per
        ranks = np.arange(n, dtype=np.uint64)
        self.weight = _mix64(ranks * np.uint64(2654435761) + np.uint64(12345)).view(np.int64)
        self.cells = np.zeros((memory.size + 1, 3), dtype=np.int64)
        self.cells[:, 0] = -1
        size = self.logical["i"]
        for r in range(n):
            self.write(r, "i", 0, np.stack([self._input_ident(r, size), np.ones(size, dtype=np.int64),
                                            np.full(size, self.weight[r], dtype=np.int64)]))

    def _input_ident(self, r: int, size: int) -> np.ndarray:
        coll = self.p.collective
        idx = np.arange(size, dtype=np.int64)
        if coll in ("allreduce", "reducescatter", "reduce"):
            return idx  # contributions to chunk c are reduced together across ranks
        return r * size + idx  # (origin rank, chunk): the data itself moves

    def read(self, rank: int, buf: str, off: int, cnt: int) -> np.ndarray:
        """Rows (identity, count, weight sum) of cnt chunks from off."""
        at = int(self.memory.start[rank, BUF_INDEX[buf]]) + off
        return self.cells[at:at + cnt].T

    def write(self, rank: int, buf: str, off: int, value: np.ndarray) -> None:
        at = int(self.memory.start[rank, BUF_INDEX[buf]]) + off
        self.cells[at:at + value.shape[1]] = value.T

    def expected_output(self, rank: int) -> np.ndarray:
        coll, n = self.p.collective, self.p.ngpus
        size = self.logical["o"]
        idx = np.arange(size, dtype=np.int64)
        full = self.weight.sum(dtype=np.int64)  # wraps around like the sums it is compared with
        if coll == "allreduce":
            return np.stack([idx, np.full(size, n, dtype=np.int64), np.full(size, full, dtype=np.int64)])
        if coll == "reducescatter":
            return np.stack([rank * size + idx, np.full(size, n, dtype=np.int64), np.full(size, full, dtype=np.int64)])
        if coll == "allgather":
            origin = idx // self.per
            return np.stack([idx, np.ones(size, dtype=np.int64), self.weight[origin]])
        # alltoall: output block q (chunks q*per..) comes from rank q's input block for this rank
        per_peer = size // n
        origin = idx // per_peer
        src_chunk = rank * per_peer + idx % per_peer
        return np.stack([origin * size + src_chunk, np.ones(size, dtype=np.int64), self.weight[origin]])


def symbolic_execution(p: Program, t: StepTable, inplace: bool, out: Collector, budget: int) -> tuple[_Values, int]:
    """Symbolic execution of the first iteration in one mode (in place or out of place), one
    level at a time: each level's steps read, receive, reduce and write all their chunks in
    a few array operations. Steps of one level are unordered, so where they touch the same
    chunk they race (reported when the run completes). What a level sends is kept until the last level that
    receives it. Reports at most `budget` violations; returns the values and what is left."""
    memory = Memory(p, inplace)
    values = _Values(p, memory)
    cells = values.cells
    mode = "in place" if inplace else "out of place"
    nrows = len(t.level)
    order = t.order
    bounds = level_bounds(t.level[order])
    sizes = [b - a for a, b in bounds]
    level_of = np.empty(nrows, dtype=np.int64)  # row -> index into bounds
    level_of[order] = np.repeat(np.arange(len(bounds)), sizes)
    cnt = t.cnt[order]
    first = np.cumsum(cnt) - cnt
    within = np.empty(nrows, dtype=np.int64)  # row -> its first chunk's place in its level's arrays
    within[order] = first - np.repeat(first[[a for a, _b in bounds]], sizes)
    receivers = np.flatnonzero(t.send_of >= 0)
    last_use = np.full(len(bounds), -1, dtype=np.int64)  # the last level receiving what a level sends
    np.maximum.at(last_use, level_of[t.send_of[receivers]], level_of[receivers])
    src_of = np.where(READS[t.kind], memory.start[t.rank, t.srcbuf] + t.srcoff, memory.size)  # per row
    dst_of = np.where(WRITES[t.kind], memory.start[t.rank, t.dstbuf] + t.dstoff, memory.size)
    kept: dict[int, np.ndarray] = {}
    n = p.ngpus
    for li, (sa, sb) in enumerate(bounds):
        rows, c = order[sa:sb], cnt[sa:sb]
        row = np.repeat(rows, c)
        j = np.arange(int(c.sum()), dtype=np.int64) - np.repeat(first[sa:sb] - first[sa], c)
        kind = np.repeat(t.kind[rows], c)
        reads, writes, takes, reduces = READS[kind], WRITES[kind], TAKES[kind], REDUCES[kind]
        src = np.repeat(src_of[rows], c) + np.where(reads, j, 0)
        dst = np.repeat(dst_of[rows], c) + np.where(writes, j, 0)
        local = cells[src]
        result = local.copy()
        take_at = np.flatnonzero(takes)
        if len(take_at):
            sender = t.send_of[row[take_at]]
            from_level = level_of[sender]
            from_place = within[sender] + j[take_at]
            for lv in np.unique(from_level).tolist():
                sel = from_level == lv
                result[take_at[sel]] = kept[lv][from_place[sel]]
        found: list[tuple[int, int, str, str]] = []  # (element, check, rule, message)
        red_at = np.flatnonzero(reduces)
        if len(red_at):
            x = result[red_at]  # the received operand, or for `re` the destination's own value
            re_at = red_at[kind[red_at] == RE]
            if len(re_at):
                x[np.searchsorted(red_at, re_at)] = cells[dst[re_at]]
            y = local[red_at]
            total = x + y  # counts and weight sums add; identities must agree
            total[:, 0] = np.where(x[:, 0] < 0, y[:, 0], x[:, 0])
            result[red_at] = total
            if budget > 0:
                mismatch = np.flatnonzero((x[:, 0] != y[:, 0]) & (x[:, 0] >= 0) & (y[:, 0] >= 0))
                for k in _first_per_step(mismatch, row[red_at]):
                    e = int(red_at[k])
                    found.append((e, 1, "semantics.reduce-mismatch",
                                  f"reduces chunk identity {int(y[k, 0])} into {int(x[k, 0])} at "
                                  f"{BUFFERS[int(t.srcbuf[row[e]])]}[{int(t.srcoff[row[e]] + j[e])}]: the operands belong to different chunks"))
                for k in _first_per_step(np.flatnonzero(total[:, 1] > n), row[red_at]):
                    found.append((int(red_at[k]), 2, "semantics.duplicate", "a reduction counts some rank's contribution "
                                  f"twice ({int(total[k, 1])} contributions from {n} ranks)"))
        if budget > 0:
            for e in _first_per_step(np.flatnonzero(reads & (local[:, 0] < 0)), row):
                found.append((e, 0, "semantics.uninitialized-read", f"{mode}: reads "
                              f"{BUFFERS[int(t.srcbuf[row[e]])]}[{int(t.srcoff[row[e]] + j[e])}] before anything was written there"))
        for e, _check, rule, message in sorted(found, key=lambda f: (int(row[f[0]]), f[1])):
            if budget > 0:
                out.add(rule, message, *t.ref(int(row[e])))
            budget -= 1
        cells[dst] = result
        if last_use[li] > li:
            kept[li] = result
        for lv in [lv for lv in kept if last_use[lv] <= li]:
            del kept[lv]
    return values, budget


def _first_per_step(elements: np.ndarray, row: np.ndarray) -> list[int]:
    """Of the given (sorted) indices into `row`, the first of each step."""
    if not len(elements):
        return []
    rows = row[elements]
    keep = np.ones(len(elements), dtype=bool)
    keep[1:] = rows[1:] != rows[:-1]
    return elements[keep].tolist()


def check_results(p: Program, values: _Values, mode: str, out: Collector) -> None:
    errors = 0
    for rank in range(p.ngpus):
        got = values.read(rank, "o", 0, values.logical["o"])
        want = values.expected_output(rank)
        bad = (got != want).any(axis=0)
        if bad.any():
            j = int(np.argmax(bad))
            if got[0][j] < 0:
                detail = "was never written"
            elif got[0][j] != want[0][j]:
                detail = f"holds chunk identity {int(got[0][j])}, expected {int(want[0][j])}"
            elif got[1][j] != want[1][j]:
                detail = f"holds {int(got[1][j])} contribution(s), expected {int(want[1][j])}"
            else:
                detail = "holds the right number of contributions but from the wrong ranks"
            out.add("semantics.result", f"{mode}: output chunk {j} {detail} "
                    f"({int(bad.sum())} wrong chunk(s) on this rank)", rank)
            errors += 1
            if errors >= 10:
                return


def check_input_untouched(p: Program, t: StepTable, out: Collector) -> None:
    """Out of place, the send buffer is the caller's, read-only: no step may write it."""
    rows = np.flatnonzero(WRITES[t.kind] & (t.dstbuf == BUF_INDEX["i"]))
    seen: set[int] = set()
    for row in rows.tolist():
        rank, tb, pos = t.ref(row)
        if rank in seen:
            continue
        seen.add(rank)
        out.add("semantics.input-written", f"out of place: writes the send buffer i[{int(t.dstoff[row])}]; the caller's "
                "input is read-only (it may still be in use), so its data would be overwritten", rank, tb, pos)
        if len(seen) >= 10:
            return
