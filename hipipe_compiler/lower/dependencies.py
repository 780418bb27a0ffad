"""Pass 2 of lowering: which earlier operation each one must wait for, by the chunk slots it
reads and writes (input and output are aliased, so the program is correct in place and out
of place alike)."""

from __future__ import annotations

from typing import Callable

from ..schedule.plan import Plan
from .ops import Op


def slot_mapper(plan: Plan, rank: int) -> tuple[Callable[[str, int], int], Callable[[str, int], int]]:
    """(slot of a logical location, buffer offset of a logical location); scratch follows i/o."""
    nch = plan.nchunksperloop
    b = plan.units
    coll = plan.collective

    def slot(buf: str, y: int) -> int:
        return nch + y if buf == "s" else y

    if coll == "reducescatter":
        def offset(buf: str, y: int) -> int:
            return y - rank * b if buf == "o" else y
    elif coll == "allgather":
        def offset(buf: str, y: int) -> int:
            return y - rank * b if buf == "i" else y
    else:
        def offset(buf: str, y: int) -> int:
            return y
    return slot, offset


#: Op types that read their src operand, and those that write their dst operand.
_READS = frozenset(("s", "rrc", "cpy", "re"))


_WRITES = frozenset(("r", "rrc", "cpy", "re"))


def raw_dependencies(plan: Plan, ops: list[Op]) -> list[list[int]]:
    """For each op, the earlier ops (any role) it must wait for, by slot reads and writes.

    A read waits for the slots' last writers; a write also waits, per role, for the latest
    read of any of its slots since they were last written. Slots are tracked in runs that
    no op's range splits (every op covers a run whole or not at all, so all slots of a run
    share their history): an op then touches one or two runs, not dozens of slots.
    """
    reads, writes, bounds = _slot_ranges(plan, ops)
    run_of = {b: i for i, b in enumerate(sorted(bounds))}
    writer = [-1] * len(run_of)  # last op that wrote each run
    readers: list[dict[int, int] | None] = [None] * len(run_of)  # per run: role -> its last op reading it since
    deps: list[list[int]] = []
    for idx, op in enumerate(ops):
        found: set[int] = set()
        read, write = reads[idx], writes[idx]
        if read is not None:
            ra, rb = run_of[read[0]], run_of[read[1]]
            found.update(writer[ra:rb])
        if write is not None:
            wa, wb = run_of[write[0]], run_of[write[1]]
            found.update(writer[wa:wb])  # (re also reads its dst: the same writer)
            found.update(_latest_reads(readers[wa:wb]))
        found.discard(-1)
        if read is not None:
            role = op.role
            for a in range(ra, rb):
                seen = readers[a]
                if seen is None:
                    readers[a] = {role: idx}
                else:
                    seen[role] = idx
        if write is not None:
            writer[wa:wb] = [idx] * (wb - wa)
            readers[wa:wb] = [None] * (wb - wa)
        deps.append(sorted(found))
    return deps


def _slot_ranges(plan: Plan, ops: list[Op]) -> tuple[list[tuple[int, int] | None], list[tuple[int, int] | None], set[int]]:
    """Per op, the slots [a, b) it reads and writes (None: none), and every range's ends.

    The slot table holds i/o (one slot per chunk) and then scratch as far as any op uses
    it; slots past its end are ignored."""
    nch = plan.nchunksperloop
    nslots = nch + max((loc[1] + op.cnt for op in ops for loc in (op.src, op.dst) if loc is not None and loc[0] == "s"),
                       default=0)
    bounds = {0, nslots}

    def slots(loc: tuple[str, int], cnt: int) -> tuple[int, int] | None:
        a = nch + loc[1] if loc[0] == "s" else loc[1]
        b = min(a + cnt, nslots)
        if a >= b:
            return None
        bounds.add(a)
        bounds.add(b)
        return a, b

    reads = [slots(op.src, op.cnt) if op.type in _READS else None for op in ops]  # type: ignore[arg-type]
    writes = [slots(op.dst, op.cnt) if op.type in _WRITES else None for op in ops]  # type: ignore[arg-type]
    return reads, writes, bounds


def _latest_reads(readers: list[dict[int, int] | None]) -> list[int]:
    """Per role, the latest op that read any of these runs."""
    if len(readers) == 1:
        return list(readers[0].values()) if readers[0] else []
    latest: dict[int, int] = {}
    for seen in readers:
        if seen:
            for role, idx in seen.items():
                if idx > latest.get(role, -1):
                    latest[role] = idx
    return list(latest.values())
