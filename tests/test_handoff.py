"""A directory leaves to NCCL the windows where NCCL's own pick is as fast as our program
(by the margin), and says so; coverage counts their calls as left to NCCL by design."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from hipipe_compiler.compiler import CompileOptions, compile_range
from hipipe_compiler.handoff import against_nccl, kept, left, nccl_machine, speedup_over_nccl
from hipipe_compiler.presets import preset
from hipipe_compiler.coverage import coverage, directory_programs, left_windows

from conftest import run_hipipe


def test_a_window_nccl_runs_faster_is_left_to_it():
    # one H100 node: NCCL's in-switch reduction moves 1.125 M per port where any GPU-side
    # all-reduce moves 1.75 M, so from tens of MiB NCCL wins
    topo = preset("dgx-h100-8x1")
    windows = compile_range(topo, CompileOptions(algorithm="hierarchical"), 256 << 20, 1 << 30)
    judged = against_nccl(windows, topo, "allreduce", 1.05)
    assert left(judged) and not kept(judged)
    facts = judged[0].details["nccl"]
    assert facts["nccl_runs"] == ["nvls/Simple"] * len(facts["at_bytes"])
    assert facts["speedup"] == min(n / h for n, h in zip(facts["nccl_us"], facts["hipipe_us"])) < 1.05


def test_a_margin_of_one_keeps_every_window_we_are_faster_in():
    topo = preset("dgx-a100-8x2")
    # the hierarchical all-reduce in 4 chunks: slower than NCCL's ring at 64 KiB, faster at 1 GiB
    windows = [compile_range(topo, CompileOptions(algorithm="hierarchical", chunks=4), n, n)[0]
               for n in (64 << 10, 1 << 30)]
    judged = against_nccl(windows, topo, "allreduce", 1.0)
    assert all((w.details["nccl"]["speedup"] >= 1.0) != w.details["left_to_nccl"] for w in judged)
    assert {w.details["left_to_nccl"] for w in judged} == {True, False}


@pytest.mark.parametrize("name", ["torus-4x4", "dgx-h100-8x1"])
def test_no_window_is_judged_where_nccls_pick_would_be_a_guess(name):
    """A torus, and a machine that does not say which GPU it is: nothing to leave to NCCL."""
    topo = preset(name)
    if name != "torus-4x4":
        topo = replace(topo, gpu=None)
    assert nccl_machine(topo) is not None
    windows = compile_range(topo, CompileOptions(algorithm="hierarchical"), 1 << 30, 1 << 30)
    judged = against_nccl(windows, topo, "allreduce", 1.05)
    assert judged == windows and "nccl" not in judged[0].details


def test_the_command_writes_no_file_for_a_left_window_and_coverage_counts_its_calls(tmp_path):
    out = tmp_path / "dir"
    done = run_hipipe("compile", "dgx-h100-8x1", "--sizes", "1MiB:1GiB", "-o", out)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / ".hipipe" / "manifest.json").read_text())
    assert manifest["left_to_nccl"] and manifest["min_speedup"] == 1.05
    assert "left to NCCL" in done.stdout
    files, world = directory_programs(out)
    assert len(files) == len(manifest["windows"])
    gone = left_windows(out, "allreduce", world)
    assert gone == [(w["min_bytes"], w["max_bytes"]) for w in manifest["left_to_nccl"]]
    big = gone[-1][1] // 4  # an all-reduce of a size in the last left window
    report = coverage(files, [big], 4, world, left=gone)
    assert report.left_calls == 1 and report.served_calls == 0
    assert "left to NCCL by design" in report.calls_detail[0].why_not


def test_the_worst_timed_end_decides_the_speedup():
    assert speedup_over_nccl([10.0, 20.0], [12.0, 30.0]) == 1.2
    assert speedup_over_nccl([10.0, 20.0], [None, 30.0]) == 1.5
    assert speedup_over_nccl([10.0], [None]) is None
