"""Byte sizes with units, as users type them (64KiB, 256MiB, 1GiB, 1G)."""

from __future__ import annotations

import re
from fractions import Fraction

from .errors import InputError

_UNITS = {
    "": 1, "B": 1,
    "K": 1 << 10, "KB": 1000, "KIB": 1 << 10,
    "M": 1 << 20, "MB": 1000**2, "MIB": 1 << 20,
    "G": 1 << 30, "GB": 1000**3, "GIB": 1 << 30,
    "T": 1 << 40, "TB": 1000**4, "TIB": 1 << 40,
}
#: The largest call size the commands accept: 1 TiB, more than any GPU holds.
MAX_BYTES = 1 << 40
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str, field: str = "size", source: str | None = None, maximum: int | None = None) -> int:
    """Parse a byte count: plain bytes, or K/M/G/T (binary, as nccl-tests), KiB/MiB/GiB, KB/MB/GB,
    exactly, and at most `maximum` (a call's size: MAX_BYTES).

    >>> parse_size("256MiB"), parse_size("1G"), parse_size("64KB"), parse_size("4096")
    (268435456, 1073741824, 64000, 4096)
    """
    m = _SIZE.match(str(text))
    unit = m.group(2).upper() if m else None
    if not m or unit not in _UNITS:
        raise InputError(source, field, f"expected a byte size such as 4096, 64KiB, 256MiB or 1GiB, got {text!r}")
    if len(m.group(1)) > 30:  # more bytes than anything holds; and no 4,300-digit integers
        raise InputError(source, field, f"expected a byte size of at most 30 digits, got {text[:40]!r}...")
    value = Fraction(m.group(1)) * _UNITS[unit]  # exact: 9007199254740993 stays itself
    if value.denominator != 1:
        raise InputError(source, field, f"expected a whole number of bytes, got {text!r}")
    if maximum is not None and value > maximum:
        raise InputError(source, field, f"expected a byte size of at most {format_size(maximum)}"
                                        f"{' (more than any GPU holds)' if maximum == MAX_BYTES else ''}, got {text!r}")
    return int(value)


def parse_size_range(text: str, field: str = "sizes", source: str | None = None,
                     maximum: int | None = None) -> tuple[int, int]:
    """Parse MIN:MAX into a pair of byte counts with MIN <= MAX.

    >>> parse_size_range("1KiB:4GiB")
    (1024, 4294967296)
    """
    parts = str(text).split(":")
    if len(parts) != 2:
        raise InputError(source, field, f"expected MIN:MAX such as 1KiB:4GiB, got {text!r}")
    lo, hi = (parse_size(p, field, source, maximum) for p in parts)
    if lo > hi:
        raise InputError(source, field, f"expected MIN <= MAX, got {text!r}")
    return lo, hi


def format_size(nbytes: int | float) -> str:
    """Shortest exact binary-unit spelling, else one rounded to three decimals (always with a point).

    >>> format_size(268435456), format_size(1536), format_size(1000), format_size(166671156)
    ('256MiB', '1.5KiB', '1000B', '158.95MiB')
    """
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            value = nbytes / scale
            if value == int(value):
                return f"{int(value)}{unit}"
            text = f"{value:.3f}".rstrip("0")
            return f"{text}0{unit}" if text.endswith(".") else f"{text}{unit}"
    return f"{int(nbytes)}B"
