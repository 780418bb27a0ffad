"""Hand a directory of plans to MSCCL++'s NCCL shim from a PyTorch job: call `register` before
`torch.distributed.init_process_group("nccl")`, in a process run under `LD_PRELOAD` of
`libmscclpp_nccl.so` (docs/mscclpp.md). Calls no plan serves fall back to the real NCCL
(`MSCCLPP_NCCL_LIB_PATH`).

The selector installed here matches what the manifest records, and what the shim's own
selection does not check: the size multiple (a size the plan's chunks do not divide throws
inside the NCCL call), the buffer mode computed from the pointers as the plan expects it,
the dtypes the executor reduces, and symmetric memory: a plan that addresses peers' input or
output (the in-switch ones) reads the wrong bytes unless every rank's buffer sits at the same
offset in its allocation, so it serves only where the job promises that, as the shim's own
zero-copy algorithms do (MSCCLPP_NCCL_SYMMETRIC_MEMORY). `mscclpp` is imported only inside
`register`.

>>> entry = PlanEntry("p", "allreduce", 16, 8, False, 1 << 20, 1 << 24, 4096, "a.json")
>>> choose([entry], "allreduce", 1 << 21, 16, 8, rank=0, input_buffer=0, output_buffer=1 << 30, dtype="float32").name
'p'
>>> choose([entry], "allreduce", (1 << 21) + 16, 16, 8, rank=0, input_buffer=0, output_buffer=1 << 30, dtype="float32")
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import InputError

MANIFEST = Path(".hipipe") / "manifest.json"
#: The shim's switch for its zero-copy algorithms, read as the shim reads it: set and not "0".
SYMMETRIC_MEMORY_ENV = "MSCCLPP_NCCL_SYMMETRIC_MEMORY"
LOG = logging.getLogger("hipipe.mscclpp")
#: Dtypes the executor sums (mscclpp.md 1): i32/u32 run as u32; fp8 compiles to nothing on CUDA.
SUPPORTED_DTYPES = ("float16", "bfloat16", "float32", "int32", "uint32")


@dataclass(frozen=True)
class PlanEntry:
    """One plan of a directory, as its manifest describes it."""

    name: str
    collective: str
    world_size: int
    ranks_per_node: int
    inplace: bool
    min_message_size: int
    max_message_size: int
    size_multiple: int
    file: str
    symmetric_memory: bool = False  # it addresses peers' input or output (ExecutionPlan.needs_symmetric_memory)
    scratch_bytes: int | None = None  # per rank and context, at most (context_scratch_bytes); None in older manifests


def load_manifest(directory: str | Path) -> list[PlanEntry]:
    """The plans of a directory written by `hipipe compile --backend mscclpp --sizes`."""
    path = Path(directory) / MANIFEST
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise InputError(str(path), None, f"cannot read the manifest: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise InputError(str(path), None, f"not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("backend") != "mscclpp" or not isinstance(doc.get("plans"), list):
        raise InputError(str(path), "backend", "expected the manifest of a directory of MSCCL++ plans")
    out = []
    for i, e in enumerate(doc["plans"]):
        try:
            entry = PlanEntry(str(e["name"]), str(e["collective"]), int(e["world_size"]), int(e["ranks_per_node"]),
                              bool(e["inplace"]), int(e["min_message_size"]), int(e["max_message_size"]),
                              int(e["size_multiple"]), str(e["file"]),
                              bool(e.get("symmetric_memory", e.get("in_switch", False))),
                              None if e.get("scratch_bytes_per_context") is None else int(e["scratch_bytes_per_context"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(str(path), f"plans[{i}]", f"expected the fields hipipe writes ({exc})") from None
        if Path(entry.file).name != entry.file:
            raise InputError(str(path), f"plans[{i}].file", "expected a file name inside the directory")
        out.append(entry)
    return out


def buffer_inplace(collective: str, rank: int, input_buffer: int, output_buffer: int, per_rank_bytes: int) -> bool:
    """In-place as the plans were proven for: the same buffer, or for an all-gather the
    input at the rank's block of the output."""
    if input_buffer == output_buffer:
        return True
    return collective == "allgather" and input_buffer == output_buffer + rank * per_rank_bytes


def choose(entries: Sequence[PlanEntry], collective: str, message_size: int, world_size: int, ranks_per_node: int,
           rank: int, input_buffer: int, output_buffer: int, dtype: str, symmetric_memory: bool = False) -> PlanEntry | None:
    """The plan for a call, as the shim reports it (`message_size` per rank for an all-gather,
    the whole input for a reduce-scatter), or None to leave the call to NCCL."""
    return decide(entries, collective, message_size, world_size, ranks_per_node, rank, input_buffer, output_buffer,
                  dtype, symmetric_memory)[0]


def symmetric_memory_promised(environ: Mapping[str, str]) -> bool:
    """Whether the job promises symmetric buffers, as the shim reads its switch."""
    value = environ.get(SYMMETRIC_MEMORY_ENV)
    return value is not None and value != "0"


def decide(entries: Sequence[PlanEntry], collective: str, message_size: int, world_size: int, ranks_per_node: int,
           rank: int, input_buffer: int, output_buffer: int, dtype: str,
           symmetric_memory: bool = False) -> tuple[PlanEntry | None, str]:
    """The plan for a call and why, or None and why the call goes to NCCL. The first plan of
    the manifest's order that can serve it wins: fallbacks come after the plans they stand in for."""
    if dtype not in SUPPORTED_DTYPES:
        return None, f"dtype {dtype}"
    total = message_size * world_size if collective == "allgather" else message_size
    per_rank = message_size if collective == "allgather" else total // max(world_size, 1)
    inplace = buffer_inplace(collective, rank, input_buffer, output_buffer, per_rank)
    shaped = [e for e in entries if e.collective == collective and e.world_size == world_size
              and e.ranks_per_node == ranks_per_node and e.inplace == inplace]
    if not shaped:
        return None, f"no {'in-place' if inplace else 'out-of-place'} {collective} plan for this job shape"
    sized = [e for e in shaped if e.min_message_size <= total <= e.max_message_size]
    if not sized:
        return None, "size outside every window"
    if not symmetric_memory and all(e.symmetric_memory for e in sized):
        return None, f"its plan needs symmetric memory ({SYMMETRIC_MEMORY_ENV}=1)"
    sized = [e for e in sized if symmetric_memory or not e.symmetric_memory]
    for e in sized:
        if total % e.size_multiple == 0:
            return e, "served"
    return None, f"size not a multiple of {sized[0].size_multiple} bytes"


@dataclass
class Registration:
    """What `register` set up, and the selector's decisions so far: calls served per plan,
    and calls left to NCCL per reason (to check which calls hit a plan)."""

    names: list[str]
    symmetric_memory: bool = False
    served: Counter = field(default_factory=Counter)
    left: Counter = field(default_factory=Counter)


def _dtype_name(dtype: Any) -> str:
    """mscclpp's DataType enum member as a plain name (DataType.float32 -> 'float32')."""
    return str(getattr(dtype, "name", dtype)).split(".")[-1].lower()


def register(directory: str | Path, rank: int, symmetric_memory: bool | None = None) -> Registration:
    """Register every plan of `directory` for this rank with MSCCL++'s AlgorithmCollectionBuilder
    and install the selector. Call before init_process_group("nccl"). `symmetric_memory` is the
    job's promise that every rank's buffers sit at the same offset in their allocations (by
    default, MSCCLPP_NCCL_SYMMETRIC_MEMORY as the shim reads it); without it, calls whose plan
    addresses peers' buffers go to the plan's fallback, or to NCCL. Each decision is also
    logged at DEBUG on the `hipipe.mscclpp` logger."""
    entries = load_manifest(directory)
    symmetric = symmetric_memory_promised(os.environ) if symmetric_memory is None else symmetric_memory
    for e in entries:
        if not (Path(directory) / e.file).is_file():
            raise InputError(str(Path(directory) / e.file), None, "listed in the manifest but missing")
    import mscclpp  # noqa: PLC0415 - the optional runtime, present only on GPU machines
    import mscclpp.ext  # noqa: PLC0415

    builder = mscclpp.ext.AlgorithmCollectionBuilder()
    for e in entries:
        plan = mscclpp.ExecutionPlan(str(Path(directory) / e.file), rank)
        constraint = mscclpp.Algorithm.Constraint(world_size=e.world_size, n_ranks_per_node=e.ranks_per_node)
        builder.add_algorithm_builder(mscclpp.Algorithm(id=e.name, execution_plan=plan, constraint=constraint))
    registration = Registration([e.name for e in entries], symmetric_memory=symmetric)
    builder.set_algorithm_selector(lambda algorithms, request: select(registration, entries, algorithms, request))
    return registration


def select(registration: Registration, entries: Sequence[PlanEntry], algorithms: dict[str, dict[str, Any]],
           request: Any) -> Any:
    """The selector MSCCL++ calls for every collective: a registered algorithm, or None for NCCL."""
    entry, why = decide(entries, request.collective, request.message_size, request.world_size, request.n_ranks_per_node,
                        request.rank, int(request.input_buffer), int(request.output_buffer), _dtype_name(request.dtype),
                        registration.symmetric_memory)
    algorithm = None if entry is None else algorithms.get(request.collective, {}).get(entry.name)
    if algorithm is None:
        why = why if entry is None else f"{entry.name} is not registered"
        registration.left[why] += 1
    else:
        registration.served[entry.name] += 1
    LOG.debug("%s of %d bytes: %s", request.collective, request.message_size, entry.name if algorithm else f"NCCL ({why})")
    return algorithm
