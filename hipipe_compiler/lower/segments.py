"""Pass 3 of lowering: roles longer than the step limit are cut, at the same message on
every rank, into segments; each segment of a role is a threadblock of its own, on the next
channel of its group (axis and lane, see Role.group)."""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from typing import Mapping

from .generate import Generator
from .ops import Op


def segment_cuts(gen: Generator, per_rank_ops: list[list[Op]], budgets: dict[tuple[int, int, int], int],
                  extra_steps: list[list[int]], axis_steps: Mapping[int, int] | None = None
                  ) -> dict[tuple[int, int, int], list[tuple[int, int, int]]]:
    """For each group (Role.group): the ticks at which a new threadblock segment starts; `axis_steps`
    holds some axes' threadblocks shorter than the step limit."""
    cuts: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {}
    for key, ticks in _steps_per_tick(gen, per_rank_ops, extra_steps).items():
        default = min(gen.limits.max_steps, (axis_steps or {}).get(key[0], gen.limits.max_steps))
        cuts[key] = _cuts_within(ticks, budgets.get(key, default))
    return cuts


def _steps_per_tick(gen: Generator, per_rank_ops: list[list[Op]], extra_steps: list[list[int]]
                    ) -> dict[tuple[int, int, int], dict[tuple[int, int, int], dict[int, int]]]:
    """Per group, per tick: the steps each (rank, role) spends there (keyed by
    rank * nroles + role). A send after a role's fusing receive costs only its nops."""
    nroles = len(gen.roles)
    group_of = [role.group if role.axis >= 0 else None for role in gen.roles]
    groups: dict[tuple[int, int, int], dict[tuple[int, int, int], dict[int, int]]] = {}
    for rank, ops in enumerate(per_rank_ops):
        extra = extra_steps[rank]
        prev_fuse = [False] * nroles
        for idx, op in enumerate(ops):
            role = op.role
            key = group_of[role]
            if key is None:
                continue
            steps = extra[idx] if op.type == "s" and prev_fuse[role] else 1 + extra[idx]
            prev_fuse[role] = op.fuse
            ticks = groups.get(key)
            if ticks is None:
                ticks = groups[key] = {}
            counts = ticks.get(op.tick)
            if counts is None:
                counts = ticks[op.tick] = {}
            who = rank * nroles + role
            counts[who] = counts.get(who, 0) + steps
    return groups


def _cuts_within(ticks: dict[tuple[int, int, int], dict[int, int]], budget: int) -> list[tuple[int, int, int]]:
    """Cut a group's ticks into segments in which no (rank, role) spends more than
    `budget` steps; a cut goes at the start of the event in progress if that is inside the
    segment, else at the tick that overflows."""
    order = sorted(ticks)
    acc: dict[int, int] = {}
    seg = 0  # index in order of the segment's first tick
    event = 0  # index of the first tick of the current event
    out: list[tuple[int, int, int]] = []
    for i, t in enumerate(order):
        if t[0] != order[event][0]:
            event = i
        counts = ticks[t]
        if i != seg and any(acc.get(who, 0) + c > budget for who, c in counts.items()):
            seg = event if event > seg else i
            out.append(order[seg])
            acc = {}
            for t2 in order[seg:i]:
                for who, c in ticks[t2].items():
                    acc[who] = acc.get(who, 0) + c
        for who, c in counts.items():
            acc[who] = acc.get(who, 0) + c
    return out


def threadblock_keys(ops: list[Op], segments: list[int]) -> set[tuple[int, int]]:
    """A rank's threadblocks: the (role, segment) pairs its operations fall in."""
    return {(op.role, g) for op, g in zip(ops, segments)}


def role_cuts(gen: Generator, cuts: dict[tuple[int, int, int], list[tuple[int, int, int]]]) -> list[list[tuple[int, int, int]]]:
    """Each role's cuts (those of its group)."""
    return [cuts.get(role.group, []) if role.axis >= 0 else [] for role in gen.roles]


def channel_bases(cuts: dict[tuple[int, int, int], list[tuple[int, int, int]]]
                  ) -> tuple[dict[tuple[int, int, int], int], int]:
    """The first channel of every group (its segments take successive channels; the groups of
    one axis follow each other) and the number of channels."""
    channel_base: dict[tuple[int, int, int], int] = {}
    used: dict[int, int] = defaultdict(int)  # per axis: the channels its groups take so far
    for group in sorted(cuts):
        channel_base[group] = used[group[0]]
        used[group[0]] += len(cuts[group]) + 1
    return channel_base, max(used.values(), default=1)


def op_segments(ops: list[Op], role_cuts: list[list[tuple[int, int, int]]]) -> list[int]:
    """Each op's segment of its role: how many of the role's cuts are at or before its tick."""
    out = []
    for op in ops:
        c = role_cuts[op.role]
        out.append(bisect_right(c, op.tick) if c else 0)
    return out
