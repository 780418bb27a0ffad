"""Size windows: the inclusive byte ranges [minBytes, maxBytes] that one program serves, and
how a range of call sizes is cut into them (one program per window, picked per call by the
runtime).

>>> [w.label for w in size_windows(64 << 10, (1 << 20) - 1)]
['64KiB..<128KiB', '128KiB..<256KiB', '256KiB..<512KiB', '512KiB..<1MiB']
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InputError
from .units import format_size


@dataclass(frozen=True)
class Window:
    """An inclusive byte range [min_bytes, max_bytes] of call sizes one program serves."""

    min_bytes: int
    max_bytes: int

    @property
    def label(self) -> str:
        """min..max, or min..<end when the window stops one byte below a round size."""
        return window_label(self.min_bytes, self.max_bytes)


def window_label(min_bytes: int, max_bytes: int) -> str:
    """A size window as people read it: 1KiB..<128KiB rather than 1KiB..127.999KiB, where the
    end is a whole number of KiB, MiB, GiB or TiB.

    >>> window_label(1024, (128 << 10) - 1), window_label(1 << 20, 1 << 20), window_label(1 << 20, (56 << 20) - 1)
    ('1KiB..<128KiB', '1MiB..1MiB', '1MiB..<56MiB')
    >>> window_label(1 << 20, (3 << 19) - 1), window_label(1, 999)
    ('1MiB..1.5MiB', '1B..999B')
    """
    end = max_bytes + 1
    if end % 1024 == 0 and "." not in format_size(end) and max_bytes > min_bytes:
        return f"{format_size(min_bytes)}..<{format_size(end)}"
    return f"{format_size(min_bytes)}..{format_size(max_bytes)}"


#: Windows double in size up to here and quadruple beyond: large calls change plans slowly.
WIDE_WINDOWS_FROM = 16 << 20


def size_windows(min_bytes: int, max_bytes: int) -> tuple[Window, ...]:
    """Split [min, max] at powers of two (powers of four from WIDE_WINDOWS_FROM on) into
    windows that tile it with no gap and no overlap.

    >>> [(w.min_bytes, w.max_bytes) for w in size_windows(1000, 5000)]
    [(1000, 1023), (1024, 2047), (2048, 4095), (4096, 5000)]
    >>> [w.label for w in size_windows(16 << 20, 1 << 30)]
    ['16MiB..<64MiB', '64MiB..<256MiB', '256MiB..<1GiB', '1GiB..1GiB']
    """
    if min_bytes < 1 or max_bytes < min_bytes:
        raise InputError(None, "sizes", f"expected 1 <= MIN <= MAX, got {min_bytes}:{max_bytes}")
    out = []
    lo = min_bytes
    while lo <= max_bytes:
        nxt = 1 << lo.bit_length()  # the next power of two above lo
        if nxt > WIDE_WINDOWS_FROM and (nxt.bit_length() - WIDE_WINDOWS_FROM.bit_length()) % 2:
            nxt <<= 1  # beyond WIDE_WINDOWS_FROM, windows end at every other power of two
        hi = min(max_bytes, nxt - 1)
        out.append(Window(lo, hi))
        lo = hi + 1
    return tuple(out)


def window_of(nbytes: int) -> Window:
    """The size window holding nbytes, as `--sizes 1:MAX` would cut it for any MAX >= nbytes.

    >>> window_of(3000).label, window_of(20 << 20).label
    ('2KiB..<4KiB', '16MiB..<64MiB')
    """
    size = max(int(nbytes), 1)
    return next(w for w in size_windows(1, 4 * size) if w.min_bytes <= size <= w.max_bytes)
