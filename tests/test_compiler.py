"""Compiling size ranges: windows, merging, divisibility, output paths and the manifest."""

import json
import math
import os
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hipipe_compiler import compiler
from hipipe_compiler.background import can_fork
from hipipe_compiler.compiler import (
    BUCKET_NCHUNKSPERLOOP, BUCKET_WINDOW, MANIFEST_DIR, CompileOptions, VerificationFailed, bucket_caps, check_divisible,
    compile_range, write_directory,
)
from hipipe_compiler.errors import InputError
from hipipe_compiler.files import check_output_path, write_atomic
from hipipe_compiler.msccl import read_program
from hipipe_compiler.msccl.verify import Violation
from hipipe_compiler.optimizer import Knobs, build_plan
from hipipe_compiler.presets import preset
from hipipe_compiler.sim.simulate import SimulationError
from hipipe_compiler.windows import WIDE_WINDOWS_FROM, Window, size_windows

from conftest import topologies, c1p


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


def test_proofs_in_children_give_the_parents_windows_and_reports(monkeypatch):
    """With jobs, each final program is proven in a forked child while the next is lowered:
    the windows, programs and reports are the ones a single process gets, and a proof that
    fails in a child still stops the compile, naming its window."""
    options = CompileOptions(algorithm="hierarchical", chunks=2)
    alone = compile_range(preset("torus-4x4"), options, 1 << 10, 4 << 30)
    together = compile_range(preset("torus-4x4"), replace(options, jobs=3), 1 << 10, 4 << 30)
    assert [(w.window, w.program, w.report, w.details) for w in together] == \
        [(w.window, w.program, w.report, w.details) for w in alone]
    broken = alone[1].window
    proven = compiler.verify

    def fails_one(program, opts):
        report = proven(program, opts)
        if program.max_bytes != broken.max_bytes:
            return report
        return replace(report, violations=(Violation("semantics.result", f"planted in process {os.getpid()}"),))

    monkeypatch.setattr(compiler, "verify", fails_one)
    with pytest.raises(VerificationFailed, match="semantics.result") as failed:
        compile_range(preset("torus-4x4"), replace(options, jobs=2), 1 << 10, 4 << 30)
    assert failed.value.window == broken
    proven_in = int(failed.value.report.violations[0].message.split()[-1])
    assert (proven_in != os.getpid()) == can_fork()

    # a later window that the simulator cannot time still gets the verifier's report of the broken one first
    def deadlocks(program, topology, nbytes, *args, **kwargs):
        raise SimulationError("deadlock: planted")

    monkeypatch.setattr(compiler, "simulate_exact", deadlocks)
    with pytest.raises(VerificationFailed, match="semantics.result"):
        compile_range(preset("torus-4x4"), replace(options, jobs=2), 1 << 10, 4 << 30)
    monkeypatch.setattr(compiler, "verify", proven)
    with pytest.raises(SimulationError, match="planted"):
        compile_range(preset("torus-4x4"), replace(options, jobs=2), 1 << 10, 4 << 30)


def test_size_must_divide_as_the_runtime_needs():
    program = compile_range(c1p(4), CompileOptions(algorithm="hierarchical"), 1 << 20, 1 << 20)[0].program
    check_divisible(program, 1 << 20, 4)
    with pytest.raises(InputError, match="not a multiple of 128 bytes"):
        check_divisible(program, 1000, 4)


def test_hipipe_only_picks_programs_the_runtime_can_select():
    for size in (1 << 10, 1 << 20, 64 << 20):
        for w in compile_range(c1p(4), CompileOptions(), size, 2 * size - 1):
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
    windows = compile_range(c1p(2), CompileOptions(algorithm="hierarchical"), 1 << 10, 1 << 30)
    out = tmp_path / "algos"
    write_directory(windows, out, {"tool": "test"})
    files = sorted(p for p in out.iterdir() if p.is_file())
    assert files and all(p.suffix == ".xml" for p in files)
    assert [read_program(p).min_bytes for p in files] == [w.window.min_bytes for w in windows]
    manifest = json.loads((out / MANIFEST_DIR / "manifest.json").read_text())
    assert manifest["files"] == [p.name for p in files]


def test_output_checks_refuse_devices_and_names_too_long(tmp_path):
    """Writing atomically replaces the name: /dev/null would become a regular file."""
    with pytest.raises(InputError, match="a device, pipe or socket is there"):
        check_output_path("/dev/null", directory=False)
    with pytest.raises(InputError, match="cannot write here"):
        check_output_path(tmp_path / ("a" * 300 + ".xml"), directory=False)
    longest = tmp_path / ("b" * 251 + ".xml")  # 255 characters, as long as names go
    write_atomic(longest, "x")  # its temporary file takes a short name of its own
    assert longest.read_text() == "x"


def test_a_directory_whose_file_is_blocked_is_left_as_it_was(tmp_path):
    windows = compile_range(c1p(2), CompileOptions(algorithm="hierarchical"), 1 << 10, 1 << 30)
    out = tmp_path / "algos"
    write_directory(windows, out, {"tool": "test"})
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    blocked = sorted(before)[-1]
    (out / blocked).unlink()
    (out / blocked).mkdir()
    with pytest.raises(InputError, match=f"{blocked}: expected to write a file here"):
        write_directory(windows, out, {"tool": "again"})
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == {n: b for n, b in before.items() if n != blocked}
    assert json.loads((out / MANIFEST_DIR / "manifest.json").read_text())["tool"] == "test"


def test_bad_options_name_the_option():
    with pytest.raises(InputError, match="--algo"):
        compile_range(preset("torus-4x4"), CompileOptions(algorithm="magic"), 1024, 2048)
    with pytest.raises(InputError, match="--chunks"):
        compile_range(preset("torus-4x4"), CompileOptions(chunks=0), 1024, 2048)


@given(topologies(max_ranks=256), st.sampled_from(["allreduce", "reducescatter"]), st.integers(10, 32), st.integers(0, 8))
def test_bucket_caps_bound_only_the_ranged_windows_below_the_bucket_window(topo, collective, lo_log2, octaves):
    windows = [*size_windows(1 << lo_log2, 1 << (lo_log2 + octaves)), Window(1 << 20, 1 << 20)]
    options = CompileOptions(collective=collective)
    caps = bucket_caps(topo, options, windows)
    assert bucket_caps(topo, replace(options, max_bucket_nchunksperloop=None), windows) == [None] * len(windows)
    coarsest = build_plan(topo, collective, 1 << 20, 1 << 20, Knobs(1))
    multiple = coarsest.nchunksperloop // math.gcd(coarsest.nchunksperloop, topo.nranks if collective != "allreduce" else 1)
    room = multiple * 4 <= BUCKET_NCHUNKSPERLOOP  # else only one-chunk plans would fit under the cap
    for w, cap in zip(windows, caps):
        assert cap == (BUCKET_NCHUNKSPERLOOP if room and w.min_bytes < w.max_bytes and w.max_bytes < BUCKET_WINDOW else None)
    # an explicit cap applies wherever the coarsest plan fits it, and below that is refused
    explicit = bucket_caps(topo, replace(options, max_bucket_nchunksperloop=max(multiple, 256)), windows)
    assert [c is not None for c in explicit] == [w.min_bytes < w.max_bytes and w.max_bytes < BUCKET_WINDOW for w in windows]
    if multiple > 1:
        with pytest.raises(InputError, match="--max-bucket-nchunksperloop: expected at least"):
            compile_range(topo, replace(options, max_bucket_nchunksperloop=multiple - 1), 1 << 20, 2 << 20)


def test_a_topology_too_large_for_the_bucket_cap_is_not_capped():
    """1024 ranks need 2048 chunks per loop at the least: no bucket count of 256 x an odd number
    could select any program, so the cap would only cost time."""
    windows = size_windows(1 << 20, 32 << 20)
    assert bucket_caps(preset("pod-8x4x8x4"), CompileOptions(), windows) == [None] * len(windows)


def test_gradient_bucket_windows_serve_bucket_counts_and_larger_windows_stay_the_fastest():
    """On dgx-h100-8x2 the windows below 64 MiB take programs that a count of 256 x an odd
    number can select (BERT's and GPT-2's buckets are such counts), the larger windows the
    same programs as without the cap."""
    topo, lo, hi = c1p(2), 16 << 20, 128 << 20
    default = compile_range(topo, CompileOptions(), lo, hi)
    free = compile_range(topo, CompileOptions(max_bucket_nchunksperloop=None), lo, hi)
    below = [w for w in default if w.window.max_bytes < BUCKET_WINDOW]
    assert below and all(256 % w.plan.nchunksperloop == 0 for w in below)
    assert any(w.plan.nchunksperloop > 256 for w in free if w.window.max_bytes < BUCKET_WINDOW)  # the cap had work to do
    assert [w.plan for w in default if w.window.min_bytes >= BUCKET_WINDOW] == \
        [w.plan for w in free if w.window.min_bytes >= BUCKET_WINDOW]
    for w in default:
        assert w.report is not None and w.report.ok
