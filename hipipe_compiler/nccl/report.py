"""What a calibration says: the fit per size, the fitted quantities, and the topology file it
writes, each number with a comment saying where it came from.

>>> from hipipe_compiler.topology import Dimension, Topology
>>> from .calibrate import Calibration, Fitted, Quantity
>>> topo = Topology((Dimension(8, "switch", 370.8, 0.6, name="nvlink"),), name="m")
>>> q = Quantity("nvlink bandwidth", "bandwidth:0", 0, None, 370.8, 1e-3, 1e5)
>>> print(topology_yaml(Calibration(topo, (Fitted(q, 370.8, True),), ()), ["a.log"]).splitlines()[-1])
    latency: 0.6  # default
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any, Sequence

from ..files import write_atomic
from ..hardware import PROTOCOLS, Latencies
from ..topology import Topology
from ..units import format_size
from .calibrate import Calibration, Fitted

#: Significant digits the topology file keeps.
DIGITS = 4


def _num(x: float) -> str:
    if x == 0:
        return "0"
    return f"{float(f'{x:.{DIGITS}g}'):g}"


def _why(fitted: dict[str, Fitted], name: str) -> str:
    f = fitted.get(name)
    if f is None:
        return "default"
    if f.constrained:
        return f"fitted (default {_num(f.quantity.prior)})"
    return "default (no log moves it)"


def topology_yaml(cal: Calibration, sources: Sequence[str], nodes: int | None = None, name: str | None = None,
                  tool: str = "hipipe calibrate") -> str:
    """The calibrated topology as a commented YAML file; `nodes` sets the outermost dimension's
    size (1 drops it), `name` the topology's name."""
    topo = cal.topology
    if nodes is not None and topo.ndims > 1:
        topo = topo.with_outer_size(nodes)
    fitted = {f.quantity.name: f for f in cal.fitted}
    out = io.StringIO()
    label = name or topo.name or "calibrated"
    out.write(f"# {label}: calibrated by {tool} so that NCCL, as hipipe simulates it, reproduces:\n")
    for src in sources:
        out.write(f"#   {Path(src).name}\n")
    if cal.points:
        big = [abs(p.error) for p in cal.points if p.nbytes >= 64 << 20]
        mid = [abs(p.error) for p in cal.points if (1 << 20) <= p.nbytes <= (32 << 20)]
        out.write(f"# fit: {len(cal.points)} measured times, rms log error {cal.rms_error:.3f}")
        if big:
            out.write(f"; from 64 MiB within {100 * max(big):.1f} %")
        if mid:
            out.write(f"; 1-32 MiB within {100 * max(mid):.1f} %")
        out.write("\n")
    out.write("# Each number says where it came from: fitted (the logs moved it), or a default it kept.\n")
    out.write(f"name: {label}\n")
    if topo.gpu:
        out.write(f"gpu: {topo.gpu}\n")
    if topo.cpu:
        out.write(f"cpu: {topo.cpu}\n")
    if topo.nccl_channel_scale is not None:
        out.write(f"nccl_channel_scale: {_num(topo.nccl_channel_scale)}  # NCCL's channels against its own tables: "
                  f"{_why(fitted, 'NCCL channel throughput')}\n")
    if topo.call_latency is not None:
        out.write(f"call_latency: {_latencies(topo.call_latency)}  # " +
                  ", ".join(f"{p} {_why(fitted, f'call latency {p}')}" for p in PROTOCOLS) + "\n")
    out.write("dimensions:\n")
    for d, dim in enumerate(topo.dimensions):
        dname = topo.dim_name(d)
        out.write(f"  - name: {dname}\n")
        out.write(f"    size: {dim.size}\n")
        out.write(f"    kind: {dim.kind}\n")
        if dim.link:
            out.write(f"    link: {dim.link}\n")
        out.write(f"    bandwidth: {_num(dim.bandwidth)}  # {_why(fitted, f'{dname} bandwidth')}\n")
        if dim.rated_bandwidth is not None and dim.rated_bandwidth != dim.bandwidth:
            out.write(f"    rated_bandwidth: {_num(dim.rated_bandwidth)}  # what NCCL's topology search sees\n")
        if isinstance(dim.latency, Latencies):
            why = ", ".join(f"{p} {_why(fitted, f'{dname} latency {p}')}" for p in PROTOCOLS)
            out.write(f"    latency: {_latencies(dim.latency)}  # {why}\n")
        else:
            out.write(f"    latency: {_num(dim.latency)}  # default\n")  # type: ignore[arg-type]
        if dim.nvls is not None:
            out.write(f"    nvls: {{efficiency: {_num(dim.nvls.efficiency)}, call_latency: {_num(dim.nvls.call_latency)}}}"
                      f"  # efficiency {_why(fitted, f'{dname} in-switch efficiency')}, call latency "
                      f"{_why(fitted, f'{dname} in-switch call latency')}\n")
    return out.getvalue()


def _latencies(lat: Any) -> str:
    if isinstance(lat, Latencies):
        return "{" + ", ".join(f"{p}: {_num(lat.alpha(p))}" for p in PROTOCOLS) + "}"
    return _num(lat)


def fit_rows(cal: Calibration) -> list[tuple[str, ...]]:
    """One row per measured time: log, nodes, size, NCCL's run, measured, predicted, error."""
    return [(Path(p.log).name, str(p.nodes), format_size(p.nbytes), p.run, f"{p.measured_us:,.1f}",
             f"{p.predicted_us:,.1f}", f"{100 * p.error:+.1f}%") for p in cal.points]


def fitted_rows(cal: Calibration) -> list[tuple[str, ...]]:
    """One row per fitted quantity: its name, default, value, and whether the logs moved it."""
    return [(f.quantity.name, _num(f.quantity.prior), _num(f.value), "fitted" if f.constrained else "default kept")
            for f in cal.fitted]


def to_dict(cal: Calibration, sources: Sequence[str]) -> dict[str, Any]:
    return {
        "logs": list(sources), "topology": cal.topology.to_document(), "rms_log_error": cal.rms_error,
        "fitted": [{"name": f.quantity.name, "default": f.quantity.prior, "value": f.value, "fitted": f.constrained}
                   for f in cal.fitted],
        "points": [{"log": p.log, "collective": p.collective, "nodes": p.nodes, "nbytes": p.nbytes, "nccl": p.run,
                    "measured_us": p.measured_us, "predicted_us": p.predicted_us, "error": p.error} for p in cal.points],
        "simulations": cal.evaluations,
    }


def plot(cal: Calibration, path: str | Path) -> None:
    """Measured (solid) against predicted (dashed) busbw by size, one colour per log."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..bounds import bus_factor

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    logs = list(dict.fromkeys((p.log, p.collective, p.nodes) for p in cal.points))
    for i, (log, coll, nodes) in enumerate(logs):
        mine = sorted((p for p in cal.points if (p.log, p.collective, p.nodes) == (log, coll, nodes)),
                      key=lambda p: p.nbytes)
        ranks = _ranks(cal.topology, nodes)
        factor = bus_factor(coll, ranks)
        xs = [p.nbytes for p in mine]
        colour = f"C{i % 10}"
        ax.plot(xs, [p.nbytes / p.measured_us / 1e3 * factor for p in mine], "-o", color=colour, markersize=3,
                label=f"{Path(log).name} measured")
        ax.plot(xs, [p.nbytes / p.predicted_us / 1e3 * factor for p in mine], "--", color=colour,
                label=f"{Path(log).name} predicted")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(f"{cal.topology.label}: nccl-tests against the calibrated model")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=Path(path).suffix.lstrip(".") or "png", dpi=120)
    plt.close(fig)
    write_atomic(path, buf.getvalue())


def _ranks(topology: Topology, nodes: int) -> int:
    per_node = topology.nranks // topology.dimensions[-1].size if topology.ndims > 1 else topology.nranks
    return per_node * nodes if topology.ndims > 1 else topology.nranks


def worst(cal: Calibration, lo: int, hi: int) -> float:
    """The largest relative error of the fit between two sizes (0 without points there)."""
    errors = [abs(p.error) for p in cal.points if lo <= p.nbytes <= hi]
    return max(errors, default=0.0) if not any(math.isnan(e) for e in errors) else math.nan
