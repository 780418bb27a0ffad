"""The README's (and docs/pytorch.md's) result tables and numbers, rendered from the benchmark
results in samples/results/ (never typed by hand). Each generated part sits between
`<!-- begin: NAME ... -->` and `<!-- end: NAME -->` markers.

Regenerate the results, then the README:

    hipipe bench --no-progress --csv samples/results/bench-grid.csv
    hipipe bench --no-progress --topo dgx-h100-8x1 dgx-h100-8x2 dgx-h100-8x4 dgx-h100-8x8 dgx-a100-8x1 dgx-a100-8x2 \
        --sizes 64KiB 1MiB 16MiB 64MiB 256MiB 1GiB --algos nccl hipipe --csv samples/results/bench-machines.csv
    python benchmarks/fidelity.py --save            # needs ../shared
    python benchmarks/compile_hipipe.py --save
    python benchmarks/compile_speed.py --save
    python benchmarks/compile_ratio.py --save       # against an earlier commit, in one run
    python benchmarks/compile_huge.py --save
    python benchmarks/training_table.py --save
    python benchmarks/coverage.py --save
    python benchmarks/zoo.py --save                 # tens of minutes
    python benchmarks/search_reference.py --save    # tens of minutes
    python benchmarks/nvls_plans.py --save          # minutes
    python benchmarks/readme_tables.py            # rewrites README.md and docs/pytorch.md; --check only compares

tests/test_readme_results.py checks that README.md is what this renders, and re-runs a few
cells of each table.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import re
import sys
import textwrap
from pathlib import Path

from tabulate import tabulate

from hipipe_compiler.windows import window_label

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "samples" / "results"
README = REPO / "README.md"
#: The documents with generated parts.
DOCUMENTS = (README, REPO / "docs" / "pytorch.md", REPO / "docs" / "mscclpp.md")
GRID_ROWS = {
    "C1": "C1: 8 × 4, NVSwitch + IB", "C3": "C3: 4 × 4 torus", "C5": "C5: 4 × 4 × 4 torus, falling bandwidth",
    "C6": "C6: 2 ring × 8 FC × 4 switch",
}
#: The rows with NCCL's per-protocol latencies (cost-model.md 1).
PROTOCOL_ROWS = {"C1p": "C1p: C1, NCCL's latencies", "C6p": "C6p: C6, NCCL's latencies"}
#: Utilisation targets of the protocol-aware rows, by size (issue: protocols).
PROTOCOL_TARGETS = {64 << 10: 0.45, 256 << 10: 0.40, 1 << 20: 0.40, 4 << 20: 0.60, 16 << 20: 0.85}
#: The calibrated machines of the comparison with NCCL (samples/results/bench-machines.csv).
MACHINE_ROWS = {
    "dgx-h100-8x1": "DGX H100, 1 node", "dgx-h100-8x2": "DGX H100, 2 nodes", "dgx-h100-8x4": "DGX H100, 4 nodes",
    "dgx-h100-8x8": "DGX H100, 8 nodes", "dgx-a100-8x1": "DGX A100, 1 node", "dgx-a100-8x2": "DGX A100, 2 nodes",
}
#: The fidelity table's sizes.
FIDELITY_SIZES = (64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30, 4 << 30)
#: Algorithms of the grid that are ours (the rest are baselines).
OURS = ("hipipe",)
POLICIES = ("wfbp", "ddp", "dear", "pipedap", "hipipe")


def grid_points(path: Path = RESULTS / "bench-grid.csv") -> dict[tuple[str, int], dict[str, dict]]:
    """(topology, bytes) -> algorithm -> its row of `hipipe bench --csv`."""
    points: dict[tuple[str, int], dict[str, dict]] = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            points.setdefault((row["topology"], int(row["nbytes"])), {})[row["algorithm"]] = row
    return points


def utilisation(row: dict) -> float | None:
    return float(row["lower_bound_us"]) / float(row["time_us"]) if row["time_us"] else None


def utilisation1(row: dict) -> float | None:
    """U1 = T_LB1 / T (cost-model.md 4.1)."""
    return float(row["one_protocol_bound_us"]) / float(row["time_us"]) if row["time_us"] else None


def size_label(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def grid_table(points: dict, rows: dict[str, str] = GRID_ROWS, protocols: bool = False) -> str:
    """U = T_LB / T of ours, its U1 = T_LB1 / T where that differs, and (in brackets) the best
    baseline's U, per topology and size; with `protocols`, also the protocol our program runs."""
    sizes = sorted({size for topo, size in points if topo in rows})
    title = "U (/ U1), HiPIPE " + ("and its protocol " if protocols else "") + "(best baseline's U)"
    lines = [f"| {title} | " + " | ".join(size_label(s) for s in sizes) + " |", "|---" * (len(sizes) + 1) + "|"]
    for topo, label in rows.items():
        cells = []
        for size in sizes:
            algos = points[(topo, size)]
            ours = algos["hipipe"]
            best = max(utilisation(r) or 0.0 for a, r in algos.items() if a not in OURS)
            u, u1 = f"{utilisation(ours):.2f}", f"{utilisation1(ours):.2f}"
            proto = f" {ours['protocol']}" if protocols else ""
            cells.append(f"**{u}**" + ("" if u1 == u else f" / {u1}") + f"{proto} ({best:.2f})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machines_table(points: dict) -> str:
    """Per calibrated machine and size: how much faster than NCCL's own pick ours is (and which
    NCCL algorithm and protocol that pick ran), and ours' U and U1."""
    sizes = sorted({size for _topo, size in points})
    lines = ["| speedup over NCCL's pick (what NCCL runs); U / U1 | "
             + " | ".join(size_label(s) for s in sizes) + " |", "|---" * (len(sizes) + 1) + "|"]
    for topo, label in MACHINE_ROWS.items():
        cells = []
        for size in sizes:
            algos = points[(topo, size)]
            ours, nccl = algos["hipipe"], algos["nccl"]
            speedup = float(nccl["time_us"]) / float(ours["time_us"])
            run = nccl["plan"].split(" on ")[0]
            cells.append(f"**{speedup:.2f}x** ({run}); {utilisation(ours):.2f} / {utilisation1(ours):.2f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def over_nccl(points: dict, large: bool = False) -> str:
    """How much faster ours is than NCCL's own pick on the calibrated machines, up to 1 MiB
    (or, if `large`, from 64 MiB): the geometric mean, and the smallest and largest gain."""
    gains = []
    for (topo, size), algos in sorted(points.items()):
        if topo in MACHINE_ROWS and (size >= 64 << 20 if large else size <= 1 << 20):
            gains.append((float(algos["nccl"]["time_us"]) / float(algos["hipipe"]["time_us"]), f"{topo} {size_label(size)}"))
    mean = math.exp(sum(math.log(g) for g, _where in gains) / len(gains))
    (low, at_low), (high, at_high) = min(gains), max(gains)
    return f"{mean:.2f}x (geometric mean; from {low:.2f}x at {at_low} to {high:.2f}x at {at_high})"


def fidelity_table(path: Path = RESULTS / "fidelity.json") -> str:
    """Per shared log: the calibrated model's error at a few sizes, and its worst from 64 MiB
    and from 1 to 32 MiB (the targets: 10 % and 25 %)."""
    data = json.loads(path.read_text())
    lines = ["| log (machine) | " + " | ".join(size_label(s) for s in FIDELITY_SIZES)
             + " | worst from 64MiB | worst 1-32MiB |", "|---" * (len(FIDELITY_SIZES) + 3) + "|"]
    for machine, fit in data.items():
        label = ("held out: " if "calibrated_on" in fit else "") + machine
        for log in fit["logs"]:
            mine = {p["nbytes"]: p for p in fit["points"] if p["log"] == log}
            only = f"; one size only, {size_label(next(iter(mine)))}" if len(mine) == 1 else ""
            cells = []
            for size in FIDELITY_SIZES:
                p = mine.get(size)
                cells.append("-" if p is None else f"{100 * (p['predicted_us'] / p['measured_us'] - 1):+.0f}%")
            big = [abs(p["predicted_us"] / p["measured_us"] - 1) for n, p in mine.items() if n >= 64 << 20]
            mid = [abs(p["predicted_us"] / p["measured_us"] - 1) for n, p in mine.items() if (1 << 20) <= n <= (32 << 20)]
            worst = [f"{100 * max(big):.1f}%" + ("" if max(big) <= 0.10 else " ✗") if big else "-",
                     f"{100 * max(mid):.1f}%" + ("" if max(mid) <= 0.25 else " ✗") if mid else "-"]
            lines.append(f"| {log} ({label}{only}) | " + " | ".join(cells) + " | " + " | ".join(worst) + " |")
    return "\n".join(lines)


def fidelity_summary(path: Path = RESULTS / "fidelity.json") -> str:
    """How many shared logs (of more than one size) the model calibrated on them reproduces
    within both targets."""
    data = json.loads(path.read_text())
    held, logs = 0, 0
    for fit in data.values():
        for log in fit["logs"] if "calibrated_on" not in fit else ():
            errors = [(p["nbytes"], abs(p["predicted_us"] / p["measured_us"] - 1)) for p in fit["points"] if p["log"] == log]
            if len(errors) < 2:
                continue
            logs += 1
            if all(e <= 0.10 for n, e in errors if n >= 64 << 20) and all(e <= 0.25 for n, e in errors if (1 << 20) <= n <= (32 << 20)):
                held += 1
    return f"{held} of {logs}"


def protocol_targets(points: dict) -> str:
    """Which protocol targets hold, and by how much the others miss."""
    held, missed = [], []
    for (topo, size), algos in sorted(points.items()):
        want = PROTOCOL_TARGETS.get(size, 0.95 if size >= 64 << 20 else None)
        if topo not in PROTOCOL_ROWS or want is None:
            continue
        u = utilisation(algos["hipipe"]) or 0.0
        (held if u >= want else missed).append(f"{topo} {size_label(size)} ({u:.3f} against {want:.2f})")
    text = f"{len(held)} of {len(held) + len(missed)} protocol-aware points meet their target"
    return text + (f"; {', '.join(missed)} do not" if missed else "")


def less_time(points: dict) -> str:
    """Mean time saved by ours against the unpipelined hierarchical all-reduce, in percent."""
    saved = [1 - float(algos["hipipe"]["time_us"]) / float(algos["hierarchical"]["time_us"])
             for (topo, _size), algos in points.items() if topo in GRID_ROWS]
    return f"{100 * sum(saved) / len(saved):.0f}%"




def _joined(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def compile_times() -> str:
    data = json.loads((RESULTS / "compile-hipipe.json").read_text())
    speed = json.loads((RESULTS / "compile-speed.json").read_text())
    grid = ", ".join(f"{data[t]['seconds']:.1f} s for {t}" for t in ("C1", "C3", "C5", "C6") if t in data)
    pod = data.get("pod-8x4x8x4 (1024)")
    pod_text = f" and {pod['seconds'] / 60:.1f} minutes for the 1024-rank `pod-8x4x8x4` preset" if pod else ""
    one = speed["1024 (8x4x8x4)"]
    missed = [t for t in ("C1", "C3", "C5", "C6") if t in data and data[t]["seconds"] > harness.GRID_COMPILE_LIMIT_S]
    missed += ["the pod"] if pod and pod["seconds"] > harness.POD_COMPILE_LIMIT_S else []
    status = (f" ({_joined(missed)} {'misses' if len(missed) == 1 else 'miss'} them in this measurement, on a shared "
              f"machine whose speed varies from run to run)" if missed else "")
    return textwrap.fill(
           f"Compiling a whole 1 KiB–4 GiB directory (`hipipe compile TOPO --sizes 1KiB:4GiB`, end to end on one "
            f"core; `python benchmarks/compile_hipipe.py`) takes {grid}{pod_text}; the targets are a minute per grid "
            f"topology and five minutes for the pod{status}. One hierarchical all-reduce program for all 1,024 "
            f"ranks of the pod (`hipipe compile pod-8x4x8x4 --algo hierarchical --size 1GiB`) takes {one['seconds']:.1f} s end to end, "
            f"{one['phases']['verify']:.1f} s of it proving the program (`python benchmarks/compile_speed.py`; "
            f"target {harness.POD_HIERARCHICAL_LIMIT_S:.0f} s"
            f"{', missed in this measurement' if one['seconds'] > harness.POD_HIERARCHICAL_LIMIT_S else ''})."
            f"{compile_ratio()}{compile_huge()}", width=92)


def compile_huge() -> str:
    """One 1 TiB call compiled, and its file simulated (benchmarks/compile_huge.py)."""
    path = RESULTS / "compile-huge.json"
    if not path.exists():
        return ""
    data = json.loads(path.read_text())
    one, default, sim = data["compile, one core"], data["compile, default workers"], data["simulate"]
    held = (max(one["seconds"], default["seconds"]) <= harness.HUGE_COMPILE_LIMIT_S
            and sim["seconds"] <= harness.HUGE_SIMULATE_LIMIT_S)
    return (f" `hipipe compile torus-4x4 --size 1TiB` takes {one['seconds']:.1f} s on one core and "
            f"{default['seconds']:.1f} s with the default workers (U {one['utilisation']:.3f}), and `hipipe simulate` "
            f"of its file at 1 TiB {sim['seconds']:.1f} s (`python benchmarks/compile_huge.py`; targets a minute and "
            f"10 s, {'met' if held else 'missed'}).")


def compile_ratio() -> str:
    """The directories' compile time against an earlier commit's, from one run of both."""
    path = RESULTS / "compile-ratio.json"
    if not path.exists():
        return ""
    data = json.loads(path.read_text())
    base, runs = data["base"], data["topologies"]
    ratios = _joined([f"{r['ratio']:.2f} ({t.split()[0]})" for t, r in runs.items()])
    held = all(r["ratio"] <= 1 / 3 for r in runs.values())
    worst = max(r["worst_window_ratio"] for r in runs.values())
    cores = data.get("cores")
    cpu = ""
    if cores and all("cpu_seconds" in r for r in runs.values()):
        cpu_ratios = [r["cpu_seconds"] / r["base_cpu_seconds"] for r in runs.values()]
        cpu = (f" on {cores} cores, with `--jobs {min(cores, 8)}` by default (their CPU time: {min(cpu_ratios):.2f} to "
               f"{max(cpu_ratios):.2f} times that commit's)")
    programs = (f"no window's program is slower than that commit's by more than {100 * (harness.SLOWER - 1):.1f} % (at most "
                f"{worst:.4f} times its time)" if worst <= harness.SLOWER else
                f"one window's program takes {worst:.4f} times that commit's time (the limit is {harness.SLOWER}: missed)")
    return (f" Against the code of commit {base}, both compiled one after the other in one run (`python "
            f"benchmarks/compile_ratio.py`), the directories take {ratios} times as long{cpu}, and {programs}; "
            f"the target of a third of that commit's time is {'met' if held else 'missed'}.")


def training_table() -> str:
    data = json.loads((RESULTS / "training-table.json").read_text())
    rows = []
    for r in data["rows"]:
        pol = r["policies"]
        best_other = min(v["iteration_ms"] for p, v in pol.items() if p != "hipipe")
        rows.append([r["topology"], r["profile"], r["times"], f"{r['compute_ms']:.1f}",
                     *(f"{pol[p]['iteration_ms']:.2f} ({pol[p]['exposed_comm_ms']:.2f})" for p in POLICIES),
                     f"{best_other / pol['hipipe']['iteration_ms']:.3f}"])
    headers = ["topology", "profile", "times", "compute ms", *(f"{p} ms (exposed)" for p in POLICIES), "best other / hipipe"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def coverage_table(runs: list[dict]) -> str:
    """Per profile: DDP's buckets served unpadded, by the default directory and by the others
    of benchmarks/coverage.py (`runs` of coverage.json), and padded by the default directory."""
    default = runs[0]

    def served(run: dict, name: str) -> str:
        p = run["profiles"][name]
        return f"{p['served_calls']}/{p['calls']}, {p['served_bytes'] / p['bytes']:.1%}"

    def padded(name: str) -> str:
        p = default["profiles"][name]
        left = p["left_to_nccl_calls"]
        return (f"{p['padded']['served_calls']}/{p['calls']}" + (f" ({left} left to NCCL)" if left else "")
                + f", +{p['padded']['extra_bytes'] / p['bytes']:.4%}")

    rows = [[name, *(served(r, name) for r in runs), padded(name)] for name in default["profiles"]]
    headers = ["profile", *(f"unpadded, {r['label']}" for r in runs), "padded (hook), default"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def coverage_cost(runs: list[dict]) -> str:
    """Per window (of the directory with the finest split): the element multiple, and U at the
    window's largest size, of the program that serves that size in each directory."""

    def at(run: dict, k: int) -> str:
        w = run["at_windows"][k]
        return f"{w['element_multiple']}, {w['utilisation']:.3f}"

    rows = [[window_label(w["min_bytes"], w["max_bytes"]), *(at(r, k) for r in runs)] for k, w in enumerate(runs[0]["at_windows"])]
    return tabulate(rows, headers=["window", *(f"{r['label']}: multiple, U" for r in runs)], tablefmt="github",
                    disable_numparse=True)


def _zoo():
    """benchmarks/zoo.py, which defines the zoo and its summary."""
    return _benchmark("zoo")


def _benchmark(name: str):
    """A script of benchmarks/ as a module."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: benchmarks/harness.py: the targets the scripts check, quoted here as they do.
harness = _benchmark("harness")


def zoo_table(path: Path = RESULTS / "zoo.csv") -> str:
    """The zoo's distribution by size (benchmarks/zoo.py): U1, speedups and protocols."""
    zoo = _zoo()
    with open(path, newline="") as fh:
        rows = zoo.summary(zoo.points(list(csv.DictReader(fh))))
    return tabulate(rows, headers=zoo.HEADERS, tablefmt="github", disable_numparse=True)


def zoo_slower(path: Path = RESULTS / "zoo.csv") -> str:
    """How many of the zoo's points HiPIPE is slower than the best baseline at, of all."""
    zoo = _zoo()
    with open(path, newline="") as fh:
        pts = zoo.points(list(csv.DictReader(fh)))
    return f"{sum(p['over_best'] < 1.0 for p in pts)} of {len(pts)}"


def search_reference(path: Path = RESULTS / "search-reference.csv") -> str:
    """How close the search's picks come to the wider reference sweep (benchmarks/search_reference.py)."""
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    gaps = sorted((float(r["pick_us"]) / float(r["reference_us"]) - 1, r["topology"], int(r["nbytes"])) for r in rows)
    within = sum(g <= 0.02 for g, _t, _n in gaps)
    misses = [f"{t} {size_label(n)} ({100 * g:+.1f} %)" for g, t, n in reversed(gaps) if g > 0.02]
    return (f"within 2 % of the reference at {within} of {len(gaps)} points on {len({t for _g, t, _n in gaps})} "
            f"topologies (median gap {100 * gaps[len(gaps) // 2][0]:+.1f} %, best {100 * gaps[0][0]:+.1f} %)"
            + (f"; beyond 2 %: {_joined(misses)}" if misses else ""))


def nvls_plans(path: Path = RESULTS / "nvls-plans.json") -> str:
    """The in-switch plans against NCCL's pick on the calibrated H100 machines (benchmarks/nvls_plans.py)."""
    bench = _benchmark("nvls_plans")
    rows = json.loads(path.read_text())
    verdicts = "\n".join(f"- {text}: **{'holds' if holds else 'missed'}**" for text, holds in bench.verdicts(rows))
    return f"{bench.table(rows)}\n\n{verdicts}"


def nvls_summary(path: Path = RESULTS / "nvls-plans.json") -> str:
    """The MSCCL++ directory's speedup over NCCL's pick at 1 GiB per H100 machine, with in-switch plans."""
    rows = [r for r in json.loads(path.read_text()) if r["nbytes"] == 1 << 30]
    parts = [f"{r['nccl_us'] / r['ours_us']:.2f}x on {r['nodes']} node{'s' if r['nodes'] > 1 else ''}" for r in rows]
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def sections() -> dict[str, str]:
    points = grid_points()
    machines = grid_points(RESULTS / "bench-machines.csv")
    coverage = json.loads((RESULTS / "coverage.json").read_text())["runs"]
    return {"grid": grid_table(points), "less-time": less_time(points), "compile-times": compile_times(),
            "training": training_table(), "protocol-grid": grid_table(points, PROTOCOL_ROWS, protocols=True),
            "over-nccl": over_nccl(machines), "over-nccl-large": over_nccl(machines, large=True),
            "machines": machines_table(machines),
            "fidelity": fidelity_table(), "fidelity-held": fidelity_summary(),
            "protocol-targets": protocol_targets(points), "zoo": zoo_table(), "zoo-slower": zoo_slower(),
            "search-reference": search_reference(), "nvls-plans": nvls_plans(),
            "nvls-summary": nvls_summary(),
            "coverage": coverage_table(coverage), "coverage-cost": coverage_cost(coverage)}


MARKED = re.compile(r"(<!-- begin: ([a-z-]+)[^>]*-->)(.*?)(<!-- end: \2 -->)", re.S)


def render(text: str, parts: dict[str, str]) -> str:
    """README text with every marked part replaced; inline parts stay on their line."""
    def fill(m: re.Match) -> str:
        body = parts[m.group(2)]
        inline = "\n" not in m.group(3)
        return m.group(1) + (body if inline else f"\n{body}\n") + m.group(4)
    return MARKED.sub(fill, text)


def main() -> int:
    parts = sections()
    stale = []
    for doc in DOCUMENTS:
        text = doc.read_text()
        new = render(text, parts)
        if new != text:
            stale.append(doc.relative_to(REPO))
            if "--check" not in sys.argv:
                doc.write_text(new)
    if "--check" in sys.argv:
        if stale:
            print(f"{', '.join(map(str, stale))} differ from the results in samples/results/: "
                  "run python benchmarks/readme_tables.py")
            return 1
        print("the documents match samples/results/")
        return 0
    print(f"rewrote {', '.join(map(str, stale)) or 'nothing'} from samples/results/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
