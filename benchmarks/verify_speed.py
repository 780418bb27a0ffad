"""`hipipe verify` of a hierarchical all-reduce compiled for 1 GiB, end to end as a user runs
it (reading the XML included); the files are compiled first, untimed.

Target: the 1024-rank program in under 30 s and 2 GiB.
Run: python benchmarks/verify_speed.py
"""

import sys
import tempfile
from pathlib import Path

from harness import CASES, hipipe, print_table, run_command, target

rows, pod = [], None
with tempfile.TemporaryDirectory() as tmp:
    for label, name in CASES.items():
        xml = Path(tmp) / f"{name}.xml"
        made = run_command([*hipipe(), "compile", name, "--algo", "hierarchical", "--size", "1GiB", "-o", xml, "--quiet"])
        if made["returncode"] != 0:
            rows.append((label, "error", made["stderr"].strip()[-60:], ""))
            continue
        r = run_command([*hipipe(), "verify", xml])
        rows.append((label, f"{r['seconds']:.2f}", f"{r['peak_mib']:.0f}", "yes" if r["returncode"] == 0 else "NO"))
        if name == "pod-8x4x8x4":
            pod = r
print("hipipe verify FILE of a hierarchical all-reduce (1 GiB window), end to end")
print_table(rows, ("topology", "verify s", "peak MiB", "verified"))
holds = pod is not None and pod["returncode"] == 0
holds &= target("hipipe verify of the 1024-rank program", pod["seconds"], 30, "s") if pod else False
holds &= target("its peak memory", pod["peak_mib"] / 1024, 2, "GiB") if pod else False
sys.exit(0 if holds else 1)
