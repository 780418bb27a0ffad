"""The README's result tables and numbers, rendered from the benchmark results in
samples/results/ (never typed by hand). Each generated part of README.md sits between
`<!-- begin: NAME ... -->` and `<!-- end: NAME -->` markers.

Regenerate the results, then the README:

    hipipe bench --no-progress --csv samples/results/bench-grid.csv
    python benchmarks/compile_hipipe.py --save
    python benchmarks/compile_speed.py --save
    python benchmarks/training_table.py --save
    python benchmarks/readme_tables.py            # rewrites README.md; --check only compares

tests/test_readme_results.py checks that README.md is what this renders, and re-runs a few
cells of each table.
"""

from __future__ import annotations

import csv
import json
import re
import sys
import textwrap
from pathlib import Path

from tabulate import tabulate

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "samples" / "results"
README = REPO / "README.md"
GRID_ROWS = {
    "C1": "C1: 8 × 4, NVSwitch + IB", "C3": "C3: 4 × 4 torus", "C5": "C5: 4 × 4 × 4 torus, falling bandwidth",
    "C6": "C6: 2 ring × 8 FC × 4 switch",
}
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


def grid_table(points: dict) -> str:
    """U = T_LB / T of ours and (in brackets) of the best baseline, per topology and size."""
    sizes = sorted({size for _topo, size in points})
    lines = ["| U = T_LB / T, HiPIPE (best baseline) | " + " | ".join(size_label(s) for s in sizes) + " |",
             "|---" * (len(sizes) + 1) + "|"]
    for topo, label in GRID_ROWS.items():
        cells = []
        for size in sizes:
            algos = points[(topo, size)]
            ours = max(utilisation(algos[a]) or 0.0 for a in OURS if a in algos)
            best = max(utilisation(r) or 0.0 for a, r in algos.items() if a not in OURS)
            cells.append(f"**{ours:.2f}** ({best:.2f})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def less_time(points: dict) -> str:
    """Mean time saved by ours against the unpipelined hierarchical all-reduce, in percent."""
    saved = [1 - float(algos["hipipe"]["time_us"]) / float(algos["hierarchical"]["time_us"]) for algos in points.values()]
    return f"{100 * sum(saved) / len(saved):.0f}%"


def compile_times() -> str:
    data = json.loads((RESULTS / "compile-hipipe.json").read_text())
    speed = json.loads((RESULTS / "compile-speed.json").read_text())
    grid = ", ".join(f"{data[t]['seconds']:.1f} s for {t}" for t in ("C1", "C3", "C5", "C6") if t in data)
    pod = data.get("pod-8x4x8x4 (1024)")
    pod_text = f" and {pod['seconds'] / 60:.1f} minutes for the 1024-rank `pod-8x4x8x4` preset" if pod else ""
    one = speed["1024 (8x4x8x4)"]
    return textwrap.fill(
           f"Compiling a whole 1 KiB–4 GiB directory (`hipipe compile TOPO --sizes 1KiB:4GiB`, end to end on one "
            f"core; `python benchmarks/compile_hipipe.py`) takes {grid}{pod_text}; the targets are a minute per grid "
            f"topology and five minutes for the pod. One hierarchical all-reduce program for all 1,024 ranks of the pod "
            f"(`hipipe compile pod-8x4x8x4 --algo hierarchical --size 1GiB`) takes {one['seconds']:.1f} s end to end, "
            f"{one['phases']['verify']:.1f} s of it proving the program (`python benchmarks/compile_speed.py`; "
            f"target 10 s).", width=92)


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


def sections() -> dict[str, str]:
    points = grid_points()
    return {"grid": grid_table(points), "less-time": less_time(points), "compile-times": compile_times(),
            "training": training_table()}


MARKED = re.compile(r"(<!-- begin: ([a-z-]+)[^>]*-->)(.*?)(<!-- end: \2 -->)", re.S)


def render(text: str, parts: dict[str, str]) -> str:
    """README text with every marked part replaced; inline parts stay on their line."""
    def fill(m: re.Match) -> str:
        body = parts[m.group(2)]
        inline = "\n" not in m.group(3)
        return m.group(1) + (body if inline else f"\n{body}\n") + m.group(4)
    return MARKED.sub(fill, text)


def main() -> int:
    text = README.read_text()
    new = render(text, sections())
    if "--check" in sys.argv:
        if new != text:
            print("README.md differs from the results in samples/results/: run python benchmarks/readme_tables.py")
            return 1
        print("README.md matches samples/results/")
        return 0
    README.write_text(new)
    print("rewrote README.md from samples/results/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
