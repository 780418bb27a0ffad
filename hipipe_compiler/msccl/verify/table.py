"""The step table: the real steps of a program's first iteration as numpy columns, each with
the level the execution gave it (steps of one level are unordered), so that the symbolic
execution and the race check take a whole level in a few array operations."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..program import READING_TYPES, RECEIVING_TYPES, REDUCING_TYPES, STEP_TYPES, WRITING_TYPES
from .report import StepRef


BUF_INDEX = {"i": 0, "o": 1, "s": 2}


TYPE_INDEX = {t: i for i, t in enumerate(STEP_TYPES)}


def _type_mask(types: frozenset[str] | set[str]) -> np.ndarray:
    return np.array([t in types for t in STEP_TYPES])


READS = _type_mask(READING_TYPES)


WRITES = _type_mask(WRITING_TYPES)


TAKES = _type_mask(RECEIVING_TYPES)  # the received payload is (an operand of) the result


REDUCES = _type_mask(REDUCING_TYPES)


RE = TYPE_INDEX["re"]


@dataclass(frozen=True)
class StepTable:
    """The real steps of the first iteration that started (every one, when the program runs
    to completion) as numpy columns, one row per step, grouped by rank (in the program's
    order) and threadblock, in step order."""

    rank: np.ndarray
    tid: np.ndarray
    col: np.ndarray  # the threadblock's index on its rank
    pos: np.ndarray
    level: np.ndarray
    kind: np.ndarray  # index into STEP_TYPES
    srcbuf: np.ndarray
    srcoff: np.ndarray
    dstbuf: np.ndarray
    dstoff: np.ndarray
    cnt: np.ndarray
    prev: np.ndarray  # row of the threadblock's previous real step, or -1
    dep_row: np.ndarray  # each dependency on another threadblock: the waiting row...
    dep_target: np.ndarray  # ...and the row whose completion it waits for (_TbState.done_by)
    send_of: np.ndarray  # for a receiving row: the row of the sending step it is matched with, else -1
    rank_rows: tuple[tuple[int, int, int], ...]  # per rank: (first row, end row, threadblocks)
    order: np.ndarray  # the rows by level: every step after those it follows

    def ref(self, row: int) -> StepRef:
        return int(self.rank[row]), int(self.tid[row]), int(self.pos[row])


def level_bounds(levels: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of equal values in a sorted array."""
    cuts = np.flatnonzero(levels[1:] != levels[:-1]) + 1
    edges = [0, *cuts.tolist(), len(levels)]
    return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]
