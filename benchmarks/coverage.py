"""Which calls of real training jobs the compiled programs serve, and what the granularity caps
cost: `hipipe compile --sizes 64KiB:1GiB` on a topology by default (nchunksperloop at most 256
below 64 MiB, where gradient buckets land), without that cap (the fastest plan everywhere) and
with `--max-nchunksperloop 256` everywhere, then `hipipe coverage` for each built-in profile's
DDP buckets.

    python benchmarks/coverage.py [--topo dgx-h100-8x4] [--save]

Targets (issue: coverage), on the default directory:
- padded to the smallest served count, 100 % of calls are served, for at most 0.1 % extra bytes;
- unpadded, at least 50 % of the bytes of resnet50, bert_base and gpt2 are served;
- T_LB / T is at least 0.95 in every window from 64 MiB up.
The other directories show what serving the calls unpadded costs, window by window.
--save writes samples/results/coverage.json, which the docs' tables are made from.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from harness import hipipe, print_table, run_command, save

from hipipe_compiler.training.profiles import BUILTIN_PROFILES
from hipipe_compiler.windows import window_label

SIZES = "64KiB:1GiB"
UNPADDED = ("resnet50", "bert_base", "gpt2")
#: The directories compared: a label and the options of `hipipe compile` (the default first).
RUNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("default", ()),
    ("--max-bucket-nchunksperloop 0", ("--max-bucket-nchunksperloop", "0")),
    ("--max-nchunksperloop 256", ("--max-nchunksperloop", "256")),
)


def compile_directory(topo: str, options: Sequence[str], out: Path) -> dict:
    """`hipipe compile` into `out`; its per-window summary and wall seconds."""
    done = run_command([*hipipe(), "compile", topo, "--sizes", SIZES, *options, "-o", out, "--json"])
    if done["returncode"] != 0:
        sys.exit(f"hipipe compile failed: {done['stderr'].strip()}")
    return {"seconds": done["seconds"], "windows": json.loads(done["stdout"])["windows"]}


def at_windows(directory: Path, topo: str, windows: list[dict], reference: list[dict]) -> list[dict]:
    """For each reference window, the element multiple of the program of `directory` that
    serves its largest size, and that program's T_LB / T there (`hipipe simulate`)."""
    files = json.loads((directory / ".hipipe" / "manifest.json").read_text())["files"]
    out = []
    for ref in reference:
        size = ref["predicted_at_bytes"]
        i = next(i for i, w in enumerate(windows) if w["min_bytes"] <= size <= w["max_bytes"])
        if windows[i]["predicted_at_bytes"] == size:
            u = windows[i]["utilisation"]
        else:
            done = run_command([*hipipe(), "simulate", directory / files[i], "--topo", topo, "--size", str(size), "--json"])
            u = json.loads(done["stdout"])["utilisation"]
        out.append({"min_bytes": ref["min_bytes"], "max_bytes": ref["max_bytes"], "at_bytes": size,
                    "element_multiple": windows[i]["element_multiple"], "utilisation": u})
    return out


def job_coverage(directory: Path, profile: str) -> dict:
    done = run_command([*hipipe(), "coverage", directory, "--profile", profile, "--json"])
    if done["returncode"] != 0:
        sys.exit(f"hipipe coverage failed: {done['stderr'].strip()}")
    doc = json.loads(done["stdout"])
    return {key: doc[key] for key in ("calls", "served_calls", "left_to_nccl_calls", "bytes", "served_bytes", "padded")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topo", default="dgx-h100-8x4")
    parser.add_argument("--save", action="store_true", help="write samples/results/coverage.json")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        compiled = {}
        for i, (label, options) in enumerate(RUNS):
            out = Path(tmp) / f"run{i}"
            compiled[label] = (out, compile_directory(args.topo, options, out))
        # costs are compared at the windows of the directory that has the most (the finest split)
        reference = max((c["windows"] for _out, c in compiled.values()), key=len)
        for label, options in RUNS:
            out, result = compiled[label]
            jobs = {name: job_coverage(out, name) for name in BUILTIN_PROFILES}
            runs.append({"label": label, "options": list(options), **result, "profiles": jobs,
                         "at_windows": at_windows(out, args.topo, result["windows"], reference)})
    default = runs[0]
    print(f"{args.topo}, hipipe compile --sizes {SIZES}: DDP buckets (fp32, 1 MiB then 25 MiB) served")
    print_table([(name, *(f"{r['profiles'][name]['served_calls']}/{r['profiles'][name]['calls']} calls, "
                         f"{r['profiles'][name]['served_bytes'] / r['profiles'][name]['bytes']:.1%}" for r in runs),
                  f"{default['profiles'][name]['padded']['served_calls']}/{default['profiles'][name]['calls']}, "
                  f"+{default['profiles'][name]['padded']['extra_bytes'] / default['profiles'][name]['bytes']:.4%}")
                 for name in BUILTIN_PROFILES],
                ("profile", *(r["label"] for r in runs), "padded (default)"))
    print()
    print_table([(window_label(w["min_bytes"], w["max_bytes"]),
                  *(f"{r['at_windows'][k]['element_multiple']}, {r['at_windows'][k]['utilisation']:.3f}"
                    for r in runs)) for k, w in enumerate(reference)],
                ("window, U at its largest size", *(f"{r['label']}: x, U" for r in runs)))
    holds = []
    # a call in a window the directory leaves to NCCL by design (NCCL's own pick is as fast) is not a miss
    padded_ok = all(p["padded"]["served_calls"] + p["left_to_nccl_calls"] == p["calls"]
                    and p["padded"]["extra_bytes"] <= 0.001 * p["bytes"] for p in default["profiles"].values())
    holds.append(_target("padded: every call served or left to NCCL by design, at most 0.1% extra bytes", padded_ok))
    for name in UNPADDED:
        share = default["profiles"][name]["served_bytes"] / default["profiles"][name]["bytes"]
        holds.append(_target(f"unpadded: {name} at least 50% of bytes served ({share:.1%})", share >= 0.5))
    large = [w["utilisation"] for w in default["windows"] if w["min_bytes"] >= 64 << 20]
    holds.append(_target(f"U at 64 MiB and up at least 0.95 (lowest {min(large):.3f})", min(large) >= 0.95))
    if args.save:
        save("coverage.json", {"topology": args.topo, "sizes": SIZES, "runs": runs})
    sys.exit(0 if all(holds) else 1)


def _target(what: str, holds: bool) -> bool:
    print(f"target: {what}: {'holds' if holds else 'MISSED'}")
    return holds


if __name__ == "__main__":
    main()
