"""Hand a directory of plans to MSCCL++'s NCCL shim from a PyTorch job: call `register` before
`torch.distributed.init_process_group("nccl")`, in a process run under `LD_PRELOAD` of
`libmscclpp_nccl.so` (docs/mscclpp.md). Calls no plan serves fall back to the real NCCL
(`MSCCLPP_NCCL_LIB_PATH`).

The selector installed here matches what the manifest records, and what the shim's own
selection does not check: the size multiple (a size the plan's chunks do not divide throws
inside the NCCL call), the buffer mode computed from the pointers as the plan expects it,
and the dtypes the executor reduces. `mscclpp` is imported only inside `register`.

>>> entry = PlanEntry("p", "allreduce", 16, 8, False, 1 << 20, 1 << 24, 4096, "a.json")
>>> choose([entry], "allreduce", 1 << 21, 16, 8, rank=0, input_buffer=0, output_buffer=1 << 30, dtype="float32").name
'p'
>>> choose([entry], "allreduce", (1 << 21) + 16, 16, 8, rank=0, input_buffer=0, output_buffer=1 << 30, dtype="float32")
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..errors import InputError

MANIFEST = Path(".hipipe") / "manifest.json"
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
                              int(e["size_multiple"]), str(e["file"]))
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
           rank: int, input_buffer: int, output_buffer: int, dtype: str) -> PlanEntry | None:
    """The plan for a call, as the shim reports it (`message_size` per rank for an all-gather,
    the whole input for a reduce-scatter), or None to leave the call to NCCL."""
    if dtype not in SUPPORTED_DTYPES:
        return None
    total = message_size * world_size if collective == "allgather" else message_size
    per_rank = message_size if collective == "allgather" else total // max(world_size, 1)
    inplace = buffer_inplace(collective, rank, input_buffer, output_buffer, per_rank)
    for e in entries:
        if (e.collective == collective and e.world_size == world_size and e.ranks_per_node == ranks_per_node
                and e.inplace == inplace and e.min_message_size <= total <= e.max_message_size
                and total % e.size_multiple == 0):
            return e
    return None


def _dtype_name(dtype: Any) -> str:
    """mscclpp's DataType enum member as a plain name (DataType.float32 -> 'float32')."""
    return str(getattr(dtype, "name", dtype)).split(".")[-1].lower()


def register(directory: str | Path, rank: int) -> list[str]:
    """Register every plan of `directory` for this rank with MSCCL++'s AlgorithmCollectionBuilder
    and install the selector; the names registered. Call before init_process_group("nccl")."""
    entries = load_manifest(directory)
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

    def selector(algorithms: dict[str, dict[str, Any]], request: Any) -> Any:
        entry = choose(entries, request.collective, request.message_size, request.world_size, request.n_ranks_per_node,
                       request.rank, int(request.input_buffer), int(request.output_buffer), _dtype_name(request.dtype))
        return None if entry is None else algorithms.get(request.collective, {}).get(entry.name)

    builder.set_algorithm_selector(selector)
    return [e.name for e in entries]
