"""The README's numbers are rendered from the benchmark results in samples/results/
(benchmarks/readme_tables.py), and a few cells of each are recomputed here and compared."""

from __future__ import annotations

import csv
import importlib.util
import json
import re
from pathlib import Path

import pytest

from hipipe_compiler.bench import Grid, load_grid, run_grid
from hipipe_compiler.presets import load_topology
from hipipe_compiler.training import SimulatedCost, load_profile, plan_training

from conftest import SHARED, run_hipipe

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "samples" / "results"


def benchmark(name: str):
    """A script of benchmarks/, as a module."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def readme_tables():
    return benchmark("readme_tables")


def test_the_readme_is_what_the_saved_results_render():
    tables = readme_tables()
    text = (REPO / "README.md").read_text()
    for part in ("grid", "less-time", "compile-times", "training"):
        assert f"<!-- begin: {part}" in text, f"README.md lost its generated part {part!r}"
    assert tables.render(text, tables.sections()) == text, "run python benchmarks/readme_tables.py"


def test_the_rendering_follows_the_results():
    tables = readme_tables()
    points = tables.grid_points()
    c1 = points[("C1", 1 << 30)]
    u = float(c1["hipipe"]["lower_bound_us"]) / float(c1["hipipe"]["time_us"])
    assert f"**{u:.2f}**" in tables.grid_table(points).splitlines()[2]
    faster = {key: dict(algos, hipipe={**algos["hipipe"], "time_us": str(float(algos["hierarchical"]["time_us"]) / 2)})
              for key, algos in points.items()}
    assert tables.less_time(faster) == "50%"
    machines = tables.grid_points(RESULTS / "bench-machines.csv")
    nccl_twice = {key: {**algos, "nccl": {**algos["nccl"], "time_us": str(2 * float(algos["hipipe"]["time_us"]))}}
                  for key, algos in machines.items()}
    for large in (False, True):
        assert tables.over_nccl(nccl_twice, large).startswith("2.00x (geometric mean; from 2.00x")
    row = tables.machines_table(machines).splitlines()[2]
    ours, nccl = machines[("dgx-h100-8x1", 1 << 30)]["hipipe"], machines[("dgx-h100-8x1", 1 << 30)]["nccl"]
    assert f"**{float(nccl['time_us']) / float(ours['time_us']):.2f}x** (nvls/Simple)" in row


def test_the_fidelity_table_flags_what_misses_its_target(tmp_path):
    tables = readme_tables()
    point = {"log": "a.log", "collective": "allreduce", "nodes": 1, "nccl": "ring/Simple"}
    fits = {"m": {"logs": ["a.log"], "points": [{**point, "nbytes": 1 << 30, "measured_us": 100.0, "predicted_us": 111.0},
                                              {**point, "nbytes": 1 << 20, "measured_us": 100.0, "predicted_us": 80.0}]}}
    path = tmp_path / "fidelity.json"
    path.write_text(json.dumps(fits))
    row = tables.fidelity_table(path).splitlines()[2]
    assert "+11%" in row and "11.0% ✗" in row and "20.0% |" in row and "-20%" in row
    assert tables.fidelity_summary(path) == "0 of 1"
    fits["m"]["points"][0]["predicted_us"] = 109.0
    path.write_text(json.dumps(fits))
    assert tables.fidelity_summary(path) == "1 of 1"
    fits["one"] = {"logs": ["b.log"], "points": [{**point, "log": "b.log", "nbytes": 10 << 30,
                                                   "measured_us": 100.0, "predicted_us": 100.0}]}
    path.write_text(json.dumps(fits))
    assert tables.fidelity_summary(path) == "1 of 1"  # one size proves nothing about the fit
    assert "one size only, 10GiB" in tables.fidelity_table(path).splitlines()[3]


def saved_row(topology: str, nbytes: int, algorithm: str, results: str = "bench-grid.csv") -> dict:
    with open(RESULTS / results, newline="") as fh:
        return next(r for r in csv.DictReader(fh)
                    if (r["topology"], int(r["nbytes"]), r["algorithm"]) == (topology, nbytes, algorithm))


def test_hipipe_is_never_slower_than_a_baseline_in_the_saved_grid():
    """Every point of the saved grid, NCCL's algorithms on their channels included."""
    points = readme_tables().grid_points()
    assert len(points) == 6 * 8
    for (topology, nbytes), algos in points.items():
        ours = float(algos["hipipe"]["time_us"])
        for name, row in algos.items():
            if row["time_us"]:
                assert ours <= float(row["time_us"]) * (1 + 1e-9), (topology, nbytes, name)
        bound1 = float(algos["hipipe"]["one_protocol_bound_us"])
        assert float(algos["hipipe"]["lower_bound_us"]) <= bound1 * (1 + 1e-12) <= ours * (1 + 1e-12)


#: The protocol-aware points that miss their utilisation target (the README's "do not" list);
#: every other one must keep meeting it when the results are remade.
PROTOCOL_MISSES = {("C1p", 256 << 10), ("C1p", 1 << 20), ("C6p", 256 << 10), ("C6p", 1 << 20), ("C6p", 16 << 20),
                   ("C6p", 64 << 20)}


def test_the_protocol_targets_that_hold_keep_holding():
    tables = readme_tables()
    points = tables.grid_points()
    checked = 0
    for (topology, nbytes), algos in points.items():
        want = tables.PROTOCOL_TARGETS.get(nbytes, 0.95 if nbytes >= 64 << 20 else None)
        if topology not in tables.PROTOCOL_ROWS or want is None or (topology, nbytes) in PROTOCOL_MISSES:
            continue
        assert tables.utilisation(algos["hipipe"]) >= want, (topology, nbytes)
        checked += 1
    assert checked == 16 - len(PROTOCOL_MISSES)


@pytest.mark.parametrize("topology,nbytes,algorithms", [
    ("C1", 1 << 20, ("hierarchical", "ring")),
    ("C3", 64 << 20, ("themis", "hierarchical-k4")),
    # the first size of a topology: HiPIPE's search starts fresh there, as in the grid's run
    ("C1", 64 << 10, ("hipipe",)),
])
def test_grid_cells_reproduce(topology, nbytes, algorithms):
    grid = load_grid(REPO / "benchmarks" / "grid.yaml")
    rows = run_grid(Grid({topology: grid.topologies[topology]}, (nbytes,), grid.collective, algorithms), progress=False)
    for row in rows:
        saved = saved_row(topology, nbytes, row.algorithm)
        assert row.time_us == pytest.approx(float(saved["time_us"]), rel=1e-9), row.algorithm


@pytest.mark.parametrize("topology,nbytes", [("dgx-h100-8x2", 1 << 20), ("dgx-a100-8x1", 64 << 20)])
def test_nccls_pick_on_a_calibrated_machine_reproduces(topology, nbytes):
    rows = run_grid(Grid({topology: load_topology(topology)}, (nbytes,), "allreduce", ("nccl",)), progress=False)
    saved = saved_row(topology, nbytes, "nccl", "bench-machines.csv")
    assert rows[0].plan == saved["plan"]
    assert rows[0].time_us == pytest.approx(float(saved["time_us"]), rel=1e-9)


def test_a_fidelity_point_reproduces():
    """The saved calibration of one machine, re-timed at one measured size: the same prediction."""
    from hipipe_compiler.nccl.timing import NcclTimer
    from hipipe_compiler.topology import topology_from_document
    fit = json.loads((RESULTS / "fidelity.json").read_text())["DGX H100, 1 node"]
    point = next(p for p in fit["points"] if p["nbytes"] == 16 << 20)
    run = NcclTimer(topology_from_document(fit["topology"]), point["collective"]).pick(point["nbytes"])
    assert run.label == point["nccl"]
    assert run.time_us == pytest.approx(point["predicted_us"], rel=1e-9)


@pytest.mark.slow
def test_a_training_row_reproduces():
    if not (SHARED / "data" / "layer-profiles.json").is_file():
        pytest.skip(f"{SHARED / 'data' / 'layer-profiles.json'} is absent: no ../shared beside this clone")
    saved = json.loads((RESULTS / "training-table.json").read_text())
    # gpt2's buckets reach the fewest size windows of the torus rows (27; resnet50 57), so its
    # row compiles fastest, and its hipipe policy differs from the other four
    row = next(r for r in saved["rows"] if r["topology"] == "torus-4x4" and r["profile"] == "gpt2"
               and r["times"] == "profile")
    topo = load_topology("torus-4x4")
    report = plan_training(load_profile("gpt2"), SimulatedCost(topo, saved["algorithm"]), topo.nranks)
    for policy, numbers in row["policies"].items():
        assert report[policy].iteration_ms == pytest.approx(numbers["iteration_ms"], rel=1e-9), policy


def test_the_quoted_compile_times_are_the_saved_ones():
    text = (REPO / "README.md").read_text()
    quoted = " ".join(re.search(r"<!-- begin: compile-times.*?<!-- end: compile-times -->", text, re.S).group(0).split())
    saved = json.loads((RESULTS / "compile-hipipe.json").read_text())
    for topology in ("C1", "C3", "C5", "C6"):
        assert f"{saved[topology]['seconds']:.1f} s for {topology}" in quoted


def test_a_1tib_compile_reproduces_what_the_readme_quotes(tmp_path):
    """The README's 1 TiB compile: its quoted times are the saved ones, and compiling again
    picks a plan of the saved U (the search ranks at 4 GiB, the pick is timed at 1 TiB)."""
    text = " ".join((REPO / "README.md").read_text().split())
    saved = json.loads((RESULTS / "compile-huge.json").read_text())
    assert f"takes {saved['compile, one core']['seconds']:.1f} s on one core" in text
    result = run_hipipe("compile", "torus-4x4", "--size", "1TiB", "-o", str(tmp_path / "t.xml"), "--json")
    assert result.returncode == 0, result.stderr
    window = json.loads(result.stdout)["windows"][0]
    assert window["algorithm"] == saved["compile, one core"]["plan"]
    assert window["utilisation"] == pytest.approx(saved["compile, one core"]["utilisation"], rel=1e-9)


def test_the_zoo_is_fixed_and_spans_what_it_promises():
    """24 seeded topologies of 8 to 128 ranks, 2 and 3 dimensions, switches and rings, every one
    with per-protocol latencies and per-call costs; the same on every call."""
    zoo = benchmark("zoo")
    topos = zoo.zoo()
    assert len(topos) == 24
    ranks = [t.nranks for t in topos.values()]
    assert min(ranks) == 8 and max(ranks) == 128
    assert {t.ndims for t in topos.values()} == {2, 3}
    assert {d.kind for t in topos.values() for d in t.dimensions} == {"switch", "ring"}
    assert all(d.per_protocol for t in topos.values() for d in t.dimensions)
    assert all(t.call_cost("LL") > 0 for t in topos.values())
    assert {name: t.to_document() for name, t in zoo.zoo().items()} == {n: t.to_document() for n, t in topos.items()}


def test_a_zoo_point_reproduces():
    """The smallest zoo topology at 1 MiB, compiled and timed again: the saved times."""
    zoo = benchmark("zoo")
    name = "zoo15-torus-4x2"
    rows = run_grid(Grid({name: zoo.zoo()[name]}, (1 << 20,), "allreduce", ("hierarchical", "hipipe")), progress=False)
    for row in rows:
        saved = saved_row(name, 1 << 20, row.algorithm, "zoo.csv")
        assert row.time_us == pytest.approx(float(saved["time_us"]), rel=1e-9), row.algorithm


def test_hipipe_is_never_slower_than_a_baseline_on_the_zoo():
    points = readme_tables().grid_points(RESULTS / "zoo.csv")
    assert len(points) == 24 * 6
    for (topology, nbytes), algos in points.items():
        ours = float(algos["hipipe"]["time_us"])
        for name, row in algos.items():
            if row["time_us"] and name != "nccl":
                assert ours <= float(row["time_us"]) * (1 + 1e-9), (topology, nbytes, name)


def test_an_in_switch_point_reproduces():
    """The saved in-switch comparison (benchmarks/nvls_plans.py): one node at 1 GiB is served
    by the one-node in-switch plan, whose time and NCCL's re-time to the saved numbers."""
    from hipipe_compiler.mscclpp.nvls import nvls_allreduce_plan
    from hipipe_compiler.nccl.timing import NcclTimer
    from hipipe_compiler.plan_compiler import SWITCH_THREADBLOCKS
    from hipipe_compiler.presets import preset
    from hipipe_compiler.sim.plans import time_plan
    rows = json.loads((RESULTS / "nvls-plans.json").read_text())
    row = next(r for r in rows if r["machine"] == "dgx-h100-8x1" and r["nbytes"] == 1 << 30)
    assert row["choice"].startswith("in-switch")
    topo = preset("dgx-h100-8x1")
    plan = nvls_allreduce_plan(topo, "p", False, SWITCH_THREADBLOCKS)
    assert time_plan(plan, topo, row["timed_at"]).time_us == pytest.approx(row["ours_us"], rel=1e-9)
    assert NcclTimer(topo, "allreduce").pick(row["timed_at"]).time_us == pytest.approx(row["nccl_us"], rel=1e-9)


def test_the_free_nvlink_ceiling_reproduces():
    """The saved U with NVLink made free (benchmarks/nvls_plans.py) on four H100 nodes at 64 MiB:
    the best of the in-switch pipelines re-times to it on the free machine, and stays below the
    0.90 that the NVLS issue asks of the real one."""
    from hipipe_compiler.plan_compiler import size_multiple, switch_candidates
    from hipipe_compiler.presets import preset
    from hipipe_compiler.sim.plans import time_plan
    rows = json.loads((RESULTS / "nvls-plans.json").read_text())
    row = next(r for r in rows if r["machine"] == "dgx-h100-8x4" and r["nbytes"] == 64 << 20)
    topo = preset("dgx-h100-8x4")
    free = benchmark("nvls_plans").free_nvlink(topo)
    plans = [build(False) for build in switch_candidates(topo, "p")]
    best = min(time_plan(p, free, row["nbytes"]).time_us for p in plans if row["nbytes"] % size_multiple(p) == 0)
    assert best == pytest.approx(row["free_nvlink_us"], rel=1e-9)
    assert row["lower_bound_us"] / best < 0.90
