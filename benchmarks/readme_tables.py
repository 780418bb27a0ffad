"""The README's (and docs/pytorch.md's) result tables and numbers, rendered from the benchmark
results in samples/results/ (never typed by hand). Each generated part sits between
`<!-- begin: NAME ... -->` and `<!-- end: NAME -->` markers.

Regenerate the results, then the README:

    hipipe bench --no-progress --csv samples/results/bench-grid.csv
    python benchmarks/compile_hipipe.py --save
    python benchmarks/compile_speed.py --save
    python benchmarks/training_table.py --save
    python benchmarks/coverage.py --save
    python benchmarks/readme_tables.py            # rewrites README.md and docs/pytorch.md; --check only compares

tests/test_readme_results.py checks that README.md is what this renders, and re-runs a few
cells of each table.
"""

from __future__ import annotations

import csv
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
DOCUMENTS = (README, REPO / "docs" / "pytorch.md")
GRID_ROWS = {
    "C1": "C1: 8 × 4, NVSwitch + IB", "C3": "C3: 4 × 4 torus", "C5": "C5: 4 × 4 × 4 torus, falling bandwidth",
    "C6": "C6: 2 ring × 8 FC × 4 switch",
}
#: The rows with NCCL's per-protocol latencies (cost-model.md 1).
PROTOCOL_ROWS = {"C1p": "C1p: C1, NCCL's latencies", "C6p": "C6p: C6, NCCL's latencies"}
#: Utilisation targets of the protocol-aware rows, by size (issue: protocols).
PROTOCOL_TARGETS = {64 << 10: 0.45, 256 << 10: 0.40, 1 << 20: 0.40, 4 << 20: 0.60, 16 << 20: 0.85}
NCCL = ("nccl-ring-", "nccl-tree-")
#: The sizes compared with NCCL: the latency-bound ones up to NCCL_LATENCY_BOUND, the
#: bandwidth-bound ones from NCCL_BANDWIDTH_BOUND up (4-16 MiB, between them, are in the tables only).
NCCL_LATENCY_BOUND = 1 << 20
NCCL_BANDWIDTH_BOUND = 64 << 20
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


def size_label(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def grid_table(points: dict, rows: dict[str, str] = GRID_ROWS, protocols: bool = False) -> str:
    """U = T_LB / T of ours and (in brackets) of the best baseline, per topology and size; with
    `protocols`, also the protocol our program runs."""
    sizes = sorted({size for topo, size in points if topo in rows})
    title = "U = T_LB / T, HiPIPE " + ("and its protocol " if protocols else "") + "(best baseline)"
    lines = [f"| {title} | " + " | ".join(size_label(s) for s in sizes) + " |", "|---" * (len(sizes) + 1) + "|"]
    for topo, label in rows.items():
        cells = []
        for size in sizes:
            algos = points[(topo, size)]
            ours = max(utilisation(algos[a]) or 0.0 for a in OURS if a in algos)
            best = max(utilisation(r) or 0.0 for a, r in algos.items() if a not in OURS)
            proto = f" {algos['hipipe']['protocol']}" if protocols else ""
            cells.append(f"**{ours:.2f}**{proto} ({best:.2f})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def over_nccl(points: dict, large: bool = False) -> str:
    """How much faster ours is than the fastest NCCL algorithm (ring or tree, any protocol)
    on the protocol-aware rows up to NCCL_LATENCY_BOUND (or, if `large`, from NCCL_BANDWIDTH_BOUND
    up): the geometric mean, and the smallest and largest gain."""
    gains = []
    for (topo, size), algos in sorted(points.items()):
        if topo in PROTOCOL_ROWS and (size >= NCCL_BANDWIDTH_BOUND if large else size <= NCCL_LATENCY_BOUND):
            nccl = min(float(r["time_us"]) for a, r in algos.items() if a.startswith(NCCL) and r["time_us"])
            gains.append((nccl / float(algos["hipipe"]["time_us"]), f"{topo} {size_label(size)}"))
    mean = math.exp(sum(math.log(g) for g, _where in gains) / len(gains))
    (low, at_low), (high, at_high) = min(gains), max(gains)
    return f"{mean:.2f}x (geometric mean; from {low:.2f}x at {at_low} to {high:.2f}x at {at_high})"


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


#: benchmarks/compile_hipipe.py's targets, in seconds per directory, and compile_speed.py's.
GRID_COMPILE_TARGET_S, POD_COMPILE_TARGET_S = 60.0, 300.0
POD_HIERARCHICAL_TARGET_S = 10.0


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
    missed = [t for t in ("C1", "C3", "C5", "C6") if t in data and data[t]["seconds"] > GRID_COMPILE_TARGET_S]
    missed += ["the pod"] if pod and pod["seconds"] > POD_COMPILE_TARGET_S else []
    status = (f" ({_joined(missed)} {'misses' if len(missed) == 1 else 'miss'} them in this measurement, on a shared "
              f"machine whose speed varies from run to run)" if missed else "")
    return textwrap.fill(
           f"Compiling a whole 1 KiB–4 GiB directory (`hipipe compile TOPO --sizes 1KiB:4GiB`, end to end on one "
            f"core; `python benchmarks/compile_hipipe.py`) takes {grid}{pod_text}; the targets are a minute per grid "
            f"topology and five minutes for the pod{status}. One hierarchical all-reduce program for all 1,024 "
            f"ranks of the pod (`hipipe compile pod-8x4x8x4 --algo hierarchical --size 1GiB`) takes {one['seconds']:.1f} s end to end, "
            f"{one['phases']['verify']:.1f} s of it proving the program (`python benchmarks/compile_speed.py`; "
            f"target {POD_HIERARCHICAL_TARGET_S:.0f} s"
            f"{', missed in this measurement' if one['seconds'] > POD_HIERARCHICAL_TARGET_S else ''}).", width=92)


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

    rows = [[name, *(served(r, name) for r in runs),
             f"{default['profiles'][name]['padded']['served_calls']}/{default['profiles'][name]['calls']}, "
             f"+{default['profiles'][name]['padded']['extra_bytes'] / default['profiles'][name]['bytes']:.4%}"]
            for name in default["profiles"]]
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


def sections() -> dict[str, str]:
    points = grid_points()
    coverage = json.loads((RESULTS / "coverage.json").read_text())["runs"]
    return {"grid": grid_table(points), "less-time": less_time(points), "compile-times": compile_times(),
            "training": training_table(), "protocol-grid": grid_table(points, PROTOCOL_ROWS, protocols=True),
            "over-nccl": over_nccl(points), "over-nccl-large": over_nccl(points, large=True),
            "protocol-targets": protocol_targets(points),
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
