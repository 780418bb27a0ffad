"""The compiler's main job: a topology, a collective and a byte range in; one verified
Program per size window out, ready to be written as MSCCL XML.

>>> from hipipe_compiler.presets import preset
>>> windows = compile_range(preset("dgx-h100-8x2"), CompileOptions(algorithm="hierarchical"), 1 << 20, 1 << 22)
>>> [(w.window.min_bytes, w.window.max_bytes) for w in windows]
[(1048576, 4194304)]
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Sequence

from .background import Background
from .errors import InputError, PlanError
from .files import write_atomic, writing
from .lower import lower, lowering_key
from .msccl.program import PLANNED_COLLECTIVES, PROTOCOLS, Program
from .msccl.runtime import MAX_CHILDREN, Limits
from .msccl.selection import count_multiple, element_multiple
from .msccl.verify import Report, VerifyOptions, verify
from .msccl.writer import Dialect, write_program
from .optimizer import Knobs, build_plan, optimize
from .schedule import Plan, hierarchical_plan, ring_plan
from .sim import simulate_exact
from .topology import Topology
from .units import format_size
from .windows import Window, size_windows

#: Ranged windows that end below this size are where training frameworks' gradient buckets
#: land (PyTorch DDP closes a bucket once it reaches 25 MiB; FSDP shards a layer at a time).
BUCKET_WINDOW = 64 << 20
#: The default cap on the element multiple in those windows (`--max-bucket-nchunksperloop`):
#: a bucket's element count is a sum of tensor sizes, which for common hidden sizes (768 =
#: 3 x 256, 1024, 2048, ...) is often a multiple of 256 and of nothing larger, so a finer
#: program would never run for BERT's or GPT-2's buckets (docs/pytorch.md measures both).
BUCKET_NCHUNKSPERLOOP = 256
#: By default the cap applies only where it leaves this many times the coarsest plan's
#: multiple, room for a pipeline: on more ranks it would leave one-chunk plans only.
BUCKET_ROOM = 4
#: Algorithms `hipipe compile --algo` accepts.
ALGORITHMS: tuple[str, ...] = ("hipipe", "hierarchical", "ring")
#: Element sizes of the NCCL data types, for the runtime's divisibility rule.
DTYPES: dict[str, int] = {
    "int8": 1, "uint8": 1, "fp8": 1, "float16": 2, "bfloat16": 2,
    "int32": 4, "uint32": 4, "float32": 4, "int64": 8, "uint64": 8, "float64": 8,
}


@dataclass(frozen=True)
class CompileOptions:
    """Everything besides the topology and sizes that decides the programs."""

    collective: str = "allreduce"
    algorithm: str = "hipipe"
    chunks: int | None = None
    protocol: str | None = None  # None: the algorithm's default
    dtype_bytes: int = 4
    limits: Limits = field(default_factory=Limits)
    check: bool = True
    max_nchunksperloop: int | None = None  # cap every window's nchunksperloop, for users who cannot pad
    # cap the element multiple where gradient buckets land (ranged windows below BUCKET_WINDOW):
    # "auto" is BUCKET_NCHUNKSPERLOOP where the topology leaves room for it (BUCKET_ROOM); None: no cap
    max_bucket_nchunksperloop: int | Literal["auto"] | None = "auto"
    # worker processes that simulate the search's candidates ahead of it: sooner, never different
    jobs: int = field(default=1, compare=False)


@dataclass(frozen=True)
class CompiledWindow:
    """One size window's plan, its lowered program and the verifier's verdict."""

    window: Window
    plan: Plan
    program: Program
    report: Report | None
    details: dict[str, Any] = field(default_factory=dict, compare=False)


class VerificationFailed(Exception):
    """A program the compiler produced does not verify (a compiler bug); carries the report."""

    def __init__(self, window: Window, report: Report) -> None:
        self.window = window
        self.report = report
        super().__init__(f"window {window.label}: {report.summary()}")


def check_options(topology: Topology, options: CompileOptions) -> None:
    """Reject options that cannot describe a program, naming the option."""
    if options.collective not in PLANNED_COLLECTIVES:
        raise InputError(None, "--coll", f"expected one of {', '.join(PLANNED_COLLECTIVES)}, got {options.collective!r}")
    if options.algorithm not in ALGORITHMS:
        raise InputError(None, "--algo", f"expected one of {', '.join(ALGORITHMS)}, got {options.algorithm!r}")
    if options.protocol is not None and options.protocol not in PROTOCOLS:
        raise InputError(None, "--proto", f"expected one of {', '.join(PROTOCOLS)}, got {options.protocol!r}")
    if options.chunks is not None and not 1 <= options.chunks <= 4096:
        raise InputError(None, "--chunks", f"expected an integer from 1 to 4096, got {options.chunks}")
    cap = options.max_nchunksperloop
    if cap is not None and cap < topology.nranks:
        raise InputError(None, "--max-nchunksperloop", f"expected at least {topology.nranks} (one chunk per rank), got {cap}")
    bucket = options.max_bucket_nchunksperloop
    if isinstance(bucket, int) and options.algorithm == "hipipe":
        least = coarsest_multiple(topology, options.collective)
        if bucket < least:
            raise InputError(None, "--max-bucket-nchunksperloop", f"expected at least {least} (the coarsest plan's "
                             f"element multiple on {topology.nranks} ranks), or 0 for no cap; got {bucket}")
    check_fits_one_file(topology)


def check_fits_one_file(topology: Topology, source: str | None = None) -> None:
    """InputError unless one MSCCL file can hold a program for every rank of the topology."""
    if topology.nranks > MAX_CHILDREN:
        raise InputError(source or topology.label, "dimensions", f"{topology.nranks} ranks; one MSCCL file holds at most "
                         f"{MAX_CHILDREN}: the runtime's reader keeps {MAX_CHILDREN} <gpu> elements per file in a fixed "
                         "array it does not bound-check, so a larger file corrupts memory on every rank")


def verify_options(limits: Limits) -> VerifyOptions:
    """What the compiler proves its programs against: the runtime they are for, the step
    limit and threadblock budget they were lowered within."""
    return VerifyOptions(max_steps=limits.max_steps, max_threadblocks=limits.max_threadblocks, runtime=limits.runtime)


#: Plans every window of a range at once (so a window can start from its neighbours' choice),
#: returning one plan per window and what the planner wants to report about it.
Planner = Callable[[Topology, CompileOptions, Sequence[Window]], list[tuple[Plan, dict[str, Any]]]]


def baseline_planner(topology: Topology, options: CompileOptions, windows: Sequence[Window]) -> list[tuple[Plan, dict[str, Any]]]:
    """The plans of a baseline algorithm (flat ring or hierarchical with uniform chunks)."""
    chunks = options.chunks or 1
    proto = options.protocol or "Simple"
    out = []
    for w in windows:
        if options.algorithm == "ring":
            plan = ring_plan(topology, options.collective, chunks, proto, w.min_bytes, w.max_bytes, w.max_bytes)
        else:
            plan = hierarchical_plan(topology, options.collective, chunks, proto, min_bytes=w.min_bytes,
                                     max_bytes=w.max_bytes, nominal_bytes=w.max_bytes)
        if options.max_nchunksperloop is not None and plan.nchunksperloop > options.max_nchunksperloop:
            raise InputError(None, "--max-nchunksperloop", f"{options.algorithm} with {chunks} chunk(s) needs "
                             f"{plan.nchunksperloop} chunks per loop, over the cap {options.max_nchunksperloop}; use fewer --chunks")
        out.append((plan, {}))
    return out


def hipipe_planner(topology: Topology, options: CompileOptions, windows: Sequence[Window],
                   progress: Callable[[int, int], None] | None = None) -> list[tuple[Plan, dict[str, Any]]]:
    """HiPIPE: the optimizer's choice per window (optimizer.optimize), judged by the simulator."""
    done = [0]

    def tick(_choice: Any) -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], len(windows))

    caps = bucket_caps(topology, options, windows)
    choices = optimize(topology, options.collective, [(w.min_bytes, w.max_bytes) for w in windows], options.limits,
                       progress=tick, dtype_bytes=options.dtype_bytes, max_nchunksperloop=options.max_nchunksperloop,
                       caps=caps, jobs=options.jobs)
    return [(c.plan, {"choice": c.knobs.label if c.knobs else c.plan.label, "alternatives": c.alternatives,
                      "bucket_cap": cap}) for c, cap in zip(choices, caps)]


def bucket_caps(topology: Topology, options: CompileOptions, windows: Sequence[Window]) -> list[int | None]:
    """The cap on the element multiple of each window: options.max_bucket_nchunksperloop in the
    ranged windows below BUCKET_WINDOW, none elsewhere (a window of one size serves that size
    only). "auto" caps at BUCKET_NCHUNKSPERLOOP only where that leaves BUCKET_ROOM times the
    coarsest plan's multiple: on more ranks it would cost the pipeline for little coverage."""
    setting = options.max_bucket_nchunksperloop
    if setting is None or not windows:
        return [None] * len(windows)
    cap = BUCKET_NCHUNKSPERLOOP if setting == "auto" else setting
    if setting == "auto" and coarsest_multiple(topology, options.collective) * BUCKET_ROOM > cap:
        return [None] * len(windows)
    return [cap if w.min_bytes < w.max_bytes and w.max_bytes < BUCKET_WINDOW else None for w in windows]


def coarsest_multiple(topology: Topology, collective: str) -> int:
    """The element multiple of the coarsest HiPIPE plan: no cap can go below it."""
    plan = build_plan(topology, collective, 1 << 20, 1 << 20, Knobs(1))
    return count_multiple(collective, topology.nranks, plan.nchunksperloop)


class Stopwatch:
    """Seconds a command spends in each of its phases, summed over the phase's visits.

    >>> watch = Stopwatch()
    >>> with watch.phase("lower"):
    ...     pass
    >>> list(watch.seconds)
    ['lower']
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


#: The most memory proving a program takes per step, with room to spare (the pod's 1,024-rank
#: programs take 0.7 kB).
PROOF_BYTES_PER_STEP = 1024


def compile_range(topology: Topology, options: CompileOptions, min_bytes: int, max_bytes: int,
                  planner: Planner | None = None, merge: bool = True,
                  stopwatch: Stopwatch | None = None, timed: bool = True) -> list[CompiledWindow]:
    """Compile every size window of [min, max]; adjacent windows with the same program merge.

    Every final program is proven by the verifier at its own window's largest size, and
    timed by the simulator at the window's largest size for the summary (`timed` False: not,
    for a backend that times its own translation). `stopwatch` (if given) gets the seconds
    spent planning, lowering, verifying (proving, or waiting for the children that prove:
    options.jobs) and predicting.
    """
    watch = stopwatch or Stopwatch()
    check_options(topology, options)
    if planner is None:
        planner = hipipe_planner if options.algorithm == "hipipe" else baseline_planner
    windows = size_windows(min_bytes, max_bytes)
    cache: dict[Any, Program | PlanError] = {}

    def lowered(plan: Plan) -> Program:
        key = lowering_key(plan)
        if key not in cache:
            try:
                with watch.phase("lower"):
                    cache[key] = lower(plan, options.limits).with_window(0, 0)
            except PlanError as exc:
                cache[key] = exc
        result = cache[key]
        if isinstance(result, PlanError):
            raise result
        return result

    with watch.phase("plan"):
        plans = planner(topology, options, windows)
    with Background[Report](options.jobs if options.check else 1) as proofs:
        return _finished(topology, options, windows, plans, lowered, merge, watch, proofs, timed)


def _finished(topology: Topology, options: CompileOptions, windows: Sequence[Window], plans: Sequence[tuple[Plan, dict]],
              lowered: Callable[[Plan], Program], merge: bool, watch: Stopwatch, proofs: Background[Report],
              timed: bool) -> list[CompiledWindow]:
    """compile_range's windows lowered, merged, proven and timed. Each final program goes to
    `proofs` as soon as the next window's lowering shows it final, so a child proves it while
    the parent lowers on."""
    out: list[CompiledWindow] = []

    def prove(index: int) -> None:
        if options.check:
            program = out[index].program
            proofs.submit(index, partial(verify, program, verify_options(options.limits)),
                          program.nsteps * PROOF_BYTES_PER_STEP)

    for w, (plan, details) in zip(windows, plans):
        candidates = [plan, *details.pop("alternatives", ())]
        for index, candidate in enumerate(candidates):
            # the planner judged rank 0; a candidate that does not fit every rank gives way
            candidate = candidate.with_window(w.min_bytes, w.max_bytes)
            try:
                program = lowered(candidate)
            except PlanError:
                if index == len(candidates) - 1:
                    raise
                continue
            plan = candidate
            break
        if merge and out and out[-1].program.with_window(0, 0) == program:
            merged = Window(out[-1].window.min_bytes, w.max_bytes)
            out[-1] = replace(out[-1], window=merged, plan=plan.with_window(merged.min_bytes, merged.max_bytes),
                              program=program.with_window(merged.min_bytes, merged.max_bytes))
        else:
            if out:
                prove(len(out) - 1)
            out.append(CompiledWindow(w, plan, program.with_window(w.min_bytes, w.max_bytes), None, details))
    if out:
        prove(len(out) - 1)
    for i, cw in enumerate(out):
        if options.check:  # every proof before any prediction: a broken program gets the verifier's report
            # the FIFO model depends on the window's largest size, so each final window is proven
            with watch.phase("verify"):
                report = proofs.result(i)
            if not report.ok:
                raise VerificationFailed(cw.window, report)
            out[i] = replace(cw, report=report)
    if timed:
        with watch.phase("predict"):
            out = [replace(cw, details={**cw.details, **predict(cw, topology)}) for cw in out]
    return out


def predict(cw: CompiledWindow, topology: Topology) -> dict[str, Any]:
    """Simulated time, busbw and utilisation at the window's largest size."""
    size = cw.window.max_bytes
    result = simulate_exact(cw.program, topology, size)
    return {"predicted_at_bytes": size, "predicted_us": result.time_us, "busbw_GBps": result.busbw_GBps,
            "utilisation": result.utilisation, "utilisation1": result.utilisation1}


def check_divisible(program: Program, nbytes: int, dtype_bytes: int) -> None:
    """Raise InputError when the runtime could never select this program for a call of nbytes."""
    multiple = program.nchunksperloop * dtype_bytes
    if nbytes % multiple:
        raise InputError(None, "--size", f"{nbytes} bytes is not a multiple of {multiple} bytes "
                         f"(nchunksperloop {program.nchunksperloop} x {dtype_bytes}-byte elements): the runtime would never "
                         "select this program; choose a size that is such a multiple, or fewer chunks")


# -- output --------------------------------------------------------------------------------------

MANIFEST_DIR = ".hipipe"


def program_file_name(cw: CompiledWindow, index: int) -> str:
    """File name of one window's program; names sort in window order."""
    p = cw.program
    end = cw.window.max_bytes + 1
    end = end if end & (end - 1) == 0 else cw.window.max_bytes  # 64MiB-1GiB, whether 1GiB is in or just out
    return f"{p.collective}-{p.ngpus}r-{index:02d}-{format_size(cw.window.min_bytes)}-{format_size(end)}.xml"


def write_file(cw: CompiledWindow, path: str | Path, dialect: Dialect = "executor") -> None:
    """Write one window's program to a file, atomically."""
    text = write_program(cw.program, dialect)
    with writing(Path(path)):
        write_atomic(path, text)


def write_directory(windows: Sequence[CompiledWindow], path: str | Path, manifest: dict[str, Any],
                    dialect: Dialect = "executor", names: Sequence[str] | None = None,
                    replaces: Callable[[str], bool] | None = None) -> list[Path]:
    """Write one XML per window into a directory ready for MSCCL_ALGO_DIR.

    The runtime parses every regular file of that directory as an algorithm, so the JSON
    manifest goes into the subdirectory .hipipe/, which it skips, and XML files that
    `replaces(name)` claims (by default: the same collective and rank count, whose windows
    would overlap the new ones) are removed when the new set does not include them. All XML
    text is produced before the first file is written. `names` overrides the file names.
    """
    path = Path(path)
    names = [program_file_name(cw, i) for i, cw in enumerate(windows)] if names is None else list(names)
    texts = [(name, write_program(cw.program, dialect)) for name, cw in zip(names, windows)]
    if replaces is None:
        prefixes = {f"{cw.program.collective}-{cw.program.ngpus}r-" for cw in windows}
        replaces = lambda name: any(name.startswith(p) for p in prefixes)  # noqa: E731
    manifest = {**manifest, "files": [name for name, _ in texts]}
    return write_file_set(path, texts, manifest, ".xml", replaces)


def write_file_set(path: str | Path, texts: Sequence[tuple[str, str]], manifest: dict[str, Any], suffix: str,
                   replaces: Callable[[str], bool]) -> list[Path]:
    """Write (name, text) files and .hipipe/manifest.json into a directory, atomically each,
    checking every target before the first write; files of `suffix` that `replaces(name)`
    claims and the new set lacks are removed."""
    path = Path(path)
    for target in (*(path / name for name, _ in texts), path / MANIFEST_DIR / "manifest.json"):
        if target.exists() and not target.is_file():  # found before any file is written, not half-way
            raise InputError(str(target), None, "expected to write a file here, but a directory or device is there")
    written = []
    with writing(path):
        path.mkdir(parents=False, exist_ok=True)
        (path / MANIFEST_DIR).mkdir(exist_ok=True)
        for name, text in texts:
            write_atomic(path / name, text)
            written.append(path / name)
        keep = {name for name, _ in texts}
        for old in path.iterdir():
            if old.suffix == suffix and old.is_file() and old.name not in keep and replaces(old.name):
                old.unlink()
        write_atomic(path / MANIFEST_DIR / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    return written


def chunk_label(plan: Plan) -> str:
    """Pipeline chunks per loop, as '4' or '2x2' (two chunks, each split over both ring directions)."""
    n = len(plan.chunks)
    both = {c.direction for c in plan.chunks} == {1, -1} and n % 2 == 0 and all(
        plan.chunks[i].order == plan.chunks[i + 1].order and plan.chunks[i].units == plan.chunks[i + 1].units
        for i in range(0, n, 2))
    return f"{n // 2}x2" if both else str(n)


def window_summary(cw: CompiledWindow) -> dict[str, Any]:
    """The facts a user wants per window: chunks, sizes, channels, threadblocks, steps."""
    plan, program = cw.plan, cw.program
    return {
        "min_bytes": cw.window.min_bytes,
        "max_bytes": cw.window.max_bytes,
        "algorithm": plan.label,
        "protocol": program.protocol,
        "chunks": chunk_label(plan),
        "chunk_units": [c.units for c in plan.chunks],
        "orders": [list(c.order) for c in plan.chunks],
        "fold": list(plan.fold),  # sizes of the dimensions axis 0 of the orders folds into one switch ([]: none)
        "nchunksperloop": program.nchunksperloop,
        "element_multiple": element_multiple(program),
        "channels": program.nchannels,
        "threadblocks": program.max_threadblocks,
        "longest_threadblock": program.max_steps,
        "verified": None if cw.report is None else cw.report.ok,
        **cw.details,
    }
