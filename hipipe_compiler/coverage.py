"""Coverage: which calls of a training job a directory of programs really serves.

The runtime runs a program for a call only when the call's size lies in the program's window
and its element count is a multiple of the program's element multiple (msccl/selection.py);
every other call runs on NCCL's own algorithms, silently. A job's calls are PyTorch DDP's
gradient buckets (built from a layer profile the way DDP builds them) or element counts read
from a file. The report says, per call, which file serves it or why none does, and what
padding each call to the smallest count some file serves would cost.

>>> from hipipe_compiler.msccl.program import Program
>>> files = [("ar.xml", Program("ar", "allreduce", "Simple", 1, 64, 32, True, True, 1024, 0, ()))]
>>> report = coverage(files, [1 << 20, (1 << 20) + 8], dtype_bytes=4, world_size=32)
>>> report.served_calls, report.calls, report.padded_extra_bytes
(1, 2, 224)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .documents import load_document
from .errors import InputError
from .msccl.program import Program
from .msccl.reader import read_header
from .msccl.selection import call_bytes, refusal, serving, smallest_served
from .mscclpp.register import MANIFEST, PlanEntry, decide, load_manifest
from .training.buckets import backward_bounds
from .training.profiles import LayerProfile

MIB = 1 << 20
#: The element type the coverage command's --dtype names, by size (the plans' selector decides by dtype).
DTYPE_NAMES = {4: "float32", 2: "bfloat16"}
#: An element count: up to 18 ASCII digits (int64, as the API's count).
_COUNT = re.compile(r"[0-9]{1,18}")
#: PyTorch DDP's bucket caps: its first bucket closes at 1 MiB, the others at 25 MiB.
DDP_BUCKET_CAP = 25 * MIB
DDP_FIRST_BUCKET_CAP = 1 * MIB


@dataclass(frozen=True)
class Call:
    """One all-reduce of `count` elements, and which file (if any) the runtime runs for it."""

    label: str
    count: int
    nbytes: int
    file: str | None  # the file that serves it
    why_not: str | None  # why no file does
    also: tuple[str, ...]  # other files that could serve it: the file system's listing order decides
    padded_count: int | None  # the smallest count >= count that some file serves
    left_to_nccl: bool = False  # in a window the directory leaves to NCCL by design (handoff.py)
    scratch_bytes: int | None = None  # MSCCL++: the scratch per context of the plan that serves it, at most


@dataclass(frozen=True)
class Coverage:
    calls_detail: tuple[Call, ...]
    world_size: int
    dtype_bytes: int

    @property
    def calls(self) -> int:
        return len(self.calls_detail)

    @property
    def served_calls(self) -> int:
        return sum(c.file is not None for c in self.calls_detail)

    @property
    def bytes(self) -> int:
        return sum(c.nbytes for c in self.calls_detail)

    @property
    def left_calls(self) -> int:
        """Calls in windows the directory leaves to NCCL, where NCCL is the faster."""
        return sum(c.left_to_nccl for c in self.calls_detail)

    @property
    def served_bytes(self) -> int:
        return sum(c.nbytes for c in self.calls_detail if c.file is not None)

    @property
    def scratch_bytes(self) -> int | None:
        """MSCCL++ plans: the scratch the executor holds per rank for these calls, at most,
        while each call keeps its buffer: a context per call (DDP's buckets are tensors of their
        own), each up to its plan's scratch per context; None where a served call's plan does
        not say."""
        served = [c.scratch_bytes for c in self.calls_detail if c.file is not None]
        return None if not served or None in served else sum(served)  # type: ignore[arg-type]

    @property
    def padded_served_calls(self) -> int:
        return sum(c.padded_count is not None for c in self.calls_detail)

    @property
    def padded_extra_bytes(self) -> int:
        return sum((c.padded_count - c.count) * self.dtype_bytes for c in self.calls_detail if c.padded_count is not None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size, "dtype_bytes": self.dtype_bytes,
            "calls": self.calls, "served_calls": self.served_calls, "left_to_nccl_calls": self.left_calls,
            "bytes": self.bytes, "served_bytes": self.served_bytes,
            "padded": {"served_calls": self.padded_served_calls, "extra_bytes": self.padded_extra_bytes},
            "scratch_bytes_at_most": self.scratch_bytes,
            "detail": [{"call": c.label, "count": c.count, "bytes": c.nbytes, "file": c.file, "why_not": c.why_not,
                        "also": list(c.also), "padded_count": c.padded_count, "left_to_nccl": c.left_to_nccl,
                        "scratch_bytes": c.scratch_bytes}
                       for c in self.calls_detail],
        }


def directory_programs(path: str | Path, collective: str = "allreduce",
                       world_size: int | None = None) -> tuple[list[tuple[str, Program]], int]:
    """The headers of a directory's programs of one collective, and their world size.

    Like the runtime, it reads every regular file of the directory (not its subdirectories).
    InputError when none is of the collective, or when they are for several world sizes and
    `world_size` does not pick one."""
    root = Path(path)
    found = directory_headers(root)
    mine = [(name, p) for name, p in found if p.collective == collective]
    if not mine:
        raise InputError(str(root), None, f"no {collective} program among its {len(found)} file(s)")
    sizes = sorted({p.ngpus for _name, p in mine})
    if world_size is None:
        if len(sizes) > 1:
            raise InputError(str(root), "--world-size", f"its {collective} programs are for {', '.join(map(str, sizes))} "
                             "ranks; pick one with --world-size")
        world_size = sizes[0]
    chosen = [(name, p) for name, p in mine if p.ngpus == world_size]
    if not chosen:
        raise InputError(str(root), "--world-size", f"no {collective} program for {world_size} ranks; "
                         f"its programs are for {', '.join(map(str, sizes))}")
    return chosen, world_size


def left_windows(path: str | Path, collective: str = "allreduce", world_size: int | None = None) -> list[tuple[int, int]]:
    """The windows a directory's manifest (.hipipe/manifest.json, written by hipipe compile)
    leaves to NCCL for this collective and world size; none where it has no manifest."""
    manifest = Path(path) / ".hipipe" / "manifest.json"
    if not manifest.is_file():
        return []
    doc = load_document(manifest)
    if not isinstance(doc, dict) or doc.get("collective", collective) != collective:
        return []
    ranks = (doc.get("topology") or {}).get("dimensions")
    if world_size is not None and isinstance(ranks, list):
        if math.prod(d.get("size", 1) for d in ranks if isinstance(d, dict)) != world_size:
            return []
    out = []
    for w in doc.get("left_to_nccl") or []:
        if isinstance(w, dict) and isinstance(w.get("min_bytes"), int) and isinstance(w.get("max_bytes"), int):
            out.append((w["min_bytes"], w["max_bytes"]))
    return out


def directory_headers(path: str | Path) -> list[tuple[str, Program]]:
    """(file name, header) of every regular file of a directory, as the runtime reads them:
    whatever the extension, subdirectories skipped. InputError names a file it cannot read."""
    root = Path(path)
    if not root.is_dir():
        raise InputError(str(root), None, "expected a directory of MSCCL programs (as for MSCCL_ALGO_DIR)")
    # MSCCL_ALGO_DIR is the executor's: a legacy file there makes communicator init fail
    return [(f.name, read_header(f, "executor")) for f in sorted(root.iterdir()) if f.is_file()]


def coverage(files: Sequence[tuple[str, Program]], counts: Sequence[int], dtype_bytes: int, world_size: int,
             labels: Sequence[str] | None = None, collective: str = "allreduce", inplace: bool = True,
             left: Sequence[tuple[int, int]] = ()) -> Coverage:
    """Decide each call as the runtime would, and what padding it would need; a call no file
    serves in one of the `left` windows (min, max bytes) is left to NCCL by design."""
    programs = [p for _name, p in files]
    names = [name for name, _p in files]
    out = []
    for i, count in enumerate(counts):
        hits = serving(programs, collective, world_size, count, dtype_bytes, inplace)
        why = None
        if not hits:
            why = _why_not(programs, collective, world_size, count, dtype_bytes, inplace)
        padded = smallest_served(programs, collective, world_size, count, dtype_bytes, inplace)
        nbytes = call_bytes(collective, world_size, count, dtype_bytes)
        by_design = not hits and any(lo <= nbytes <= hi for lo, hi in left)
        if by_design:
            why = "left to NCCL by design: NCCL's own pick is as fast there"
        out.append(Call(labels[i] if labels else f"call {i}", count, nbytes, names[hits[0]] if hits else None, why,
                        tuple(names[h] for h in hits[1:]), padded, by_design))
    return Coverage(tuple(out), world_size, dtype_bytes)


def directory_plans(path: str | Path, collective: str = "allreduce",
                    world_size: int | None = None) -> tuple[list[PlanEntry], int] | None:
    """A directory's MSCCL++ plans of one collective and their world size, from its manifest;
    None where the directory holds MSCCL programs instead."""
    manifest = Path(path) / MANIFEST
    if not manifest.is_file():
        return None
    doc = load_document(manifest)
    if not isinstance(doc, dict) or doc.get("backend") != "mscclpp":
        return None
    entries = [e for e in load_manifest(path) if e.collective == collective]
    sizes = sorted({e.world_size for e in entries})
    world = world_size or (sizes[0] if len(sizes) == 1 else 0)
    if world not in sizes:
        raise InputError(str(path), "--world-size", f"its {collective} plans are for {', '.join(map(str, sizes)) or 'no'} "
                         "ranks; pick one with --world-size" if len(sizes) > 1 else f"no {collective} plan for {world} ranks")
    return [e for e in entries if e.world_size == world], world


def plan_coverage(entries: Sequence[PlanEntry], counts: Sequence[int], dtype_bytes: int, world_size: int,
                  labels: Sequence[str] | None = None, collective: str = "allreduce",
                  left: Sequence[tuple[int, int]] = (), symmetric_memory: bool = False) -> Coverage:
    """Coverage of a directory of MSCCL++ plans: each in-place call decided as the selector that
    `hipipe_compiler.mscclpp.register` installs decides it, with or without symmetric memory."""
    mine = [e for e in entries if e.collective == collective and e.world_size == world_size]
    node = mine[0].ranks_per_node if mine else 0
    out = []
    for i, count in enumerate(counts):
        nbytes = call_bytes(collective, world_size, count, dtype_bytes)
        reported = nbytes // world_size if collective == "allgather" else nbytes  # what the shim hands the selector
        entry, why = decide(mine, collective, reported, world_size, node, 0, 0, 0, DTYPE_NAMES.get(dtype_bytes, "float32"),
                            symmetric_memory)
        padded = []
        for e in mine:
            if e.inplace and (symmetric_memory or not e.symmetric_memory):
                multiple = math.lcm(e.size_multiple, dtype_bytes * (world_size if collective == "allgather" else 1))
                size = max(nbytes, e.min_message_size)
                size += -size % multiple
                if size <= e.max_message_size:
                    padded.append(size // dtype_bytes // (world_size if collective in ("allgather", "reducescatter") else 1))
        by_design = entry is None and any(lo <= nbytes <= hi for lo, hi in left)
        if by_design:
            why = "left to NCCL by design: NCCL's own pick is as fast there"
        out.append(Call(labels[i] if labels else f"call {i}", count, nbytes, entry.file if entry else None,
                        None if entry else why, (), min(padded, default=None), by_design,
                        entry.scratch_bytes if entry else None))
    return Coverage(tuple(out), world_size, dtype_bytes)


def _why_not(programs: Sequence[Program], collective: str, world_size: int, count: int, dtype_bytes: int,
             inplace: bool) -> str:
    """The reason of the file whose window holds the call, or that no window does."""
    nbytes = call_bytes(collective, world_size, count, dtype_bytes)
    for p in programs:
        if p.min_bytes <= nbytes and (not p.max_bytes or nbytes <= p.max_bytes):
            return refusal(p, collective, world_size, count, dtype_bytes, inplace) or "served"
    return f"no window holds {nbytes} bytes"


def ddp_buckets(tensors: Sequence[tuple[str, int]], dtype_bytes: int, cap_bytes: int = DDP_BUCKET_CAP,
                first_cap_bytes: int = DDP_FIRST_BUCKET_CAP) -> list[tuple[str, int]]:
    """PyTorch DDP's gradient buckets over parameter tensors given in forward order: tensors
    taken in reverse, a bucket closing once it reaches its cap (the first one at
    `first_cap_bytes`). (label, elements) per bucket, in the order DDP all-reduces them.

    >>> ddp_buckets([("a", 100), ("b", 300_000), ("c", 300_000)], 4)
    [('c', 300000), ('b..a', 300100)]
    """
    backward = list(reversed(tensors))
    bounds = [*backward_bounds([n * dtype_bytes for _name, n in backward], cap_bytes, first_cap_bytes), len(backward)]
    out = []
    for start, end in zip(bounds, bounds[1:]):
        names = [name for name, _n in backward[start:end]]
        out.append((names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}", sum(n for _name, n in backward[start:end])))
    return out


def profile_tensors(profile: LayerProfile) -> list[tuple[str, int]]:
    """A profile's parameter tensors in forward order (a layer without its tensors listed is
    one tensor)."""
    out = []
    for layer in profile.layers:
        out += list(layer.tensors) or [(layer.name, layer.params)]
    return out


def read_counts(path: str | Path) -> list[int]:
    """One element count per line (blank lines and # comments skipped); InputError names
    the line of anything else."""
    source = str(path)
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise InputError(source, None, "not UTF-8 text: expected one element count per line") from None
    except OSError as exc:
        raise InputError(source, None, f"cannot read file: {exc.strerror or exc}") from None
    counts = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        if not _COUNT.fullmatch(text) or int(text) < 1:  # ASCII digits: str.isdigit takes "²" too
            what = "from 1 to 18 digits long (an int64 count)" if text.isascii() and text.isdigit() else ">= 1"
            raise InputError(source, f"line {number}", f"expected a whole number of elements {what}, got {text[:40]!r}")
        counts.append(int(text))
    if not counts:
        raise InputError(source, None, "no element counts in the file")
    return counts
