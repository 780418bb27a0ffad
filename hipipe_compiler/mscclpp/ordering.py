"""What a program's own order already guarantees about its receive slots: the steps of every
rank as one graph (each threadblock in order, dependencies, and each send before the receive
of its message), from which the handshakes between launches and the credits within one
follow only where that order does not already keep a slot's writer behind its reader."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ..errors import PlanError
from ..msccl.program import Program, Step

Conn = tuple[int, int, int]  # (channel, sender, receiver) of the MSCCL program
#: Steps a search for an order between two steps visits before it gives up and keeps the credit.
SEARCH_LIMIT = 4096


def real_steps(steps: tuple[Step, ...]) -> list[tuple[int, Step, list[tuple[int, int]]]]:
    """(position, step, dependencies) of each real step; a nop's dependency joins the next real step's."""
    out, pending = [], []
    for pos, st in enumerate(steps):
        if st.depid >= 0:
            pending.append((st.depid, st.deps))
        if st.type != "nop":
            out.append((pos, st, pending))
            pending = []
    return out


@dataclass(frozen=True)
class StepGraph:
    """Every real step as a node: `edges[a]` are the steps that start only after step a is done
    (a receive's step completes after its message's send). `sent` and `received` list each
    connection's sending and receiving steps in order; `order` is a topological order of the
    steps and `index` each step's place in it."""

    keys: tuple[tuple[int, int, int], ...]  # per node: (rank, threadblock, position)
    edges: tuple[tuple[int, ...], ...]
    sent: dict[Conn, list[int]]
    received: dict[Conn, list[int]]
    order: tuple[int, ...]
    index: tuple[int, ...]

    def precedes(self, a: int, b: int) -> bool:
        """Whether step b starts after step a is done, by the program's own order. A search
        that would pass SEARCH_LIMIT steps answers no, which only costs a credit kept."""
        stack, seen, end = [a], {a}, self.index[b]
        while stack:
            for node in self.edges[stack.pop()]:
                if node == b:
                    return True
                if node not in seen and self.index[node] < end:
                    if len(seen) > SEARCH_LIMIT:
                        return False
                    seen.add(node)
                    stack.append(node)
        return False


def step_graph(program: Program) -> StepGraph:
    """The program's steps and the order between them; PlanError if they wait in a cycle."""
    nodes: dict[tuple[int, int, int], int] = {}
    edges: list[list[int]] = []
    sent: dict[Conn, list[int]] = defaultdict(list)
    received: dict[Conn, list[int]] = defaultdict(list)
    for gpu in program.gpus:
        for tb in gpu.threadblocks:
            previous = None
            for pos, st, _ in real_steps(tb.steps):
                node = nodes[(gpu.id, tb.id, pos)] = len(edges)
                edges.append([])
                if previous is not None:
                    edges[previous].append(node)
                previous = node
                if st.sends:
                    sent[(tb.chan, gpu.id, tb.send)].append(node)
                if st.receives:
                    received[(tb.chan, tb.recv, gpu.id)].append(node)
    for gpu in program.gpus:
        for tb in gpu.threadblocks:
            for pos, _st, deps in real_steps(tb.steps):
                for depid, dep in set(deps):
                    if depid != tb.id:
                        edges[nodes[(gpu.id, depid, dep)]].append(nodes[(gpu.id, tb.id, pos)])
    for conn, senders in sent.items():
        for a, b in zip(senders, received.get(conn, ())):
            edges[a].append(b)
    order = _topological(edges)
    index = [0] * len(edges)
    for i, node in enumerate(order):
        index[node] = i
    return StepGraph(tuple(nodes), tuple(map(tuple, edges)), dict(sent), dict(received), tuple(order), tuple(index))


def handshake_connections(program: Program, pool: int | None = None, graph: StepGraph | None = None
                          ) -> frozenset[Conn]:
    """The connections of a Simple plan that close with a handshake (the receiver signals once
    it has read all its slots, the sender waits for that), so that the sender's next launch
    writes only into slots that were read. The others need none, since each of their slots
    is safe by the collective's own dependencies: either its receive happens before some step
    of the sender, whose kernel, and so its next launch, then cannot start before the read;
    or its send happens after some step of the receiver, so that in the next launch it again
    follows the receiver's next kernel start (the verifier's slot-reuse rule proves both).
    With a `pool` of slots per connection, what must be ordered is each slot's first write
    after its last read (the credits order the writes in between). `graph`: the program's, if
    the caller has it."""
    graph = graph or step_graph(program)
    rank_of = [key[0] for key in graph.keys]
    after = [1 << r for r in rank_of]  # the ranks with a step after each step
    before = list(after)  # the ranks with a step before it
    for node in graph.order:
        for nxt in graph.edges[node]:
            before[nxt] |= before[node]
    for node in reversed(graph.order):
        for nxt in graph.edges[node]:
            after[node] |= after[nxt]
    return frozenset(conn for conn, reads in graph.received.items() if not all(
        after[read] >> conn[1] & 1 or before[write] >> conn[2] & 1
        for write, read in _reuses(graph.sent[conn], reads, pool)))


def needless_credits(graph: StepGraph, pool: int) -> frozenset[tuple[int, int, int]]:
    """The receives (rank, threadblock, position) of a pooled connection whose slot's earlier
    occupant is read before the sender can write it again anyway: the sender's write follows
    the reader's step by the program's own order (as where two ranks exchange both ways and
    each sends its next chunk only after receiving the other's), so no credit is needed."""
    return frozenset(graph.keys[reads[k]] for conn, reads in graph.received.items()
                     for k in range(pool, min(len(reads), len(graph.sent.get(conn, ()))))
                     if graph.precedes(reads[k - pool], graph.sent[conn][k]))


def _reuses(writes: list[int], reads: list[int], pool: int | None) -> list[tuple[int, int]]:
    """(first write, last read) of each slot of a connection: every receive's own, or each of
    `pool` slots that take the receives in turn."""
    if pool is None:
        return list(zip(writes, reads))
    return [(writes[i], reads[i + (len(reads) - 1 - i) // pool * pool]) for i in range(min(pool, len(reads), len(writes)))]


def _topological(edges: list[list[int]]) -> list[int]:
    """The steps in an order where every edge goes forward (the program verifies deadlock-free)."""
    indegree = [0] * len(edges)
    for outs in edges:
        for node in outs:
            indegree[node] += 1
    ready = [node for node, d in enumerate(indegree) if d == 0]
    order = []
    while ready:
        node = ready.pop()
        order.append(node)
        for nxt in edges[node]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    if len(order) != len(edges):
        raise PlanError("the program's steps wait on each other in a cycle")
    return order
