"""Windows a directory leaves to NCCL: where our best program is not faster than what NCCL
runs by itself (its own pick, timed by our simulator) by a margin for the model's error, the
directory holds no file, so the runtime runs NCCL for those calls.

>>> from hipipe_compiler.compiler import CompileOptions, compile_range
>>> from hipipe_compiler.presets import preset
>>> topo = preset("dgx-h100-8x1")  # NCCL's NVLS reduces in the switch
>>> windows = compile_range(topo, CompileOptions(algorithm="hierarchical"), 1 << 30, 1 << 30)
>>> [w.details["left_to_nccl"] for w in against_nccl(windows, topo, "allreduce", 1.05)]
[True]
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Sequence

from .compiler import CompiledWindow
from .errors import PlanError
from .nccl.timing import NcclTimer, nccl_machine
from .sim import simulate_exact
from .topology import Topology

if TYPE_CHECKING:  # the MSCCL++ compiler is needed only by its own command
    from .plan_compiler import CompiledPlans

#: The default margin (`--min-speedup`): a window keeps our program only where it is at least
#: this much faster than NCCL at both ends, so the model's error cannot make a job slower.
MIN_SPEEDUP = 1.05


def against_nccl(windows: Sequence[CompiledWindow], topology: Topology, collective: str,
                 min_speedup: float = MIN_SPEEDUP,
                 ours: Callable[[CompiledWindow, int], float] | None = None) -> list[CompiledWindow]:
    """The windows with NCCL's pick and both predicted times at each end, and whether each is
    left to NCCL (`details["left_to_nccl"]`); the windows as they are where NCCL's pick would
    be a guess (nccl_machine). `ours` times a window at a size (default: its program)."""
    if nccl_machine(topology) is not None:
        return list(windows)
    timer = NcclTimer(topology, collective)
    out = []
    for cw in windows:
        ends = sorted({cw.window.min_bytes, cw.window.max_bytes})
        mine, nccl, runs = [], [], []
        for size in ends:
            known = cw.details.get("predicted_us") if cw.details.get("predicted_at_bytes") == size else None
            mine.append(known if known is not None else
                        ours(cw, size) if ours is not None else simulate_exact(cw.program, topology, size).time_us)
            try:
                run = timer.pick(size)
            except PlanError:
                run = None
            nccl.append(None if run is None else run.time_us)
            runs.append(None if run is None else run.label)
        speedup = speedup_over_nccl(mine, nccl)
        left = speedup is not None and speedup < min_speedup
        details = {**cw.details, "left_to_nccl": left, "nccl": {
            "at_bytes": ends, "hipipe_us": mine, "nccl_us": nccl, "nccl_runs": runs,
            "speedup": speedup, "min_speedup": min_speedup}}
        out.append(replace(cw, details=details))
    return out


def speedup_over_nccl(ours: Sequence[float], nccl: Sequence[float | None]) -> float | None:
    """Ours against NCCL at the sizes where NCCL was timed: the worst ratio, None where none was."""
    return min((n / o for o, n in zip(ours, nccl) if n is not None), default=None)


def fallbacks_against_nccl(cp: CompiledPlans, min_speedup: float) -> CompiledPlans:
    """A part's fallbacks (plan_compiler.py) kept only where they beat NCCL's own pick by
    `min_speedup` at both ends, as windows are kept: elsewhere NCCL serves the calls that the
    in-switch plans cannot take. Kept as they are where NCCL was not timed."""
    details = cp.window.details
    speedup = speedup_over_nccl(details.get("fallback_us") or (), details.get("nccl", {}).get("nccl_us") or ())
    return replace(cp, fallbacks=()) if speedup is not None and speedup < min_speedup else cp


def kept(windows: Sequence[CompiledWindow]) -> list[CompiledWindow]:
    """The windows that keep their program."""
    return [w for w in windows if not w.details.get("left_to_nccl")]


def left(windows: Sequence[CompiledWindow]) -> list[CompiledWindow]:
    """The windows left to NCCL."""
    return [w for w in windows if w.details.get("left_to_nccl")]
