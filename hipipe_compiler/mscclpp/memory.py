"""Where an operand lives: local operands in one coordinate space per rank, so that aliasing
of the input and output buffers (in-place calls) is seen as overlap. Shared by the
translation, which places nops, and by the verifier, which checks them.

Layouts (mscclpp.md 1 and 8.1): `separate` buffers; `inplace` as the NCCL shim recognises it
(all-reduce: send == recv; all-gather: send = recv + rank*In); `nccl` as NCCL lays out an
in-place reduce-scatter (recv = send + rank*Out), which the shim calls out-of-place.

>>> where("allreduce", 0, 4, 4, "inplace", "i", 1, 2)
('io', 1, 3)
>>> where("allgather", 2, 1, 4, "inplace", "i", 0, 1)
('io', 2, 3)
"""

from __future__ import annotations

LAYOUTS = ("separate", "inplace", "nccl")


def where(collective: str, rank: int, input_chunks: int, output_chunks: int, layout: str, buffer: str,
          index: int, size: int) -> tuple[str, int, int]:
    """(space, start, end) in chunks of a local operand under a buffer layout."""
    if buffer == "s" or layout == "separate":
        return buffer, index, index + size
    if buffer == "o":
        if collective == "reducescatter":  # the output is a block of the input
            return "io", rank * output_chunks + index, rank * output_chunks + index + size
        return "io", index, index + size
    if collective == "allgather":  # the input is a block of the output
        return "io", rank * input_chunks + index, rank * input_chunks + index + size
    return "io", index, index + size


def aliased_layout(collective: str) -> str:
    """The layout in which a call with overlapping buffers reaches an out-of-place plan (RS) or an in-place one."""
    return "nccl" if collective == "reducescatter" else "inplace"


def overlaps(a: tuple[str, int, int], b: tuple[str, int, int]) -> bool:
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]
