"""Python's cyclic garbage collector around the passes that build millions of small objects.

Lowering and the search allocate Steps, operations and units by the million; a collection
frees few of them but walks them all (and everything else alive). `paused` stops collections
for the span of one pass; `settling` lets the search put what it keeps (its cached programs)
out of the collector's sight between windows.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def paused() -> Iterator[None]:
    """No collections for the duration (unless the caller already paused them).

    Lowering and the verifier allocate millions of small objects (operations, units, steps,
    per-step state) that stay alive until they return; each collection meanwhile walks them
    and the caller's heap and frees nothing (a third of lowering's time). The few cycles
    left behind are collected after the pause."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextmanager
def settling() -> Iterator[Callable[[], None]]:
    """Yields `settle()`: it collects and then freezes every object alive (gc.freeze), so
    later collections skip what the caller keeps for long (the search's cached programs:
    full collections walked them all, a tenth of its time). On exit everything frozen is
    handed back to the collector (gc.unfreeze), unless the caller had frozen objects of its
    own before: gc cannot tell them apart, so then ours stay frozen too."""
    already = gc.get_freeze_count()

    def settle() -> None:
        gc.collect()  # walks only what is not frozen yet
        gc.freeze()

    try:
        yield settle
    finally:
        if already == 0:
            gc.unfreeze()
