"""Benchmarks: every algorithm on every topology and size of a grid, lowered to real MSCCL
programs and timed by the simulator side by side.

>>> grid = Grid({"C1": load_topology("dgx-h100-8x4")}, (1 << 20,), "allreduce", ("hierarchical", "ring"))
>>> rows = run_grid(grid, progress=False)
>>> [(r.algorithm, r.speedup is not None) for r in rows]
[('hierarchical', True), ('ring', True)]
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from .documents import load_document, validate_document
from .errors import InputError, PlanError
from .files import write_atomic
from .lower import lower, lowering_key
from .msccl.program import Program
from .optimizer.search import ABLATIONS, Search, optimize_window
from .schedule import Plan, hierarchical_plan, ring_plan, themis_plan
from .bounds import lower_bound_us, one_protocol_bound_us
from .nccl.timing import NcclTimer, nccl_machine
from .sim import SimulationError, simulate_exact
from .topology import Topology, topology_from_document
from .presets import load_topology
from .units import MAX_BYTES, format_size, parse_size

PlanFor = Callable[[Topology, str, int, str], Plan]


def _hier(k: int) -> PlanFor:
    def build(topo: Topology, coll: str, nbytes: int, proto: str) -> Plan:
        return hierarchical_plan(topo, coll, k, proto, min_bytes=nbytes, max_bytes=nbytes, nominal_bytes=nbytes,
                                 label="hierarchical" if k == 1 else f"hierarchical-k{k}")
    return build


def _with_protocol(build: PlanFor, protocol: str) -> PlanFor:
    """A baseline under a fixed protocol, whatever the grid's."""
    return lambda topo, coll, nbytes, _proto: build(topo, coll, nbytes, protocol)


#: The baselines (algorithms.md 5): plans through the normal lowering.
BASELINES: dict[str, PlanFor] = {
    "ring": lambda topo, coll, nbytes, proto: ring_plan(topo, coll, 1, proto, nbytes, nbytes, nbytes),
    "hierarchical": _hier(1),
    "hierarchical-k4": _hier(4),
    "hierarchical-k16": _hier(16),
    "themis": lambda topo, coll, nbytes, proto: themis_plan(topo, coll, 16, proto, nbytes, nbytes, nbytes),
    **{f"hierarchical-{p}": _with_protocol(_hier(1), p) for p in ("LL", "LL128")},
}
#: NCCL as it really runs (nccl/timing.py): `nccl` is its own pick at each size, the others
#: one algorithm (and protocol) forced as NCCL_ALGO / NCCL_PROTO would, set up as NCCL sets it
#: up on the machine.
NCCL_RUNS: dict[str, tuple[str | None, str | None]] = {
    "nccl": (None, None),
    **{f"nccl-{a}-{p}": (a, p) for a in ("ring", "tree") for p in ("LL", "LL128", "Simple")},
    "nccl-nvls": ("nvls", "Simple"), "nccl-nvlstree": ("nvlstree", "Simple"),
}
REFERENCE = "hierarchical"
#: The row every "vs NCCL" figure compares with: what NCCL runs by itself.
NCCL_PICK = "nccl"
#: HiPIPE and the restricted searches of its ablation (hipipe.ABLATIONS).
OPTIMIZED = ("hipipe", "hipipe-uniform", "hipipe-lp-1order", "hipipe-lp-mixed", "hipipe-fixed-k8")
#: HiPIPE's schedules as MSCCL++ plans (plan_compiler.py), timed as plans.
MSCCLPP = "hipipe-mscclpp"


def mscclpp_plans() -> Callable[[Topology, str, int], tuple[Program, dict[str, Any]]]:
    """The plan `hipipe compile --backend mscclpp` keeps for one size, with its own time."""
    from .compiler import CompileOptions
    from .plan_compiler import compile_plans, timed_size
    from .sim.plans import time_plan

    def run(topo: Topology, coll: str, size: int) -> tuple[Program, dict[str, Any]]:
        [cp] = compile_plans(topo, CompileOptions(collective=coll, check=False), size, size)
        plan = cp.plans[0]
        return cp.program, {"plan": cp.details.get("choice", cp.window.plan.label),
                            "result": time_plan(plan, topo, timed_size(plan, size))}
    return run


def optimized(name: str) -> Callable[[Topology, str, int], tuple[Program, dict[str, Any]]]:
    """An algorithm that searches its own plan for each size (HiPIPE, or an ablation of it)."""
    searches: dict[tuple[Topology, str], Search] = {}

    def run(topo: Topology, coll: str, size: int) -> tuple[Program, dict[str, Any]]:
        search = searches.setdefault((topo, coll), Search(topo, coll))
        forced, baselines = ABLATIONS.get(name, (None, True))
        choice = optimize_window(search, size, size, forced=forced, baselines=baselines)
        for plan in (choice.plan, *choice.alternatives):
            try:
                return lower(plan), {"plan": choice.knobs.label if choice.knobs else plan.label}
            except PlanError:
                continue
        raise PlanError(f"{name}: no candidate fits the runtime on {topo.label}")
    return run


@dataclass(frozen=True)
class Grid:
    """Named topologies, message sizes, one collective and the algorithms to compare."""

    topologies: dict[str, Topology]
    sizes: tuple[int, ...]
    collective: str = "allreduce"
    algorithms: tuple[str, ...] = tuple(BASELINES)
    protocol: str = "Simple"


@dataclass(frozen=True)
class BenchRow:
    """One algorithm at one size on one topology; `error` says why there is no time."""

    topology: str
    nranks: int
    nbytes: int
    algorithm: str
    time_us: float | None
    lower_bound_us: float | None
    busbw_GBps: float | None
    speedup: float | None = None  # time of the reference (unpipelined hierarchical) / this time
    over_nccl: float | None = None  # time of NCCL's own pick at this point / this time
    error: str | None = None
    details: dict[str, Any] | None = None
    protocol: str | None = None  # of the program that ran
    plan: str | None = None  # what the algorithm chose (HiPIPE's knobs, or the baseline's label)
    one_protocol_bound_us: float | None = None  # T_LB1 (cost-model.md 4.1)

    @property
    def t_over_lb(self) -> float | None:
        if self.time_us is None or not self.lower_bound_us:
            return None
        return self.time_us / self.lower_bound_us

    @property
    def utilisation1(self) -> float | None:
        """U1 = T_LB1 / T: against the limit of a program that runs one protocol."""
        if self.time_us is None or not self.one_protocol_bound_us:
            return None
        return self.one_protocol_bound_us / self.time_us


def load_grid(path: str | Path) -> Grid:
    """A grid file (schemas/grid.schema.json): topologies by preset, file or inline definition."""
    source = str(path)
    doc = load_document(path)
    validate_document(doc, "grid.schema.json", source)
    topos: dict[str, Topology] = {}
    for name, spec in doc["topologies"].items():
        if isinstance(spec, str):
            candidate = Path(path).parent / spec
            topos[name] = load_topology(candidate if candidate.is_file() else spec)
        else:
            topos[name] = topology_from_document({"name": name, **spec}, f"{source}: topologies.{name}")
    sizes = tuple(parse_size(s, "sizes", source, MAX_BYTES) for s in doc["sizes"])
    if min(sizes) < 1:
        raise InputError(source, "sizes", f"expected sizes of at least 1 byte, got {min(sizes)}")
    algos = tuple(doc.get("algorithms", BASELINES))
    check_algorithms(algos, BASELINES, source, "algorithms")
    return Grid(topos, sizes, doc.get("collective", "allreduce"), algos, doc.get("protocol", "Simple"))


def check_algorithms(names: Sequence[str], known: dict[str, Any], source: str | None = None,
                     field: str = "--algos") -> None:
    for name in names:
        if name not in known and name not in OPTIMIZED and name not in NCCL_RUNS and name != MSCCLPP:
            raise InputError(source, field, f"unknown algorithm {name!r}; expected some of "
                             f"{', '.join([*known, *NCCL_RUNS, *OPTIMIZED, MSCCLPP])}")


def run_grid(grid: Grid, progress: bool = True, builders: dict[str, PlanFor] | None = None,
             extra: dict[str, Callable[[Topology, str, int], tuple[Program, dict[str, Any]]]] | None = None
             ) -> list[BenchRow]:
    """Compile and simulate every (topology, size, algorithm); returns one row each.

    `extra` adds algorithms that produce their own program (the HiPIPE optimizer).
    """
    builders = dict(BASELINES if builders is None else builders)
    extra = dict(extra or {})
    for name in grid.algorithms:
        if name in OPTIMIZED and name not in extra:
            extra[name] = optimized(name)
        if name == MSCCLPP and name not in extra:
            extra[name] = mscclpp_plans()
    check_algorithms(grid.algorithms, {**builders, **extra})
    tasks = [(name, topo, size, algo) for name, topo in grid.topologies.items() for size in grid.sizes
             for algo in grid.algorithms]
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(tasks), desc="bench", unit="run", leave=False)
    cache: dict[Any, Program] = {}
    timers: dict[str, NcclTimer] = {}
    rows: list[BenchRow] = []
    for name, topo, size, algo in tasks:
        if bar is not None:
            bar.set_postfix_str(f"{name} {format_size(size)} {algo}")
        if algo in NCCL_RUNS:
            if name not in timers:  # one per topology: it caches NCCL's programs across sizes
                timers[name] = NcclTimer(topo, grid.collective)
            rows.append(_run_nccl(name, topo, size, algo, timers[name]))
        else:
            rows.append(_run_one(name, topo, size, algo, grid, builders, extra, cache))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return _with_speedups(rows)


def _run_one(name: str, topo: Topology, size: int, algo: str, grid: Grid, builders: dict, extra: dict,
             cache: dict) -> BenchRow:
    details = None
    try:
        if algo in extra:
            program, details = extra[algo](topo, grid.collective, size)
        else:
            plan = builders[algo](topo, grid.collective, size, grid.protocol)
            key = lowering_key(plan)
            if key not in cache:
                cache[key] = lower(plan)
            program = cache[key]
        result = (details or {}).pop("result", None) or simulate_exact(program, topo, size)
    except (PlanError, SimulationError) as exc:
        return BenchRow(name, topo.nranks, size, algo, None, None, None, error=str(exc))
    return BenchRow(name, topo.nranks, size, algo, result.time_us, result.lower_bound_us, result.busbw_GBps,
                    details=details, protocol=program.protocol, plan=(details or {}).get("plan", algo),
                    one_protocol_bound_us=result.one_protocol_bound_us)


def _run_nccl(name: str, topo: Topology, size: int, algo: str, timer: NcclTimer) -> BenchRow:
    """NCCL's own pick, or one of its algorithms forced, timed as NCCL runs it."""
    algorithm, protocol = NCCL_RUNS[algo]
    guess = nccl_machine(topo)
    if guess is not None:
        return BenchRow(name, topo.nranks, size, algo, None, None, None, error=f"no NCCL to compare with: {guess}")
    try:
        run = timer.pick(size) if algorithm is None else timer.run(size, algorithm, protocol or "Simple")
    except PlanError as exc:
        return BenchRow(name, topo.nranks, size, algo, None, None, None, error=str(exc))
    bound = lower_bound_us(topo, timer.collective, size)
    return BenchRow(name, topo.nranks, size, algo, run.time_us, bound, run.busbw_GBps, protocol=run.protocol,
                    plan=f"{run.label} on {run.channels} channel(s)",
                    one_protocol_bound_us=one_protocol_bound_us(topo, timer.collective, size))


def _with_speedups(rows: list[BenchRow]) -> list[BenchRow]:
    """Rows with their speedup over the reference and over NCCL's own pick at the same point,
    where those ran."""
    ref = {(r.topology, r.nbytes): r.time_us for r in rows if r.algorithm == REFERENCE and r.time_us}
    nccl = {(r.topology, r.nbytes): r.time_us for r in rows if r.algorithm == NCCL_PICK and r.time_us}
    out = []
    for r in rows:
        base, fastest = ref.get((r.topology, r.nbytes)), nccl.get((r.topology, r.nbytes))
        out.append(replace(r, speedup=base / r.time_us if base and r.time_us else None,
                           over_nccl=fastest / r.time_us if fastest and r.time_us else None))
    return out


# -- reports ------------------------------------------------------------------------------------


def table(rows: Sequence[BenchRow]) -> str:
    """The side-by-side table: time, U and U1, busbw and speedup over the unpipelined
    hierarchical and, where `nccl` ran, over NCCL's own pick (which its rows name)."""
    from tabulate import tabulate
    nccl = any(r.over_nccl for r in rows)
    body = []
    for r in rows:
        if r.time_us is None:
            cells = [r.topology, format_size(r.nbytes), r.algorithm, "-", "-", "-", "-", "-", *(["-"] if nccl else []),
                     (r.error or "")[:60]]
        else:
            cells = [r.topology, format_size(r.nbytes), r.algorithm, f"{r.time_us:,.1f}",
                     f"{1 / r.t_over_lb:.3f}" if r.t_over_lb else "-",
                     f"{r.utilisation1:.3f}" if r.utilisation1 else "-", f"{r.busbw_GBps:,.1f}",
                     f"{r.speedup:.2f}x" if r.speedup else "-", *([f"{r.over_nccl:.2f}x" if r.over_nccl else "-"] if nccl else []),
                     r.plan if r.algorithm in NCCL_RUNS else ""]
        body.append(cells)
    headers = ["topology", "size", "algorithm", "time us", "U", "U1", "busbw GB/s", f"vs {REFERENCE}",
               *(["vs NCCL"] if nccl else []), "note"]
    return tabulate(body, headers=headers, disable_numparse=True)


def to_records(rows: Sequence[BenchRow]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        d = asdict(r)
        d["t_over_lb"] = r.t_over_lb
        d["utilisation1"] = r.utilisation1
        if d.get("details") is None:
            d.pop("details", None)
        out.append(d)
    return out


def to_csv(rows: Sequence[BenchRow]) -> str:
    records = to_records(rows)
    fields = ["topology", "nranks", "nbytes", "algorithm", "time_us", "lower_bound_us", "t_over_lb",
              "one_protocol_bound_us", "utilisation1", "busbw_GBps", "speedup", "over_nccl", "protocol", "plan", "error"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return buf.getvalue()


def to_json(rows: Sequence[BenchRow]) -> str:
    return json.dumps(to_records(rows), indent=2) + "\n"


def plot(rows: Sequence[BenchRow], path: str | Path, grid: Grid) -> None:
    """busbw against message size, one line per algorithm, one panel per topology, with the
    physical limit (the busbw at T_LB) drawn as a dashed line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(grid.topologies)
    cols = min(2, len(names))
    nrows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6.4 * cols, 4.2 * nrows), squeeze=False)
    for i, name in enumerate(names):
        ax = axes[i // cols][i % cols]
        mine = [r for r in rows if r.topology == name]
        for colour, algo in enumerate(grid.algorithms):  # an algorithm keeps its colour in every panel
            pts = sorted((r.nbytes, r.busbw_GBps) for r in mine if r.algorithm == algo and r.busbw_GBps)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=algo,
                        color=f"C{colour % 10}")
        limit = sorted({(r.nbytes, r.busbw_GBps * r.time_us / r.lower_bound_us) for r in mine
                        if r.busbw_GBps and r.lower_bound_us})
        if limit:
            by_size: dict[int, float] = {}
            for size, bw in limit:
                by_size[size] = bw
            xs = sorted(by_size)
            ax.plot(xs, [by_size[x] for x in xs], "k--", linewidth=1, label="physical limit")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{name} ({grid.topologies[name].nranks} ranks)")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for j in range(len(names), nrows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle(f"{grid.collective}: bus bandwidth by message size (simulated)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=Path(path).suffix.lstrip(".") or "png", dpi=120)
    plt.close(fig)
    write_atomic(path, buf.getvalue())
