"""Pictures: the simulate timeline, the bench plot, and the README's images from the samples."""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import numpy as np
import pytest
from lxml import etree

from hipipe_compiler.compiler import CompileOptions, compile_range
from hipipe_compiler.errors import InputError
from hipipe_compiler.sim import render_timeline, simulate
from hipipe_compiler.sim.timeline import _lanes, chunk_of, timeline_bars
from hipipe_compiler.presets import load_topology

from conftest import REPO, SAMPLES, run_hipipe, c1p

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def check_png(path: Path, min_width: int = 600, min_height: int = 200, min_colours: int = 5) -> None:
    """A real picture: PNG header, sensible size, and more than a blank canvas."""
    import matplotlib.image
    width, height = png_size(path)
    assert min_width <= width <= 6000 and min_height <= height <= 6000, (width, height)
    pixels = matplotlib.image.imread(path)[..., :3]
    colours = np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) >= min_colours, f"{path} has {len(colours)} colours: blank?"


#: One worker runs this module, so the recorded call below is compiled and simulated once.
pytestmark = pytest.mark.xdist_group("timeline")


@pytest.fixture(scope="module")
def recorded():
    topo = load_topology(SAMPLES / "dgx-h100-8x4.yaml")
    program = compile_range(topo, CompileOptions(), 16 << 20, 16 << 20)[0].program
    return topo, program, simulate(program, topo, 16 << 20, record=True)


def test_bars_cover_every_message_rank_zero_sent(recorded):
    topo, program, result = recorded
    bars = timeline_bars(result, program, topo)
    sent = [iv for iv in result.intervals if iv.src == 0]
    assert len(bars) == len(sent) > 0
    assert all(0 <= b.start_us < b.end_us <= result.time_us + 1e-9 for b in bars)
    # an all-reduce reduces on the way down and copies on the way back, in every dimension
    names = [topo.dim_name(d) for d in range(topo.ndims)]
    assert {b.row for b in bars} == {f"{name} {phase}" for name in names for phase in ("RS", "AG")}
    assert len({b.chunk for b in bars}) > 1
    assert all(0 <= b.chunk < program.nchunksperloop // program.ngpus for b in bars)


def test_every_recorded_message_says_whether_it_was_reduced(recorded):
    topo, program, result = recorded
    assert all(iv.reduce is not None for iv in result.intervals)
    reduced = sum(iv.reduce for iv in result.intervals)
    assert 0 < reduced < len(result.intervals)


def test_chunk_of_follows_the_layout():
    topo = c1p(2)
    for coll in ("allreduce", "reducescatter", "allgather"):
        program = compile_range(topo, CompileOptions(collective=coll, algorithm="hierarchical", chunks=4), 1 << 20, 1 << 20)[0].program
        per_rank = program.nchunksperloop // program.ngpus
        assert per_rank == 4
        chunks = {chunk_of(program, off) for off in range(program.nchunksperloop)}
        assert chunks == set(range(4))


def test_lanes_never_overlap():
    from hipipe_compiler.sim.timeline import Bar
    bars = [Bar("r", s, e, 0, True, 0, 0) for s, e in [(0, 5), (1, 2), (2, 3), (4, 9), (5, 6)]]
    lanes, n = _lanes(bars)
    assert n == 2
    for lane in range(n):
        spans = sorted((b.start_us, b.end_us) for b, l in zip(bars, lanes) if l == lane)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_render_timeline_writes_a_real_picture(recorded, tmp_path, suffix):
    topo, program, result = recorded
    path = tmp_path / f"timeline.{suffix}"
    assert render_timeline(result, program, topo, path, ranks=(0, 9), per_rank=True) > 0
    if suffix == "png":
        check_png(path)
    else:
        root = etree.parse(str(path), etree.XMLParser(resolve_entities=False, no_network=True)).getroot()
        assert root.tag.endswith("svg") and len(root.findall(".//{http://www.w3.org/2000/svg}path")) > 20
    assert not list(tmp_path.glob(".*tmp"))


def test_render_timeline_refuses_other_formats(recorded, tmp_path):
    topo, program, result = recorded
    with pytest.raises(InputError, match="png or .svg"):
        render_timeline(result, program, topo, tmp_path / "t.gif")
    assert not (tmp_path / "t.gif").exists()


def test_simulate_command_draws_the_timeline(tmp_path):
    xml = tmp_path / "a.xml"
    assert run_hipipe("compile", "dgx-h100-8x2", "--size", "4MiB", "-o", xml, "--quiet").returncode == 0
    png = tmp_path / "t.png"
    done = run_hipipe("simulate", xml, "--topo", "dgx-h100-8x2", "--size", "4MiB", "--timeline", png)
    assert done.returncode == 0, done.stderr
    check_png(png)
    bad = run_hipipe("simulate", xml, "--topo", "dgx-h100-8x2", "--size", "4MiB", "--timeline", tmp_path / "t.bmp")
    assert bad.returncode == 2 and "t.bmp" in bad.stderr and not (tmp_path / "t.bmp").exists()
    bad = run_hipipe("simulate", xml, "--topo", "dgx-h100-8x2", "--size", "4MiB", "--timeline", png, "--rank", "16")
    assert bad.returncode == 2 and "--rank" in bad.stderr


def test_bench_plot_is_a_real_picture(tmp_path):
    png = tmp_path / "busbw.png"
    done = run_hipipe("bench", "--topo", "torus-4x4", "dgx-h100-8x2", "--sizes", "1MiB", "16MiB",
                      "--algos", "ring", "hierarchical", "--plot", png, "--no-progress")
    assert done.returncode == 0, done.stderr
    check_png(png, min_width=1000)


def load_make_pictures():
    spec = importlib.util.spec_from_file_location("make_pictures", REPO / "samples" / "make_pictures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_pictures_come_from_the_samples(tmp_path):
    """The script draws both kinds; the committed copies are real pictures the README shows."""
    make = load_make_pictures()
    check_png(make.timeline(tmp_path))
    check_png(make.nvls_timeline(tmp_path))
    check_png(make.busbw(tmp_path, sizes=(64 << 10, 1 << 20)), min_width=1000)  # two cheap windows draw the same axes
    readme = (REPO / "README.md").read_text()
    for name in ("timeline-dgx-h100-8x4-256MiB.png", "busbw-samples.png"):
        committed = REPO / "samples" / "pictures" / name
        check_png(committed)
        assert f"samples/pictures/{name}" in readme
    check_png(REPO / "samples" / "pictures" / "timeline-nvls-dgx-h100-8x4-256MiB.png")
    assert "timeline-nvls-dgx-h100-8x4-256MiB.png" in (REPO / "docs" / "user-guide.md").read_text()


def test_a_plan_timeline_shows_the_switch_and_the_network_busy_at_once(tmp_path):
    """An in-switch pipeline: rank 0's switch reduces, sends and multicast stores, with the
    network carrying a chunk while the switch reduces a later one; drawn from the command line."""
    from hipipe_compiler.mscclpp.nvls_pipeline import nvls_pipeline_plan
    from hipipe_compiler.mscclpp.writer import write_plan
    from hipipe_compiler.presets import preset
    from hipipe_compiler.sim.plans import time_plan
    from hipipe_compiler.sim.timeline import plan_timeline_bars

    topo = preset("dgx-h100-8x4")
    plan = nvls_pipeline_plan(topo, "pipeline", False, 8)
    bars = plan_timeline_bars(time_plan(plan, topo, 64 << 20, record=True), topo)
    assert {b.row for b in bars} == {"nvlink switch reduce", "net sends", "nvlink multicast"}
    reduces = sorted((b for b in bars if b.row == "nvlink switch reduce"), key=lambda b: b.start_us)
    sends = [b for b in bars if b.row == "net sends"]
    assert [b.chunk for b in reduces] == list(range(8))
    assert any(s.start_us < r.end_us and r.start_us < s.end_us for r in reduces[1:] for s in sends)
    path = tmp_path / "p.json"
    path.write_text(write_plan(plan))
    png = tmp_path / "p.png"
    done = run_hipipe("simulate", path, "--topo", "dgx-h100-8x4", "--size", "64MiB", "--timeline", png)
    assert done.returncode == 0, done.stderr
    check_png(png)
    bad = run_hipipe("simulate", path, "--topo", "dgx-h100-8x4", "--size", "64MiB", "--timeline", png, "--rank", "32")
    assert bad.returncode == 2 and "--rank" in bad.stderr
