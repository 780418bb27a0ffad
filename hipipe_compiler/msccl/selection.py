"""How the runtime picks a program for a call (msccl-runtime.md section 14): the one rule that
coverage reports, padding and the compiler's granularity all follow.

Per call, the executor takes the first file (in the directory's listing order) whose
collective and rank count match, whose size window holds the call's bytes, whose element
multiple divides the call's elements, and that allows in-place or out-of-place as the call
is; otherwise NCCL runs its own algorithm, silently.

>>> from hipipe_compiler.msccl.program import Program
>>> header = Program("ar", "allreduce", "Simple", 1, 64, 32, True, True, 1 << 20, (4 << 20) - 1, ())
>>> refusal(header, "allreduce", 32, count=262144, dtype_bytes=4) is None   # 1 MiB of float32
True
>>> refusal(header, "allreduce", 32, count=262150, dtype_bytes=4)
'262150 elements are not a multiple of nchunksperloop 64'
>>> smallest_served([header], "allreduce", 32, count=262150, dtype_bytes=4)
262208
"""

from __future__ import annotations

from math import gcd
from typing import Sequence

from .program import Program, size_multiplier


def element_multiple(program: Program) -> int:
    """The element counts (the API call's `count`) a program serves are multiples of this."""
    return count_multiple(program.collective, program.ngpus, program.nchunksperloop)


def count_multiple(collective: str, nranks: int, nchunksperloop: int) -> int:
    """element_multiple of a program with these header fields: count * the size multiplier
    must divide by nchunksperloop."""
    return nchunksperloop // gcd(nchunksperloop, size_multiplier(collective, nranks))


def call_bytes(collective: str, nranks: int, count: int, dtype_bytes: int) -> int:
    """The bytes the runtime compares with a window: count x dtype x the size multiplier
    (the whole input of a reduce-scatter, the whole output of an all-gather)."""
    return count * dtype_bytes * size_multiplier(collective, nranks)


def refusal(program: Program, collective: str, nranks: int, count: int, dtype_bytes: int,
            inplace: bool = True) -> str | None:
    """Why the runtime would not run `program` for this call, or None when it would."""
    if program.collective != collective:
        return f"the file is for {program.collective}"
    if program.ngpus != nranks:
        return f"the file is for {program.ngpus} ranks, not {nranks}"
    if count <= 0:
        return "an empty call"
    if not (program.inplace if inplace else program.outofplace):
        return f"the file is not for {'in-place' if inplace else 'out-of-place'} calls"
    nbytes = call_bytes(collective, nranks, count, dtype_bytes)
    if nbytes < program.min_bytes or (program.max_bytes and nbytes > program.max_bytes):
        return f"{nbytes} bytes are outside the window {program.min_bytes}..{program.max_bytes or 'unbounded'}"
    if count * size_multiplier(collective, nranks) % program.nchunksperloop:
        return f"{count} elements are not a multiple of nchunksperloop {program.nchunksperloop}"
    return None


def size_refusal(program: Program, nbytes: int, dtype_bytes: int = 4) -> str | None:
    """Why the runtime would not run `program` for a call of nbytes (nccl-tests' size), in
    place if the file allows that, or None when it would.

    >>> header = Program("ar", "allreduce", "Simple", 1, 64, 32, True, True, 1 << 20, (4 << 20) - 1, ())
    >>> size_refusal(header, 1 << 20) is None, size_refusal(header, 1000)
    (True, '1000 bytes are outside the window 1048576..4194303')
    """
    per_count = dtype_bytes * size_multiplier(program.collective, program.ngpus)
    if nbytes % per_count:
        return f"{nbytes} bytes are not a whole number of {per_count}-byte elements ({dtype_bytes}-byte elements per rank)"
    return refusal(program, program.collective, program.ngpus, nbytes // per_count, dtype_bytes, inplace=program.inplace)


def serving(programs: Sequence[Program], collective: str, nranks: int, count: int, dtype_bytes: int,
            inplace: bool = True) -> list[int]:
    """Indices of the programs the runtime could pick for this call (more than one makes the
    choice depend on the file system's listing order)."""
    return [i for i, p in enumerate(programs) if refusal(p, collective, nranks, count, dtype_bytes, inplace) is None]


def smallest_served(programs: Sequence[Program], collective: str, nranks: int, count: int, dtype_bytes: int,
                    inplace: bool = True) -> int | None:
    """The smallest element count >= count that some program serves (pad the call to it), or
    None when every window lies below the call."""
    best = None
    for p in programs:
        if p.collective != collective or p.ngpus != nranks or not (p.inplace if inplace else p.outofplace):
            continue
        mult = element_multiple(p)
        per_elem = dtype_bytes * size_multiplier(collective, nranks)
        lo = max(count, -(-p.min_bytes // per_elem))
        padded = -(-lo // mult) * mult
        if p.max_bytes and padded * per_elem > p.max_bytes:
            continue
        best = padded if best is None else min(best, padded)
    return best
