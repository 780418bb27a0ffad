"""What the commands print: tables of compiled windows, verdicts rule by rule, JSON."""

from __future__ import annotations

import json
from typing import Any

from tabulate import tabulate

from .compiler import VerificationFailed
from .msccl.verify import Report, Violation
from .windows import window_label


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2))


def verified(topo: Any, bar: Any, work: Any) -> tuple[Any, int]:
    """Run work() and close the progress bar; a program that fails verification (a compiler
    bug) is reported rule by rule and gives exit code 1 instead of a result."""
    try:
        return work(), 0
    except VerificationFailed as exc:
        report_violations(f"{topo.label} {exc.window.label}", exc.report)
        return None, 1
    finally:
        if bar is not None:
            bar.close()


def summary_table(summaries: list[dict[str, Any]]) -> str:
    """One row per size window: what was chosen, its shape, and its simulated performance."""
    rows = []
    nccl = any("nccl" in s for s in summaries)
    xml = any("xml_us" in s for s in summaries)  # an MSCCL++ plan beside the same program as MSCCL XML
    for s in summaries:
        u, u1 = s.get("utilisation"), s.get("utilisation1")
        row = [
            window_label(s["min_bytes"], s["max_bytes"]), s.get("choice", s["algorithm"]),
            s["protocol"], s["chunks"], units_text(s["chunk_units"]), s["element_multiple"], s["channels"], s["threadblocks"],
            s["longest_threadblock"], f"{s['predicted_us']:,.1f}", f"{s['busbw_GBps']:,.1f}",
            "-" if u is None else f"{u:.3f}", "-" if u1 is None else f"{u1:.3f}", "yes" if s["verified"] else "-",
        ]
        if xml:
            row.append("-" if s.get("xml_us") is None else f"{s['xml_us']:,.1f}")
        if nccl:
            row.append(nccl_cell(s))
        rows.append(row)
    headers = ["window", "plan", "proto", "chunks", "chunk sizes", "elements x", "channels", "tbs", "longest tb",
               "us @max", "busbw GB/s", "U", "U1", "verified", *(["as XML us"] if xml else []),
               *(["vs NCCL"] if nccl else [])]
    return tabulate(rows, headers=headers, disable_numparse=True)


def nccl_cell(s: dict[str, Any]) -> str:
    """How much faster than NCCL's own pick a window is at its slower end, or that it is left to NCCL."""
    speedup = (s.get("nccl") or {}).get("speedup")
    if speedup is None:
        return "-"
    return f"left ({speedup:.2f}x)" if s.get("left_to_nccl") else f"{speedup:.2f}x"


def units_text(units: list[int]) -> str:
    text = "/".join(map(str, units))
    return text if len(text) <= 24 else text[:21] + "..."


def report_violations(label: str, report: Report, limit: int = 50) -> None:
    """The verdict, then each broken rule; one that every rank breaks alike is shown once."""
    print(f"{label}: {report.summary()}")
    alike: dict[tuple, list[Violation]] = {}
    for v in report.violations:
        alike.setdefault((v.rule, v.tb, v.step, v.message), []).append(v)
    groups = list(alike.values())
    for group in groups[:limit]:
        others = len(group) - 1
        print(f"  {group[0]}" + (f" (and on {others} other rank{'s' if others > 1 else ''})" if others else ""))
    if len(groups) > limit:
        print(f"  ... and {len(groups) - limit} more")
