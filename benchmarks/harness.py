"""Shared by the benchmark scripts: run one case in a fresh process and report its wall time
and peak memory, so cases do not disturb each other's measurements."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CASES = {
    "8x4": "dgx-h100-8x4",
    "8x16": "dgx-h100-8x16",
    "8x64": "dgx-h100-8x64",
    "1024 (8x4x8x4)": "pod-8x4x8x4",
}


def measure(code: str) -> dict:
    """Run `code` (which must set a dict `result`) in a new interpreter; add seconds and peak MiB."""
    script = "\n".join([
        "import json, resource, sys, time",
        f"sys.path.insert(0, {str(REPO)!r})",
        textwrap.dedent(code),
        'result["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024',
        "print(json.dumps(result))",
    ])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_table(rows: list[tuple], headers: tuple[str, ...]) -> None:
    from tabulate import tabulate
    print(tabulate(rows, headers=headers, disable_numparse=True))
