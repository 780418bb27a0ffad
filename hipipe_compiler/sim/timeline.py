"""Timelines of a simulated call: which link moved which chunk when, as a picture.

Rows are dimensions (reduce-scatter and all-gather work on separate rows) or, when asked,
ranks × dimensions; bars are messages, coloured by the chunk they carry, so pipeline fill,
drain and bubbles show at a glance. The caption gives T, T_LB and utilisation.

>>> from hipipe_compiler.lower import lower
>>> from hipipe_compiler.schedule import hierarchical_plan
>>> from hipipe_compiler.sim import simulate
>>> from hipipe_compiler.presets import preset
>>> topo = preset("dgx-h100-8x2")
>>> program = lower(hierarchical_plan(topo, chunks=2, max_bytes=1 << 20))
>>> bars = timeline_bars(simulate(program, topo, 1 << 20, record=True), program, topo)
>>> sorted({b.row for b in bars})
['net AG', 'net RS', 'nvlink AG', 'nvlink RS']
>>> sorted({b.chunk for b in bars})
[0, 1]
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import InputError
from ..files import write_atomic, writing
from ..msccl.program import Program
from ..topology import Topology
from ..units import format_size
from .simulate import SimResult

#: Picture formats `render_timeline` writes, by file extension.
FORMATS: tuple[str, ...] = ("png", "svg")
#: Ranks drawn at most with per-rank rows (more would not be readable).
MAX_RANK_ROWS = 16
#: Overlapping bars of one row are stacked in at most this many lanes.
MAX_LANES = 8


@dataclass(frozen=True)
class Bar:
    """One message on the timeline: its row, time span, the chunk it carries and whether the
    receiver reduced it (reduce-scatter) or copied it (all-gather)."""

    row: str
    start_us: float
    end_us: float
    chunk: int
    reduce: bool
    rank: int
    dim: int


def chunk_of(program: Program, offset: int) -> int:
    """The per-rank cell a buffer offset belongs to: which pipeline chunk it is in our layout
    (all-reduce: chunk k holds cells offsets[k]..+units_k of every rank, contiguously; the
    other collectives: rank r's block of nchunksperloop/ngpus cells)."""
    per_rank = max(1, program.nchunksperloop // program.ngpus)
    if program.collective == "allreduce":
        return min(per_rank - 1, offset // program.ngpus)
    return offset % per_rank


def timeline_bars(result: SimResult, program: Program, topology: Topology, ranks: Sequence[int] = (0,),
                  per_rank: bool = False) -> list[Bar]:
    """The bars of the messages `ranks` sent, from a simulate(..., record=True) result.

    Rows are "<dimension> RS|AG", prefixed by "rank r " with `per_rank`."""
    if not result.intervals:
        raise ValueError("no recorded messages: simulate with record=True")
    wanted = set(ranks)
    bars = []
    for iv in result.intervals:
        if iv.src not in wanted:
            continue
        reduce = bool(iv.reduce)
        row = f"{topology.dim_name(iv.dim)} {'RS' if reduce else 'AG'}"
        if per_rank:
            row = f"rank {iv.src} {row}"
        bars.append(Bar(row, iv.start_us, iv.end_us, chunk_of(program, iv.offset), reduce, iv.src, iv.dim))
    return bars


def _row_order(bars: Sequence[Bar], topology: Topology) -> list[str]:
    rows = {(b.rank, b.dim, not b.reduce): b.row for b in bars}
    return [rows[k] for k in sorted(rows)]


def _lanes(bars: Sequence[Bar]) -> tuple[list[int], int]:
    """Greedy interval packing: the lane of each bar (in start order) and the lane count."""
    ends: list[float] = []
    lanes = []
    for b in bars:
        for i, end in enumerate(ends):
            if end <= b.start_us:
                ends[i] = b.end_us
                lanes.append(i)
                break
        else:
            if len(ends) < MAX_LANES:
                ends.append(b.end_us)
                lanes.append(len(ends) - 1)
            else:
                i = min(range(len(ends)), key=ends.__getitem__)
                ends[i] = max(ends[i], b.end_us)
                lanes.append(i)
    return lanes, max(1, len(ends))


def check_picture_path(path: str | Path) -> str:
    """The picture format of `path` from its extension, or InputError naming the file."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise InputError(str(path), None, f"expected a .png or .svg file name for the picture, got {Path(path).suffix or 'no extension'!r}")
    return fmt


def render_timeline(result: SimResult, program: Program, topology: Topology, path: str | Path,
                    ranks: Sequence[int] = (0,), per_rank: bool = False) -> int:
    """Draw the timeline of `ranks`' sends to a PNG or SVG file (written atomically); returns
    the number of bars drawn."""
    check_picture_path(path)
    if per_rank and len(ranks) > MAX_RANK_ROWS:
        raise InputError(None, "--rank", f"expected at most {MAX_RANK_ROWS} ranks for per-rank rows, got {len(ranks)}")
    bars = timeline_bars(result, program, topology, ranks, per_rank)
    who = ", ".join(str(r) for r in ranks) if len(ranks) <= 8 else f"{len(ranks)} ranks"
    title = (f"{program.name}: {program.collective} of {format_size(result.nbytes)} on {topology.label}, "
             f"{result.iterations} iteration(s); messages sent by rank {who}")
    kinds = [("reduce-scatter (receiver reduces)", True), ("all-gather (receiver copies)", False)]
    return _draw(bars, _row_order(bars, topology), title, result, path, kinds, "cell")


#: The rows of a plan's timeline, in order: what each kind of message is called.
PLAN_KINDS = {True: "switch reduce", None: "sends", False: "multicast"}


def plan_timeline_bars(result: SimResult, topology: Topology, ranks: Sequence[int] = (0,)) -> list[Bar]:
    """The bars of the messages `ranks` issued, from a time_plan(..., record=True) result: rows
    "<dimension> switch reduce|sends|multicast", coloured by the ordinal of their operation
    (in a pipeline, the chunk)."""
    if not result.intervals:
        raise ValueError("no recorded messages: time the plan with record=True")
    wanted = set(ranks)
    return [Bar(f"{topology.dim_name(iv.dim)} {PLAN_KINDS[iv.reduce]}", iv.start_us, iv.end_us, iv.iteration,
                iv.reduce is not False, iv.src, iv.dim) for iv in result.intervals if iv.src in wanted]


def render_plan_timeline(result: SimResult, name: str, topology: Topology, path: str | Path,
                         ranks: Sequence[int] = (0,)) -> int:
    """Draw the timeline of an MSCCL++ plan's messages issued by `ranks` (switch reduces, puts,
    multicast stores) to a PNG or SVG file; returns the number of bars drawn."""
    check_picture_path(path)
    bars = plan_timeline_bars(result, topology, ranks)
    order = list(PLAN_KINDS.values())
    rows = sorted({b.row for b in bars}, key=lambda row: (row.split(" ", 1)[0] != topology.dim_name(0),
                                                          order.index(row.split(" ", 1)[1])))
    who = ", ".join(str(r) for r in ranks) if len(ranks) <= 8 else f"{len(ranks)} ranks"
    title = f"{name}: {result.collective} of {format_size(result.nbytes)} on {topology.label}; issued by rank {who}"
    kinds = [("switch reduce, put", True), ("multicast store", False)]
    return _draw(bars, rows, title, result, path, kinds, "operation")


def _draw(bars: Sequence[Bar], rows: Sequence[str], title: str, result: SimResult, path: str | Path,
          kinds: Sequence[tuple[str, bool]], colour_label: str) -> int:
    """The picture: one row per name, bars in lanes where they overlap, coloured by `chunk`."""
    fmt = check_picture_path(path)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    cmap = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.45 * len(rows)))
    for y, row in enumerate(rows):
        mine = sorted((b for b in bars if b.row == row), key=lambda b: (b.start_us, b.end_us))
        lanes, nlanes = _lanes(mine)
        height = 0.8 / nlanes
        for b, lane in zip(mine, lanes):
            ax.barh(y - 0.4 + (lane + 0.5) * height, b.end_us - b.start_us, height=height * 0.9, left=b.start_us,
                    color=cmap(b.chunk % 20), alpha=1.0 if b.reduce else 0.55, hatch=None if b.reduce else "///",
                    linewidth=0)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows)
    ax.invert_yaxis()
    ax.set_xlim(0, result.time_us * 1.01)
    ax.set_xlabel("time (µs)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(title, fontsize=9)
    chunks = sorted({b.chunk for b in bars})
    handles = [Patch(color="0.3", label=kinds[0][0]), Patch(facecolor="0.3", alpha=0.55, hatch="///", label=kinds[1][0])]
    handles += [Patch(color=cmap(c % 20), label=f"{colour_label} {c}") for c in chunks[:12]]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    caption = f"T = {result.time_us:,.1f} µs"
    if result.lower_bound_us is not None:
        caption += f"    T_LB = {result.lower_bound_us:,.1f} µs    utilisation T_LB/T = {result.utilisation:.3f}"
    fig.text(0.01, 0.01, caption, fontsize=9)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=110)
    plt.close(fig)
    with writing(Path(path)):
        write_atomic(path, buf.getvalue())
    return len(bars)
