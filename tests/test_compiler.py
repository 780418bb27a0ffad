"""Compiling size ranges: windows, merging, divisibility, output paths and the manifest."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hipipe_compiler.compiler import MANIFEST_DIR, CompileOptions, check_divisible, compile_range, write_directory
from hipipe_compiler.errors import InputError
from hipipe_compiler.files import check_output_path
from hipipe_compiler.msccl import read_program
from hipipe_compiler.topology import preset
from hipipe_compiler.windows import WIDE_WINDOWS_FROM, size_windows


@given(st.integers(1, 1 << 40), st.integers(0, 1 << 40))
def test_windows_tile_the_range_without_gap_or_overlap(lo, extra):
    hi = lo + extra
    windows = size_windows(lo, hi)
    assert windows[0].min_bytes == lo and windows[-1].max_bytes == hi
    for a, b in zip(windows, windows[1:]):
        assert b.min_bytes == a.max_bytes + 1
    for w in windows:
        assert w.min_bytes <= w.max_bytes
        octaves = w.max_bytes.bit_length() - w.min_bytes.bit_length()
        assert octaves == 0 or (octaves == 1 and w.min_bytes >= WIDE_WINDOWS_FROM)


def test_compiled_windows_tile_and_merge_identical_programs():
    out = compile_range(preset("torus-4x4"), CompileOptions(algorithm="hierarchical", chunks=2), 1 << 10, 4 << 30)
    assert out[0].window.min_bytes == 1 << 10 and out[-1].window.max_bytes == 4 << 30
    for a, b in zip(out, out[1:]):
        assert b.window.min_bytes == a.window.max_bytes + 1
        assert a.program.with_window(0, 0) != b.program.with_window(0, 0)  # neighbours differ, else merged
    for w in out:
        assert (w.program.min_bytes, w.program.max_bytes) == (w.window.min_bytes, w.window.max_bytes)
        assert w.report is not None and w.report.ok
    assert len(out) < len(size_windows(1 << 10, 4 << 30))


def test_size_must_divide_as_the_runtime_needs():
    program = compile_range(preset("dgx-h100-8x4"), CompileOptions(algorithm="hierarchical"), 1 << 20, 1 << 20)[0].program
    check_divisible(program, 1 << 20, 4)
    with pytest.raises(InputError, match="not a multiple of 128 bytes"):
        check_divisible(program, 1000, 4)


def test_hipipe_only_picks_programs_the_runtime_can_select():
    for size in (1 << 10, 1 << 20, 64 << 20):
        for w in compile_range(preset("dgx-h100-8x4"), CompileOptions(), size, 2 * size - 1):
            check_divisible(w.program, w.window.min_bytes, 4)


def test_output_path_checks(tmp_path):
    assert check_output_path(tmp_path / "a.xml", directory=False) == tmp_path / "a.xml"
    with pytest.raises(InputError, match="parent directory"):
        check_output_path(tmp_path / "missing" / "a.xml", directory=False)
    with pytest.raises(InputError, match="is a directory"):
        check_output_path(tmp_path, directory=False)
    (tmp_path / "f").write_text("x")
    with pytest.raises(InputError, match="a file is there"):
        check_output_path(tmp_path / "f", directory=True)


def test_directory_holds_only_xml_and_the_manifest_sits_in_a_hidden_subdirectory(tmp_path):
    windows = compile_range(preset("dgx-h100-8x2"), CompileOptions(algorithm="hierarchical"), 1 << 10, 1 << 30)
    out = tmp_path / "algos"
    write_directory(windows, out, {"tool": "test"})
    files = sorted(p for p in out.iterdir() if p.is_file())
    assert files and all(p.suffix == ".xml" for p in files)
    assert [read_program(p).min_bytes for p in files] == [w.window.min_bytes for w in windows]
    manifest = json.loads((out / MANIFEST_DIR / "manifest.json").read_text())
    assert manifest["files"] == [p.name for p in files]


def test_bad_options_name_the_option():
    with pytest.raises(InputError, match="--algo"):
        compile_range(preset("torus-4x4"), CompileOptions(algorithm="magic"), 1024, 2048)
    with pytest.raises(InputError, match="--chunks"):
        compile_range(preset("torus-4x4"), CompileOptions(chunks=0), 1024, 2048)
