"""Pad PyTorch's collective calls so the runtime really runs our programs.

The runtime runs an MSCCL program for a call only when the element count is a multiple of the
program's element multiple and the size lies in its window (msccl/selection.py); any other call
silently runs on NCCL's own algorithms. These helpers round each call up to the smallest count
some program of a directory serves, run the collective on the padded tensor, and hand back the
unpadded result, counting what they did.

    state = PaddingState.from_directory(os.environ["MSCCL_ALGO_DIR"])
    model = DistributedDataParallel(model)
    model.register_comm_hook(state, padded_allreduce_hook)
    ...
    print(state.summary())
"""

# no `from __future__ import annotations`: DDP checks a hook's annotations as objects
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..coverage import directory_headers
from ..errors import InputError
from ..msccl.program import Program, size_multiplier
from ..msccl.selection import serving, smallest_served


@dataclass
class PaddingState:
    """The programs of a directory for this world size, and what the padded calls did.

    `calls` counts every call, `served_calls` those sent with a count some program serves,
    `padded_elements` the elements added to get there, and `fallback_calls` those no program
    serves even padded (their size lies outside every window): they run unpadded on NCCL's
    own algorithms. `sent` counts the element counts sent, per collective.
    """

    programs: tuple[Program, ...]
    world_size: int
    process_group: Any = None
    calls: int = 0
    served_calls: int = 0
    padded_elements: int = 0
    fallback_calls: int = 0
    sent: Counter = field(default_factory=Counter)
    emulated_reduce_scatter: bool = False  # the backend lacks reduce-scatter: all-reduce instead

    @classmethod
    def from_directory(cls, path: str | Path, process_group: Any = None) -> "PaddingState":
        """The programs in `path` (as for MSCCL_ALGO_DIR) for the process group's size.

        InputError when the directory holds none for that many ranks."""
        world = dist.get_world_size(process_group)
        found = directory_headers(path)
        mine = tuple(p for _name, p in found if p.ngpus == world)
        if not mine:
            sizes = sorted({p.ngpus for _name, p in found})
            raise InputError(str(path), None, f"no program for {world} ranks; its programs are for "
                             f"{', '.join(map(str, sizes)) or 'no world size'}")
        return cls(mine, world, process_group)

    def padded_count(self, collective: str, count: int, dtype_bytes: int) -> int | None:
        """The smallest count >= count that a program serves, or None when none does."""
        return smallest_served(self.programs, collective, self.world_size, count, dtype_bytes)

    def served(self, collective: str, count: int, dtype_bytes: int) -> bool:
        """Whether the runtime would run one of the programs for this call as it is."""
        return bool(serving(self.programs, collective, self.world_size, count, dtype_bytes))

    def plan(self, collective: str, count: int, dtype_bytes: int) -> int:
        """The count to send for a call of `count` elements, counted in the totals."""
        padded = self.padded_count(collective, count, dtype_bytes)
        self.calls += 1
        if padded is None:
            self.fallback_calls += 1
            padded = count
        else:
            self.served_calls += 1
            self.padded_elements += (padded - count) * size_multiplier(collective, self.world_size)
        self.sent[(collective, padded)] += 1
        return padded

    def summary(self) -> str:
        """One line: calls, how many a program served, and the padding it took."""
        return (f"{self.served_calls} of {self.calls} calls served by the programs, {self.padded_elements} elements "
                f"of padding, {self.fallback_calls} fell back to NCCL")


#: all_gather_into_tensor and reduce_scatter_tensor, under the names torch 2.13 gives them
#: (the old ones warn there).
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_gather_flat(output: torch.Tensor, part: torch.Tensor, group: Any = None) -> None:
    """Gather every rank's `part` into `output` (world_size parts, rank after rank)."""
    _all_gather(output, part, group=group)


def reduce_scatter_flat(output: torch.Tensor, input: torch.Tensor, op: Any = None, group: Any = None,
                        emulate: bool = False) -> bool:
    """Sum `input` (world_size parts) over the ranks and keep this rank's part in `output`.

    Where the backend has no reduce-scatter (gloo in older torch), or with `emulate`, it is
    an all-reduce of a copy of the whole input; returns whether it was emulated, so a caller
    can pass that on and skip the failing attempt next time."""
    op = op or dist.ReduceOp.SUM
    if not emulate:
        try:
            _reduce_scatter(output, input, op=op, group=group)
            return False
        except (RuntimeError, NotImplementedError) as exc:
            if not any(word in str(exc).lower() for word in ("not supported", "unimplemented", "does not support")):
                raise
    whole = input.clone()
    dist.all_reduce(whole, op=op, group=group)
    n, rank = output.numel(), dist.get_rank(group)
    output.copy_(whole[rank * n:(rank + 1) * n].view_as(output))
    return True


def _padded(flat: torch.Tensor, count: int) -> torch.Tensor:
    """`flat` with zeros appended up to `count` elements (itself when already that long)."""
    if flat.numel() == count:
        return flat
    return torch.cat([flat, flat.new_zeros(count - flat.numel())])


def padded_allreduce_hook(state: PaddingState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: all-reduce the bucket padded to a served count, averaged over
    the ranks as DDP's own hook does (`model.register_comm_hook(state, padded_allreduce_hook)`)."""
    tensor = bucket.buffer()
    count = tensor.numel()
    work = _padded(tensor, state.plan("allreduce", count, tensor.element_size()))
    work.div_(state.world_size)
    future = dist.all_reduce(work, group=state.process_group, async_op=True).get_future()

    def unpadded(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        return fut.value()[0][:count]

    return future.then(unpadded)


def padded_all_reduce(state: PaddingState, tensor: torch.Tensor, op: Any = None) -> None:
    """`dist.all_reduce(tensor)` in place, sent padded to a served count."""
    flat = tensor.reshape(-1)
    work = _padded(flat, state.plan("allreduce", flat.numel(), tensor.element_size()))
    dist.all_reduce(work, op=op or dist.ReduceOp.SUM, group=state.process_group)
    if not (work is flat and tensor.is_contiguous()):  # padded, or reshape had to copy
        tensor.copy_(work[:flat.numel()].view(tensor.shape))


def padded_reduce_scatter(state: PaddingState, output: torch.Tensor, input: torch.Tensor, op: Any = None) -> None:
    """`dist.reduce_scatter_tensor(output, input)`, each rank's shard padded to a served count.

    `input` holds world_size shards of output.numel() elements, rank after rank."""
    n, world = output.numel(), state.world_size
    if input.numel() != n * world:
        raise ValueError(f"input has {input.numel()} elements; expected world_size x output = {n * world}")
    padded = state.plan("reducescatter", n, output.element_size())
    shards = input.reshape(world, n)
    if padded != n:
        shards = torch.cat([shards, shards.new_zeros(world, padded - n)], dim=1)
    out = output.new_empty(padded)
    state.emulated_reduce_scatter = reduce_scatter_flat(out, shards.reshape(-1), op=op, group=state.process_group,
                                                        emulate=state.emulated_reduce_scatter)
    output.copy_(out[:n].view_as(output))


def padded_all_gather(state: PaddingState, output: torch.Tensor, input: torch.Tensor) -> None:
    """`dist.all_gather_into_tensor(output, input)`, each rank's part padded to a served count.

    `output` receives world_size parts of input.numel() elements, rank after rank."""
    n, world = input.numel(), state.world_size
    if output.numel() != n * world:
        raise ValueError(f"output has {output.numel()} elements; expected world_size x input = {n * world}")
    padded = state.plan("allgather", n, input.element_size())
    part = _padded(input.reshape(-1), padded)
    gathered = part.new_empty(world * padded)
    all_gather_flat(gathered, part, group=state.process_group)
    output.copy_(gathered.reshape(world, padded)[:, :n].reshape(output.shape))
