"""Gradient buckets and the ops that synchronise them.

A policy decides a `Schedule` (bucket boundaries, a primitive per bucket, where each
all-gather goes); `build_plan` turns it into a `TrainingPlan`: ops in issue order, with
lanes and dependencies, plus what each forward layer waits for (pipedap.md §4.4).

>>> from hipipe_compiler.training.profiles import profile_from_document
>>> profile = profile_from_document({"dtype_bytes": 4, "layers": [
...     {"name": f"l{i}", "params": 1000, "fwd_ms": 1.0, "bwd_ms": 2.0} for i in range(3)]})
>>> plan = build_plan(profile, uniform_schedule([0, 2], "rs+ag"))
>>> [(op.kind, op.bucket, op.phase) for op in plan.ops]
[('RS', 0, 'backward'), ('RS', 1, 'backward'), ('AG', 1, 'forward'), ('AG', 0, 'forward')]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .profiles import LayerProfile

PRIMITIVES: tuple[str, ...] = ("allreduce", "rs+ag")
OP_COLLECTIVE: Mapping[str, str] = {"AR": "allreduce", "RS": "reducescatter", "AG": "allgather"}


@dataclass(frozen=True)
class Bucket:
    """Consecutive layers synchronised together; id = position in backward (issue) order."""

    id: int
    layers: tuple[int, ...]  # forward indices, ascending
    params: int
    bytes: int
    padded_bytes: int  # elements padded to a multiple of the pad multiple, then to a size its programs take

    @property
    def first_layer(self) -> int:
        """The layer the next forward pass reaches first, so the one that waits for it."""
        return self.layers[0]


@dataclass(frozen=True)
class Schedule:
    """What a policy decides; `build_plan` derives the ops.

    Bucket b holds the layers at backward positions bounds[b] .. bounds[b+1]-1 (position p
    is forward layer L-1-p). ag_delay[b] = -1 puts the all-gather in the next forward pass
    (prefetched `prefetch` buckets ahead, 0 = all issued when backward ends); d >= 0 issues
    it right after the reduce of bucket b+d (capped at the last). `barrier`: the next
    forward (and its all-gathers) waits for every reduce, as an optimizer step does.
    """

    bounds: tuple[int, ...]
    primitives: tuple[str, ...]
    ag_delay: tuple[int, ...]
    ag_lane: int = 1
    barrier: bool = True
    prefetch: int = 1

    def __post_init__(self) -> None:
        n = len(self.bounds)
        if n == 0 or self.bounds[0] != 0 or any(a >= b for a, b in zip(self.bounds, self.bounds[1:])):
            raise ValueError(f"bounds must start at 0 and increase, got {self.bounds}")
        if len(self.primitives) != n or len(self.ag_delay) != n:
            raise ValueError("one primitive and one ag_delay per bucket")
        if any(p not in PRIMITIVES for p in self.primitives) or any(d < -1 for d in self.ag_delay):
            raise ValueError(f"bad primitives {self.primitives} or ag_delay {self.ag_delay}")
        if any(p == "allreduce" and d != -1 for p, d in zip(self.primitives, self.ag_delay)):
            raise ValueError("an all-reduce bucket has no all-gather: its ag_delay must be -1")
        if self.ag_lane not in (0, 1) or self.prefetch < 0:
            raise ValueError(f"bad ag_lane {self.ag_lane} or prefetch {self.prefetch}")

    @property
    def nbuckets(self) -> int:
        return len(self.bounds)


def uniform_schedule(bounds: Sequence[int], primitive: str, ag_delay: int = -1, **options: Any) -> Schedule:
    """Every bucket with the same primitive and all-gather position."""
    n = len(bounds)
    delay = ag_delay if primitive == "rs+ag" else -1
    return Schedule(tuple(bounds), (primitive,) * n, (delay,) * n, **options)


def make_buckets(profile: LayerProfile, bounds: Sequence[int], pad_multiple: int = 1) -> tuple[Bucket, ...]:
    """Buckets for backward-position `bounds`, element counts padded to `pad_multiple`."""
    L = profile.nlayers
    edges = list(bounds) + [L]
    out = []
    for b, (start, end) in enumerate(zip(edges, edges[1:])):
        layers = tuple(range(L - end, L - start))
        params = int(profile.params_array[L - end:L - start].sum())
        padded = -(-params // pad_multiple) * pad_multiple
        out.append(Bucket(b, layers, params, params * profile.dtype_bytes, padded * profile.dtype_bytes))
    return tuple(out)


def threshold_bounds(profile: LayerProfile, cap_bytes: float, first_cap_bytes: float | None = None,
                     forward: bool = False) -> tuple[int, ...]:
    """Size-capped buckets. Backward accumulation (DDP): a bucket closes once it reaches its
    cap (the first one `first_cap_bytes`). Forward accumulation (DeAR): a group closes when
    adding the next layer would reach the cap."""
    sizes = profile.params_array * profile.dtype_bytes
    L = len(sizes)
    if forward:
        starts, acc = [0], 0
        for i in range(L):
            if acc and acc + sizes[i] >= cap_bytes:
                starts.append(i)
                acc = 0
            acc += sizes[i]
        return _forward_to_bounds(starts, L)
    return backward_bounds(sizes[::-1], cap_bytes, first_cap_bytes)


def backward_bounds(sizes: Sequence[float], cap_bytes: float, first_cap_bytes: float | None = None) -> tuple[int, ...]:
    """Where DDP's buckets start among items in backward order: a bucket closes once it
    reaches its cap (the first one `first_cap_bytes`).

    >>> backward_bounds([400, 700, 100, 900, 50], 1000, 500)
    (0, 2, 4)
    """
    bounds, acc, cap = [0], 0.0, first_cap_bytes if first_cap_bytes is not None else cap_bytes
    for p, size in enumerate(sizes):
        acc += size
        if acc >= cap and p + 1 < len(sizes):
            bounds.append(p + 1)
            acc, cap = 0, cap_bytes
    return tuple(bounds)


def _forward_to_bounds(starts: Sequence[int], L: int) -> tuple[int, ...]:
    """Forward group starts (ascending forward indices) as backward-position bounds."""
    ends = list(starts[1:]) + [L]
    return tuple(sorted(L - e for e in ends))


@dataclass(frozen=True)
class Op:
    """One collective call, in issue order. It is issued once its host events have happened
    (its bucket's gradients, a forward layer's start) and the previous op was issued; it
    starts when also its lane is free and the ops in `after` are done."""

    seq: int
    kind: str  # "AR" | "RS" | "AG"
    bucket: int
    lane: int
    phase: str  # "backward" | "forward"
    after: tuple[int, ...] = ()
    grad_ready: bool = False
    forward_start: int | None = None

    @property
    def collective(self) -> str:
        return OP_COLLECTIVE[self.kind]


@dataclass(frozen=True)
class TrainingPlan:
    """Buckets, primitives, ops in issue order and, per forward layer, the ops it waits for.

    A bucket's last op (AR, or AG) is listed at the bucket's first layer in forward order;
    its other layers come after that one, since forward runs layer by layer.
    """

    policy: str
    schedule: Schedule
    buckets: tuple[Bucket, ...]
    ops: tuple[Op, ...]
    forward_waits: tuple[tuple[int, ...], ...]
    pad_multiple: int = 1

    @property
    def primitives(self) -> tuple[str, ...]:
        return self.schedule.primitives


def build_plan(profile: LayerProfile, schedule: Schedule, policy: str = "custom", pad_multiple: int = 1) -> TrainingPlan:
    """The ops a schedule implies. Reduces go on lane 0 in bucket order; all-gathers on
    `ag_lane`, each after its own reduce-scatter; forward-phase all-gathers in forward order."""
    if schedule.bounds[-1] >= profile.nlayers:
        raise ValueError(f"bounds {schedule.bounds} exceed the profile's {profile.nlayers} layers")
    buckets = make_buckets(profile, schedule.bounds, pad_multiple)
    B = len(buckets)
    rsag = [p == "rs+ag" for p in schedule.primitives]
    slots: dict[int, list[int]] = {}
    for b in range(B):
        if rsag[b] and schedule.ag_delay[b] >= 0:
            slots.setdefault(min(b + schedule.ag_delay[b], B - 1), []).append(b)
    ops: list[Op] = []
    reduce_seq = [0] * B
    final = [0] * B
    for b in range(B):
        reduce_seq[b] = final[b] = len(ops)
        ops.append(Op(len(ops), "RS" if rsag[b] else "AR", b, 0, "backward", grad_ready=True))
        for a in slots.get(b, ()):
            final[a] = len(ops)
            ops.append(Op(len(ops), "AG", a, schedule.ag_lane, "backward", after=(reduce_seq[a],)))
    last_reduce = reduce_seq[-1]
    deferred = sorted((b for b in range(B) if rsag[b] and schedule.ag_delay[b] < 0), key=lambda b: buckets[b].first_layer)
    for j, b in enumerate(deferred):
        after = (reduce_seq[b],) if not schedule.barrier or reduce_seq[b] == last_reduce else (reduce_seq[b], last_reduce)
        trigger = buckets[deferred[j - schedule.prefetch]].first_layer if 0 < schedule.prefetch <= j else None
        final[b] = len(ops)
        ops.append(Op(len(ops), "AG", b, schedule.ag_lane, "forward", after=after, forward_start=trigger))
    waits: list[set[int]] = [set() for _ in range(profile.nlayers)]
    for b in range(B):
        waits[buckets[b].first_layer].add(final[b])
    if schedule.barrier:
        waits[0].add(last_reduce)
    return TrainingPlan(policy, schedule, buckets, tuple(ops), tuple(tuple(sorted(w)) for w in waits), pad_multiple)
