"""The command line's parser and option types: a bad option value is one line naming the
option and what was expected, exit code 2.

>>> size_option("--size")("256MiB"), integer_option("--chunks", 1)("4")
(268435456, 4)
"""

from __future__ import annotations

import argparse
from typing import Callable

from .errors import InputError
from .units import MAX_BYTES, parse_size, parse_size_range


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def integer_option(name: str, low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer from low to high (inclusive; no upper bound when high is None)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"from {low} to {high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"expected an integer {bound}, got {value}")
        return value
    return parse


def number_option(name: str, zero: bool = False) -> Callable[[str], float]:
    """A finite number > 0 (>= 0 with `zero`)."""
    bound = ">= 0" if zero else "> 0"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not ((value >= 0 if zero else value > 0) and value != float("inf")):
            raise argparse.ArgumentTypeError(f"expected a number {bound}, got {text!r}")
        return value
    return parse


def positive_option(name: str) -> Callable[[str], float]:
    """A finite number > 0."""
    return number_option(name)


def nonnegative_option(name: str) -> Callable[[str], float]:
    """A finite number >= 0."""
    return number_option(name, zero=True)


def size_option(name: str) -> Callable[[str], int]:
    """A call size, from 1 byte to MAX_BYTES (units.parse_size)."""
    def parse(text: str) -> int:
        try:
            value = parse_size(text, name, maximum=MAX_BYTES)
        except InputError as exc:
            raise argparse.ArgumentTypeError(exc.message) from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"expected at least 1 byte, got {text!r}")
        return value
    return parse


def size_range_option(text: str) -> tuple[int, int]:
    """A range of call sizes MIN:MAX (--sizes)."""
    try:
        lo, hi = parse_size_range(text, "--sizes", maximum=MAX_BYTES)
    except InputError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    if lo < 1:
        raise argparse.ArgumentTypeError("expected MIN >= 1 byte")
    return lo, hi
