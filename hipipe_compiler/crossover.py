"""Where in a size window each of several plans is fastest. The window's own plan (`None`)
competes with candidates `0..count-1`; the answer is a list of segments, each served by the
plan that is fastest at both of its ends, found by halving the pieces whose ends disagree.

>>> own = lambda size: 10 + size / 2          # fast when small
>>> other = lambda size: 40 + size / 4        # fast when large: they cross at 120
>>> timer = lambda i, size: own(size) if i is None else other(size)
>>> fastest_segments(64, 255, 1, 1, timer)
[Segment(start=64, choice=None), Segment(start=120, choice=0)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

#: Times a plan (None for the window's own, else a candidate's index) at a size, in µs; inf
#: where the plan cannot take that size.
Timer = Callable[["int | None", int], float]
#: How often a piece whose ends disagree is halved: a power-of-two piece is resolved to an
#: eighth of itself.
DEPTH = 3
#: Between two candidates, the top's winner keeps the piece where it is this close to the
#: fastest at the low end: a plan more per window costs a proof and a file for next to nothing.
SAME = 0.01


@dataclass(frozen=True)
class Segment:
    """From `start` up to the next segment's start, `choice` serves: None for the window's own
    plan, else the index of a candidate."""

    start: int
    choice: int | None


def fastest_segments(lo: int, hi: int, step: int, count: int, time: Timer, depth: int = DEPTH,
                     seen: dict[tuple[int, int], float] | None = None) -> list[Segment]:
    """Segments covering [lo, hi], ascending, adjacent ones different. Plans are timed only at
    multiples of `step`, from the top down. The window is cut at powers of two, and a piece is
    judged at its start and at the next piece's (at `hi` for the last), so that neighbours
    share a size. A piece whose two sizes have the same fastest plan goes to it (or, for two
    candidates within `SAME` at the lower size, to the upper one's), one whose sizes disagree is
    halved up to `depth` times, and a piece still undecided then goes to whichever of the two
    winners loses less at its worse size. A candidate is timed at a size only while the time it
    had at the nearest larger size, scaled down in proportion, could still beat the best found:
    a plan's time per byte does not grow with the message. `seen` keeps the candidates' times
    (by index and size) from one window to the next, whose own plans differ."""
    timings = Timings(count, time, {} if seen is None else seen)
    cuts = [1 << k for k in range(lo.bit_length(), hi.bit_length()) if lo < 1 << k <= hi]
    out: list[Segment] = []
    for start, end in reversed(list(zip([lo, *cuts], [*cuts, hi + 1]))):
        out = _piece(start, end, hi, step, timings, depth) + out
    return [s for k, s in enumerate(out) if k == 0 or s.choice != out[k - 1].choice]


def _piece(start: int, end: int, hi: int, step: int, timings: Timings, depth: int) -> list[Segment]:
    """Who serves [start, end) of a window that ends at `hi`."""
    top, low = min(end, hi) - min(end, hi) % step, max(step, start + -start % step)
    if top < low:
        return [Segment(start, None)]
    at_top = timings.winner(top)
    at_low = at_top if low == top else timings.winner(low)
    if at_top == at_low or (at_top is not None and at_low is not None
                            and timings.time(at_top, low) <= (1 + SAME) * timings.time(at_low, low)):
        return [Segment(start, at_top)]
    mid = (start + end) // 2
    mid -= mid % step
    if depth > 0 and low < mid < top:
        upper = _piece(mid, end, hi, step, timings, depth - 1)
        return _piece(start, mid, hi, step, timings, depth - 1) + upper

    def worse_end(choice: int | None) -> float:
        return max(timings.time(choice, top) / timings.time(at_top, top),
                   timings.time(choice, low) / timings.time(at_low, low))
    return [Segment(start, min((at_top, at_low), key=worse_end))]


class Timings:
    """The times a search asked for, each simulated once: the window's own plan's by size, the
    candidates' by (index, size)."""

    def __init__(self, count: int, time: Timer, seen: dict[tuple[int, int], float]) -> None:
        self.count, self._time, self.seen = count, time, seen
        self.own: dict[int, float] = {}

    def time(self, choice: int | None, size: int) -> float:
        if choice is None:
            if size not in self.own:
                self.own[size] = self._time(None, size)
            return self.own[size]
        if (choice, size) not in self.seen:
            self.seen[(choice, size)] = self._time(choice, size)
        return self.seen[(choice, size)]

    def winner(self, size: int) -> int | None:
        """The fastest plan at `size`; the window's own plan unless a candidate is faster."""
        best, best_time = None, self.time(None, size)
        bounds = sorted((self._bound(i, size), i) for i in range(self.count))
        for bound, i in bounds:
            if bound >= best_time:
                break
            if self.time(i, size) < best_time:
                best, best_time = i, self.time(i, size)
        return best

    def _bound(self, i: int, size: int) -> float:
        larger = [s for (c, s), t in self.seen.items() if c == i and s > size and t != math.inf]
        return self.seen[(i, min(larger))] * size / min(larger) if larger else 0.0
