"""Which plan serves each part of a window (crossover.py): on plans whose times are affine in the
size, as a pipeline's nearly are, the segments cover the window, every size away from a
crossing goes to the fastest plan, and pruning never changes the winner."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from hipipe_compiler.crossover import DEPTH, SAME, Timings, fastest_segments

STEP = 1 << 12
#: (fixed µs, µs per MiB) of a plan: the time per byte falls as the message grows
lines = st.tuples(st.floats(0.0, 500.0), st.floats(1.0, 20.0))


def timer(own: tuple[float, float], candidates: list[tuple[float, float]], calls: list | None = None):
    def time(i, size):
        if calls is not None:
            calls.append((i, size))
        a, b = own if i is None else candidates[i]
        return a + b * size / (1 << 20)
    return time


def served(segments, size):
    return [s.choice for s in segments if s.start <= size][-1]


windows = st.tuples(st.integers(8, 18), st.integers(1, 6)).map(lambda t: ((1 << t[0]) * STEP,
                                                                         ((1 << t[0] + t[1]) - 1) * STEP))


@st.composite
def crossing(draw) -> tuple[tuple[int, int], tuple[float, float], list[tuple[float, float]]]:
    """A window, the own plan, and candidates that each cross it somewhere in the window."""
    lo, hi = draw(windows)
    a, b = draw(lines)
    candidates = []
    for _ in range(draw(st.integers(1, 5))):
        at = lo * (hi / lo) ** draw(st.floats(0.05, 0.95))
        slope = b * draw(st.floats(0.2, 0.95))
        candidates.append((a + (b - slope) * at / (1 << 20), slope))
    return (lo, hi), (a, b), candidates


@settings(max_examples=200)
@given(st.one_of(crossing(), st.tuples(windows, lines, st.lists(lines, max_size=5))))
def test_segments_cover_the_window_and_serve_the_fastest_plan_away_from_crossings(case):
    (lo, hi), own, candidates = case
    time = timer(own, candidates)
    segments = fastest_segments(lo, hi, STEP, len(candidates), time)
    assert segments[0].start == lo and all(a.start < b.start <= hi for a, b in zip(segments, segments[1:]))
    assert all(a.choice != b.choice for a, b in zip(segments, segments[1:]))
    plans = [None, *range(len(candidates))]
    # a crossing is resolved to an eighth of its power-of-two piece: beyond that, the fastest serves
    for size in range(lo, hi + 1, max(STEP, (hi - lo) // 97 // STEP * STEP)):
        piece = 1 << (size.bit_length() - 1)
        # affine plans: one fastest at both ends of a range is fastest all through it
        near = (max(lo, size - piece // (1 << DEPTH)), size + piece // (1 << DEPTH))
        fastest = {min(plans, key=lambda p: time(p, s)) for s in near}
        if len(fastest) == 1:
            best = fastest.pop()
            got = served(segments, size)
            assert got == best or (got is not None and best is not None
                                   and time(got, size) <= (1 + SAME) * time(best, size) * 1.0001), (size, got, best)


@settings(max_examples=100)
@given(st.lists(lines, min_size=1, max_size=6), lines, st.lists(st.integers(1, 4096), min_size=1, max_size=8))
def test_pruned_winners_are_the_fastest_plans(candidates, own, sizes):
    timings = Timings(len(candidates), timer(own, candidates), {})
    for size in sorted({s * STEP for s in sizes}, reverse=True):
        fastest = min([None, *range(len(candidates))], key=lambda p: timer(own, candidates)(p, size))
        got = timings.winner(size)
        assert timer(own, candidates)(got, size) == timer(own, candidates)(fastest, size)


def test_a_plan_fastest_everywhere_serves_the_whole_window_after_two_sizes_per_piece():
    calls = []
    lo, hi = 1 << 20, (1 << 30) - 1
    segments = fastest_segments(lo, hi, STEP, 3, timer((0.0, 10.0), [(1.0, 20.0), (5.0, 11.0), (50.0, 12.0)], calls))
    assert segments == [segments[0]] and segments[0].choice is None
    sizes = {s for _i, s in calls}
    assert len(sizes) == 10 + 1  # the ten pieces share their ends
    # below the top, a candidate that the scaled bound rules out is not timed again
    assert sum(1 for i, _s in calls if i is not None) < 3 * len(sizes)


def test_times_kept_from_a_window_above_are_not_simulated_again():
    seen: dict[tuple[int, int], float] = {}
    calls = []
    time = timer((100.0, 10.0), [(0.0, 12.0), (30.0, 9.0)], calls)
    fastest_segments(1 << 26, (1 << 28) - 1, STEP, 2, time, seen=seen)
    before = len(calls)
    fastest_segments(1 << 26, (1 << 28) - 1, STEP, 2, time, seen=seen)
    assert all(i is None for i, _s in calls[before:])


@given(st.integers(65, 250), st.integers(1, 4))
def test_a_plan_is_never_given_sizes_it_cannot_take(limit, step):
    """Above `limit` the window's own plan cannot serve (its offsets would wrap): the candidate
    takes every size there, to the step the sizes are judged at, though the own plan is faster
    wherever it can serve."""
    def timer(i, size):
        if i is None:
            return 10 + size / 4 if size <= limit else math.inf
        return 40 + size / 4
    segments = fastest_segments(64, 255, step, 1, timer)
    for k, seg in enumerate(segments):
        end = segments[k + 1].start if k + 1 < len(segments) else 256
        if seg.choice is None:  # sizes are judged at multiples of the step
            assert end - 1 < limit + step, segments
