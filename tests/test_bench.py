"""Benchmarks: the grid file, the side-by-side rows, and their table, CSV, JSON and plot."""

import csv
import io
import json

import pytest

from hipipe_compiler.bench import BASELINES, Grid, load_grid, plot, run_grid, table, to_csv, to_json
from hipipe_compiler.errors import InputError
from hipipe_compiler.presets import preset

from conftest import REPO, c1p

GRID = REPO / "benchmarks" / "grid.yaml"


def test_shipped_grid_has_the_recommended_configs():
    grid = load_grid(GRID)
    assert sorted(grid.topologies) == ["C1", "C1p", "C3", "C5", "C6", "C6p"]
    assert [t.nranks for t in grid.topologies.values()] == [32, 16, 64, 64, 32, 64]
    # C1p and C6p are C1 and C6 with NCCL's per-protocol latencies (algorithms.md 6.2)
    for scalar, per_protocol in (("C1", "C1p"), ("C6", "C6p")):
        a, b = grid.topologies[scalar], grid.topologies[per_protocol]
        assert a.shape == b.shape and [d.bandwidth for d in a.dimensions] == [d.bandwidth for d in b.dimensions]
        assert not any(d.per_protocol for d in a.dimensions) and all(d.per_protocol for d in b.dimensions)
    assert grid.sizes[0] == 64 << 10 and grid.sizes[-1] == 1 << 30
    assert set(grid.algorithms) == set(BASELINES) | {"hipipe"}


def test_rows_speedups_and_reports(tmp_path):
    grid = Grid({"C1": c1p(4), "C3": preset("torus-4x4")}, (1 << 20, 64 << 20),
                algorithms=("hierarchical", "hierarchical-k4", "themis", "ring"))
    rows = run_grid(grid, progress=False)
    assert len(rows) == 2 * 2 * 4
    for r in rows:
        assert r.time_us >= r.lower_bound_us
        ref = next(x for x in rows if x.topology == r.topology and x.nbytes == r.nbytes and x.algorithm == "hierarchical")
        assert r.speedup == pytest.approx(ref.time_us / r.time_us)
    # pipelining pays at 64 MiB on C1
    c1 = {r.algorithm: r for r in rows if r.topology == "C1" and r.nbytes == 64 << 20}
    assert c1["hierarchical-k4"].time_us < c1["hierarchical"].time_us
    for r in rows:  # one protocol's limit is never below the limit of all protocols
        assert r.lower_bound_us <= r.one_protocol_bound_us * (1 + 1e-12) <= r.time_us * (1 + 1e-12)
    text = table(rows)
    assert "U1" in text and "themis" in text
    first = next(line for line in text.splitlines() if " C1 " in f" {line} ")
    assert f"{rows[0].lower_bound_us / rows[0].time_us:.3f}" in first
    records = list(csv.DictReader(io.StringIO(to_csv(rows))))
    assert len(records) == len(rows) and float(records[0]["time_us"]) == rows[0].time_us
    assert json.loads(to_json(rows))[0]["algorithm"] == rows[0].algorithm
    assert "vs NCCL" not in text  # no NCCL algorithm ran
    png = tmp_path / "bench.png"
    plot(rows, png, grid)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_rows_say_how_much_faster_than_nccls_own_pick():
    grid = Grid({"C1p": c1p(4)}, (1 << 20,),
                algorithms=("hierarchical-LL", "nccl", "nccl-ring-LL", "nccl-tree-LL", "nccl-tree-LL128"))
    rows = {r.algorithm: r for r in run_grid(grid, progress=False)}
    pick = rows["nccl"]
    assert pick.over_nccl == 1.0 and pick.plan.startswith("tree/LL128")  # NCCL's model picks its tree at 1 MiB here
    assert pick.time_us == rows["nccl-tree-LL128"].time_us
    for r in rows.values():
        assert r.over_nccl == pytest.approx(pick.time_us / r.time_us)
    assert "vs NCCL" in table(list(rows.values()))
    assert list(csv.DictReader(io.StringIO(to_csv(list(rows.values())))))[0]["over_nccl"]


def test_bad_grid_files_name_the_field(tmp_path):
    bad = tmp_path / "grid.yaml"
    bad.write_text("sizes: [1MiB]\ntopologies: {}\n")
    with pytest.raises(InputError, match="topologies"):
        load_grid(bad)
    bad.write_text("sizes: [1MiB]\ntopologies:\n  X: {dimensions: [{size: 1, kind: ring, bandwidth: 1, latency: 1}]}\n")
    with pytest.raises(InputError):
        load_grid(bad)
    bad.write_text("sizes: [lots]\ntopologies: {X: torus-4x4}\n")
    with pytest.raises(InputError, match="sizes"):
        load_grid(bad)


def test_unknown_algorithm_is_refused():
    with pytest.raises(InputError, match="unknown algorithm"):
        run_grid(Grid({"C3": preset("torus-4x4")}, (1 << 20,), algorithms=("magic",)), progress=False)


def test_mscclpp_plans_run_in_the_grid_timed_as_plans():
    from hipipe_compiler.bench import MSCCLPP, Grid, run_grid
    from hipipe_compiler.compiler import CompileOptions
    from hipipe_compiler.plan_compiler import compile_plans
    from hipipe_compiler.presets import preset
    from hipipe_compiler.sim.plans import time_plan
    topo = preset("dgx-h100-8x2")
    [row] = run_grid(Grid({"two": topo}, (1 << 20,), "allreduce", (MSCCLPP,)), progress=False)
    assert row.algorithm == MSCCLPP and row.error is None and row.protocol in ("Simple", "LL")
    [cp] = compile_plans(topo, CompileOptions(check=False), 1 << 20, 1 << 20)
    assert row.time_us == time_plan(cp.plans[0], topo, 1 << 20).time_us >= row.lower_bound_us > 0
