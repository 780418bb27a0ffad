"""Execution with the runtime's bounded connection FIFOs at the worst size of the window
(msccl-runtime.md section 9): deadlock freedom, reporting the cycle of waiting steps. On the
way every step gets a level, one more than the steps it follows; `step_table` hands the
steps and their levels to the symbolic execution and the race check."""

from __future__ import annotations

import heapq
import math
from array import array
from collections import defaultdict, deque
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np

from ..program import RECEIVING_TYPES, SENDING_TYPES, Program, Step, Threadblock
from ..runtime import FIFO_MESSAGES, MAX_COUNT, MAX_ITERATIONS, iterations, max_allowed_count
from .report import Collector, VerifyOptions
from .table import BUF_INDEX, TYPE_INDEX, StepTable


@dataclass
class _TbState:
    rank: int
    tb: Threadblock
    col: int  # the threadblock's index on its rank
    me: int  # index into Execution.states
    reals: list[int]  # positions of real steps
    # per position: index into reals of the step whose completion a wait for that position
    # waits for (the first real step at or after it; the last one, for trailing nops; -1: none)
    done_by: list[int]
    # per real step: (position, receives, sends, messages, dependencies as (state index, position))
    plan: list[tuple[int, bool, bool, int, tuple[tuple[int, int], ...]]]
    conn_in: int = -1  # index of the connection it receives on
    conn_out: int = -1  # and sends on
    index: int = 0  # into reals
    unit: int = 0  # messages of the current step done
    iteration: int = 0
    done: bool = False
    waiting: tuple[int, int, int] | None = None
    level: int = -1  # level of the step started last
    levels: list[int] = field(default_factory=list)  # per real step: its level in iteration 0 (-1: not started)
    # per receiving real step of iteration 0: (state index, real step index) of the send it took
    received_from: dict[int, tuple[int, int]] = field(default_factory=dict)

    def started(self) -> int:
        """How many real steps of the first iteration have started (all, once it is over)."""
        return len(self.reals) if self.iteration else self.index + (self.unit > 0)


def _done_by(nsteps: int, reals: list[int]) -> list[int]:
    """Per position of a threadblock of nsteps steps with real steps at `reals`: the index
    into reals of the step whose completion satisfies a wait for that position. Progress is
    published by real steps, so a wait for a nop ends with the first real step after it."""
    out = [len(reals) - 1] * nsteps  # past the last real step: the iteration's end
    for i in range(len(reals) - 1, -1, -1):
        for pos in range(reals[i - 1] + 1 if i else 0, reals[i] + 1):
            out[pos] = i
    return out


class Execution:
    """Runs the program against bounded connection FIFOs and dependency flags.

    FIFOs are counted in messages (a step of cnt chunks is several messages at large sizes)
    and progress is batched: a threadblock moves as many messages of its current step as
    the FIFOs allow. On the way it gives every step of the first iteration a level, one more
    than the levels of the steps it follows (in its threadblock, through dependencies and
    through the message it receives): steps of one level are unordered, so the semantics and
    the race check can take each level in one vectorised step. Threadblocks and connections
    are numbered, so the inner loop works on lists.
    """

    def __init__(self, p: Program, capacity: int, messages: dict[int, int], loops: int) -> None:
        self.capacity = capacity
        self.iterations = loops
        keys = [(g.id, tb.id) for g in p.gpus for tb in g.threadblocks]
        number = {key: i for i, key in enumerate(keys)}
        conns: dict[tuple[int, int, int], int] = {}
        self.states: list[_TbState] = []
        for g in p.gpus:
            for col, tb in enumerate(g.threadblocks):
                reals, pending, plan = [], [], []
                for pos, st in enumerate(tb.steps):
                    if st.depid >= 0:
                        pending.append((st.depid, st.deps))
                    if st.type != "nop":
                        reals.append(pos)
                        waits = tuple((number[(g.id, d)], q) for d, q in pending if (g.id, d) in number) if pending else ()
                        units = 1 if st.type in ("cpy", "re") else messages[st.cnt]
                        plan.append((pos, st.type in RECEIVING_TYPES, st.type in SENDING_TYPES, units, waits))
                        if pending:
                            pending = []
                state = _TbState(g.id, tb, col, len(self.states), reals, _done_by(len(tb.steps), reals), plan,
                                 levels=[-1] * len(reals))
                if tb.recv >= 0:
                    state.conn_in = conns.setdefault((tb.chan, tb.recv, g.id), len(conns))
                if tb.send >= 0:
                    state.conn_out = conns.setdefault((tb.chan, g.id, tb.send), len(conns))
                self.states.append(state)
        self.tbs: dict[tuple[int, int], _TbState] = dict(zip(keys, self.states))
        self.count = [0] * len(conns)  # messages in each FIFO
        # per connection, its first iteration's sends not yet taken: (level, state, real step index)
        self.sent: list[deque] = [deque() for _ in conns]
        self.sender = [-1] * len(conns)
        self.receiver = [-1] * len(conns)
        for st in self.states:
            if st.conn_out >= 0:
                self.sender[st.conn_out] = st.me
            if st.conn_in >= 0:
                self.receiver[st.conn_in] = st.me
        # dependency flags: the iteration and last completed position of each threadblock
        self.done_iteration = [0] * len(self.states)
        self.done_pos = [-1] * len(self.states)
        # per threadblock: heap of (iteration, position, waiter) that wait for it to get there
        self.waiters: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
        # per connection: its receiver waits for a message, its sender for room (woken only then)
        self.recv_blocked = [False] * len(conns)
        self.send_blocked = [False] * len(conns)

    def step(self, st: _TbState) -> Step:
        return st.tb.steps[st.reals[st.index]]

    def unmet(self, st: _TbState) -> list[int]:
        """The threadblocks whose progress the current step still waits for."""
        return [t for t, q in st.plan[st.index][4] if self.done_iteration[t] < st.iteration
                or (self.done_iteration[t] == st.iteration and self.done_pos[t] < q)]

    def deps_met(self, st: _TbState, register: bool = False) -> bool:
        done_iteration, done_pos, iteration = self.done_iteration, self.done_pos, st.iteration
        for t, q in st.plan[st.index][4]:
            it = done_iteration[t]
            if it < iteration or (it == iteration and done_pos[t] < q):
                if register:
                    heapq.heappush(self.waiters[t], (iteration, q, st.me))
                return False
        return True

    def rendezvous_ok(self, st: _TbState, depth: int = 0) -> bool:
        """With no room left, a message can still go if its receiver is waiting for it now
        (and, for a fused receiver, can pass it on in turn)."""
        conn = st.conn_out
        if depth > 64 or self.count[conn]:
            return False
        r = self.receiver[conn]
        if r < 0:
            return False
        rs = self.states[r]
        if rs.done or (rs.unit == 0 and not self.deps_met(rs)):
            return False
        _pos, receives, sends, _units, _waits = rs.plan[rs.index]
        if not receives:
            return False
        if sends:
            return self.count[rs.conn_out] < self.capacity or self.rendezvous_ok(rs, depth + 1)
        return True

    def run(self) -> list[tuple[int, int]]:
        """Run to completion or to a stop; return the threadblocks left unfinished."""
        states = self.states
        # a stack: a threadblock just woken runs next, while what it waits for is fresh in memory
        stack = sorted(range(len(states)), key=lambda i: (states[i].rank, states[i].tb.id), reverse=True)
        queued = bytearray(b"\x01") * len(states)
        woken: list[int] = []
        while stack:
            i = stack.pop()
            queued[i] = 0
            self.advance(states[i], woken)
            for w in woken:
                if not queued[w]:
                    queued[w] = 1
                    stack.append(w)
            woken.clear()
        return [(st.rank, st.tb.id) for st in states if not st.done]

    def advance(self, st: _TbState, woken: list[int]) -> None:
        """Move a threadblock as far as it can go now; the threadblocks it unblocks go to `woken`."""
        count, capacity = self.count, self.capacity
        recv_blocked, send_blocked = self.recv_blocked, self.send_blocked
        plan, me = st.plan, st.me
        while not st.done:
            if not st.reals:
                self.finish_iteration(st, woken)
                continue
            pos, receives, sends, total, waits = plan[st.index]
            if waits and st.unit == 0 and not self.deps_met(st, register=True):
                return
            k = total - st.unit
            if receives:
                conn_in = st.conn_in
                k = min(k, count[conn_in])
                if k == 0:
                    recv_blocked[conn_in] = True
                    if capacity == 0 and st.waiting != (marker := (st.iteration, st.index, st.unit)):
                        st.waiting = marker  # a rendezvous sender may hand over now: let it retry once
                        woken.append(self.sender[conn_in])
                    return
            if sends:
                conn_out = st.conn_out
                room = capacity - count[conn_out]
                if room <= 0 and self.rendezvous_ok(st):
                    room = 1
                k = min(k, room)
                if k <= 0:
                    send_blocked[conn_out] = True
                    return
            if st.unit == 0 and st.iteration == 0:
                # both ends of a connection take part in the first iteration only: they stay in step
                level = st.level
                if receives:
                    sent_level, sender, index = self.sent[conn_in].popleft()
                    st.received_from[st.index] = (sender, index)
                    level = max(level, sent_level)
                for t, q in waits:
                    target = self.states[t]
                    if 0 <= q < len(target.done_by) and target.done_by[q] >= 0:
                        level = max(level, target.levels[target.done_by[q]])
                st.level = st.levels[st.index] = level + 1
                if sends:
                    self.sent[conn_out].append((st.level, me, st.index))
            if receives:
                count[conn_in] -= k
                if send_blocked[conn_in]:
                    send_blocked[conn_in] = False
                    woken.append(self.sender[conn_in])
            if sends:
                count[conn_out] += k
                if recv_blocked[conn_out]:
                    recv_blocked[conn_out] = False
                    woken.append(self.receiver[conn_out])
            st.unit += k
            if st.unit >= total:
                st.unit = 0
                self.done_iteration[me], self.done_pos[me] = st.iteration, pos
                if self.waiters.get(me):
                    self.release(me, woken)
                st.index += 1
                if st.index >= len(st.reals):
                    self.finish_iteration(st, woken)

    def finish_iteration(self, st: _TbState, woken: list[int]) -> None:
        st.iteration += 1
        st.index = 0
        if st.reals:
            self.done_iteration[st.me], self.done_pos[st.me] = st.iteration - 1, st.reals[-1]
        if st.iteration >= self.iterations:
            st.done = True
            self.done_iteration[st.me], self.done_pos[st.me] = self.iterations, -1
        self.release(st.me, woken)

    def release(self, t: int, woken: list[int]) -> None:
        """Wake the threadblocks whose wait for threadblock t is now over."""
        heap = self.waiters.get(t)
        if not heap:
            return
        it, pos = self.done_iteration[t], self.done_pos[t]
        while heap and (heap[0][0] < it or (heap[0][0] == it and heap[0][1] <= pos)):
            woken.append(heapq.heappop(heap)[2])

    # -- deadlock report
    def waiting_for(self, key: tuple[int, int]) -> tuple[str, list[tuple[int, int]]]:
        st = self.tbs[key]
        step = self.step(st)
        pos = st.reals[st.index]
        if st.unit == 0 and not self.deps_met(st):
            targets = [(self.states[t].rank, self.states[t].tb.id) for t in self.unmet(st)]
            return f"step {pos} ({step.type}) waits for its dependencies", targets
        if step.type in RECEIVING_TYPES and not self.count[st.conn_in]:
            s = self.sender[st.conn_in]
            return (f"step {pos} ({step.type}) waits to receive from rank {st.tb.recv} on channel {st.tb.chan}",
                    [(self.states[s].rank, self.states[s].tb.id)] if s >= 0 else [])
        r = self.receiver[st.conn_out]
        return (f"step {pos} ({step.type}) waits for room to send to rank {st.tb.send} on channel {st.tb.chan}",
                [(self.states[r].rank, self.states[r].tb.id)] if r >= 0 else [])


def _deadlock_report(ex: Execution, stuck: list[tuple[int, int]], out: Collector) -> None:
    graph: dict[tuple[int, int], list[tuple[int, int]]] = {}
    why: dict[tuple[int, int], str] = {}
    stuck_set = set(stuck)
    for key in stuck:
        text, targets = ex.waiting_for(key)
        why[key] = text
        graph[key] = [t for t in targets if t in stuck_set]
    cycle = _find_cycle(graph)
    if cycle:
        parts = [f"rank {r} tb {t} {why[(r, t)]}" for r, t in cycle]
        r0, t0 = cycle[0]
        st = ex.tbs[(r0, t0)]
        model = "when every send waits for its receive" if ex.capacity == 0 else "with bounded connection FIFOs"
        out.add("deadlock.cycle", f"{model} these steps wait for each other in a cycle: "
                + " -> ".join(parts) + " -> back to the first", r0, t0, st.reals[st.index])
        return
    key = min(stuck)
    st = ex.tbs[key]
    out.add("deadlock.starved", f"rank {key[0]} tb {key[1]} {why[key]}, which never happens "
            f"({len(stuck)} threadblock(s) cannot finish)", key[0], key[1], st.reals[st.index])


def _find_cycle(graph: dict) -> list | None:
    color: dict = {}
    for start in sorted(graph):
        if start in color:
            continue
        stack = [(start, iter(graph[start]))]
        path = [start]
        color[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                path.pop()
                color[node] = 2
                continue
            if color.get(nxt) == 1:
                return path[path.index(nxt):]
            if nxt not in color:
                color[nxt] = 1
                stack.append((nxt, iter(graph.get(nxt, []))))
                path.append(nxt)
    return None


def fifo_model(p: Program, nbytes: int | None = None, rendezvous: bool = False) -> tuple[int, int, int]:
    """(messages a connection holds, chunks per message, iterations) at a call of nbytes.

    The default size is the window's worst case, maxBytes (0 = unbounded: one chunk per
    message, and two iterations to catch threadblocks that run ahead).
    """
    size = p.max_bytes if nbytes is None else nbytes
    max_allowed = max_allowed_count(p.protocol, size, p.nchunksperloop)
    loops = iterations(p.protocol, size, p.nchunksperloop) if size > 0 else 2
    capacity = 0 if rendezvous else FIFO_MESSAGES[p.protocol]
    return capacity, max_allowed, loops


def execute(p: Program, opts: VerifyOptions, out: Collector) -> tuple[bool, Execution]:
    capacity, max_allowed, loops = fifo_model(p, opts.nbytes, opts.rendezvous)
    if loops > MAX_ITERATIONS:
        out.add("limits.iterations", f"{loops} loop iterations at {opts.nbytes or p.max_bytes} bytes; the flag encoding allows {MAX_ITERATIONS}")
    messages = {c: max(1, math.ceil(c / max_allowed)) for c in range(0, MAX_COUNT + 1)}
    ex = Execution(p, capacity, messages, min(loops, 2))
    stuck = ex.run()
    if stuck:
        _deadlock_report(ex, stuck, out)
        return False, ex
    return True, ex


def step_table(p: Program, ex: Execution) -> StepTable:
    # typed arrays: a Python list of ints would hold tens of bytes per step and column
    cols: dict[str, array] = {name: array("q") for name in ("rank", "tid", "col", "pos", "level", "kind", "srcbuf",
                                                             "srcoff", "dstbuf", "dstoff", "cnt", "prev")}
    dep_row: list[int] = []
    dep_target: list[int] = []
    base = list(accumulate((st.started() for st in ex.states), initial=0))  # first row of each state
    rank_rows = []
    i = 0  # states come rank by rank, in the program's order
    for g in p.gpus:
        ntb = len(g.threadblocks)
        rank_rows.append((base[i], base[i + ntb], ntb))
        i += ntb
    send_of = np.full(base[-1], -1, dtype=np.int64)
    for st in ex.states:
        tb = st.tb
        reals = st.reals[:st.started()]
        steps = [tb.steps[pos] for pos in reals]
        m, b = len(steps), base[st.me]
        cols["rank"].extend([st.rank] * m)
        cols["tid"].extend([tb.id] * m)
        cols["col"].extend([st.col] * m)
        cols["pos"].extend(reals)
        cols["level"].extend(st.levels[:m])
        cols["kind"].extend([TYPE_INDEX[s.type] for s in steps])
        cols["srcbuf"].extend([BUF_INDEX.get(s.srcbuf, 0) for s in steps])
        cols["srcoff"].extend([s.srcoff for s in steps])
        cols["dstbuf"].extend([BUF_INDEX.get(s.dstbuf, 0) for s in steps])
        cols["dstoff"].extend([s.dstoff for s in steps])
        cols["cnt"].extend([s.cnt for s in steps])
        cols["prev"].extend(array("q", range(b - 1, b + m - 1)))
        if m:
            cols["prev"][-m] = -1
        for i, step_plan in enumerate(st.plan[:m]):
            for t, q in step_plan[4]:
                target = ex.states[t]
                if target is not st and 0 <= q < len(target.done_by) and target.done_by[q] >= 0:
                    dep_row.append(b + i)
                    dep_target.append(base[t] + target.done_by[q])
        for i, (sender, index) in st.received_from.items():
            send_of[b + i] = base[sender] + index
    arrays = {name: np.frombuffer(values, dtype=np.int64) if len(values) else np.zeros(0, dtype=np.int64)
              for name, values in cols.items()}
    return StepTable(**arrays, dep_row=np.asarray(dep_row, dtype=np.int64), dep_target=np.asarray(dep_target, dtype=np.int64),
                  send_of=send_of, rank_rows=tuple(rank_rows), order=np.argsort(arrays["level"], kind="stable"))
