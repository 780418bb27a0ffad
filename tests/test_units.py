"""Byte sizes with units."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hipipe_compiler.errors import InputError
from hipipe_compiler.units import format_size, parse_size, parse_size_range


@pytest.mark.parametrize("text,value", [
    ("4096", 4096), ("64KiB", 65536), ("64K", 65536), ("64KB", 64000), ("256MiB", 256 << 20),
    ("1G", 1 << 30), ("1GiB", 1 << 30), ("1.5KiB", 1536), ("2TiB", 2 << 40), ("1 MiB", 1 << 20), ("3b", 3),
])
def test_parse_size_units(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "abc", "-5", "1.3B", "5XB", "1e3", "0x10", "MiB"])
def test_parse_size_rejects_garbage_naming_the_field(text):
    with pytest.raises(InputError) as info:
        parse_size(text, "--size")
    assert info.value.field == "--size"
    assert "\n" not in str(info.value)


def test_size_range_requires_min_not_above_max():
    assert parse_size_range("1KiB:4GiB") == (1024, 4 << 30)
    with pytest.raises(InputError):
        parse_size_range("4GiB:1KiB")
    with pytest.raises(InputError):
        parse_size_range("1KiB")


@given(st.integers(1, 1 << 45))
def test_format_parse_round_trip_of_exact_sizes(n):
    text = format_size(n)
    if "." not in text:
        assert parse_size(text) == n
    else:
        assert abs(parse_size_from_float(text) - n) / n < 1e-3


def parse_size_from_float(text):
    number = float("".join(c for c in text if c.isdigit() or c == "."))
    unit = "".join(c for c in text if c.isalpha())
    return number * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}[unit]


def test_sizes_are_exact_and_bounded_where_a_maximum_applies():
    assert parse_size("9007199254740993") == 9007199254740993  # no float rounding
    assert parse_size("2TiB") == 2 << 40  # the parser alone has no maximum
    with pytest.raises(InputError, match="at most 1TiB"):
        parse_size("2TiB", "--size", maximum=1 << 40)
    with pytest.raises(InputError, match="at most 30 digits"):
        parse_size("1" * 400, "--size")
    with pytest.raises(InputError, match="at most 1TiB"):
        parse_size_range("1KiB:99999999999TiB", "--sizes", maximum=1 << 40)
