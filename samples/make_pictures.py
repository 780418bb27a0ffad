"""Draw the README's pictures from the bundled samples (run from the checkout root):

    python samples/make_pictures.py [OUTDIR]      # default samples/pictures

- timeline-dgx-h100-8x4-256MiB.png: the HiPIPE all-reduce compiled for
  samples/topologies/dgx-h100-8x4.yaml at 256 MiB, simulated, one row per dimension;
- timeline-nvls-dgx-h100-8x4-256MiB.png: an MSCCL++ in-switch pipeline on the same machine
  (16 chunks), timed at 256 MiB: the switch reduces, the network sends and the multicast
  stores of rank 0, busy at once on different chunks;
- busbw-samples.png: busbw against message size for ring, hierarchical, themis, NCCL's own
  pick (on the H100 sample, a calibrated machine) and HiPIPE on the two-dimensional samples,
  with the physical limit.
"""

from __future__ import annotations

import sys
from pathlib import Path

SAMPLES = Path(__file__).resolve().parent
TIMELINE_TOPOLOGY = SAMPLES / "topologies" / "dgx-h100-8x4.yaml"
TIMELINE_SIZE = 256 << 20
BENCH_TOPOLOGIES = ("dgx-h100-8x4.yaml", "torus-4x4.yaml")
BENCH_SIZES = tuple(1 << k for k in range(16, 31, 2))  # 64 KiB .. 1 GiB
BENCH_ALGORITHMS = ("ring", "hierarchical", "themis", "nccl", "hipipe")  # nccl: NCCL's pick, where NCCL runs


def timeline(out: Path) -> Path:
    """Compile, simulate and draw the sample all-reduce."""
    from hipipe_compiler.compiler import CompileOptions, compile_range
    from hipipe_compiler.sim import render_timeline, simulate
    from hipipe_compiler.presets import load_topology

    topo = load_topology(TIMELINE_TOPOLOGY)
    program = compile_range(topo, CompileOptions(), TIMELINE_SIZE, TIMELINE_SIZE)[0].program
    path = out / f"timeline-{topo.label}-256MiB.png"
    render_timeline(simulate(program, topo, TIMELINE_SIZE, record=True), program, topo, path)
    return path


def nvls_timeline(out: Path) -> Path:
    """Build, time and draw the sample in-switch pipeline."""
    from hipipe_compiler.mscclpp.nvls_pipeline import nvls_pipeline_plan
    from hipipe_compiler.presets import load_topology
    from hipipe_compiler.sim.plans import time_plan
    from hipipe_compiler.sim.timeline import render_plan_timeline

    topo = load_topology(TIMELINE_TOPOLOGY)
    plan = nvls_pipeline_plan(topo, "in-switch pipeline, 16 chunks", False, 16)
    path = out / f"timeline-nvls-{topo.label}-256MiB.png"
    render_plan_timeline(time_plan(plan, topo, TIMELINE_SIZE, record=True), plan.name, topo, path)
    return path


def busbw(out: Path, sizes: tuple[int, ...] = BENCH_SIZES) -> Path:
    """The bench plot of the two-dimensional samples."""
    from hipipe_compiler.bench import Grid, plot, run_grid
    from hipipe_compiler.presets import load_topology

    topos = {t.label: t for t in (load_topology(SAMPLES / "topologies" / name) for name in BENCH_TOPOLOGIES)}
    grid = Grid(topos, sizes, algorithms=BENCH_ALGORITHMS)
    path = out / "busbw-samples.png"
    plot(run_grid(grid, progress=sys.stderr.isatty()), path, grid)
    return path


def main(argv: list[str]) -> None:
    out = Path(argv[0]) if argv else SAMPLES / "pictures"
    out.mkdir(parents=True, exist_ok=True)
    for path in (timeline(out), nvls_timeline(out), busbw(out)):
        print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
