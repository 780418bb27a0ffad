"""The candidates the HiPIPE search judges before its descent (search.py): a coarse sweep of
chunk counts and pipeline shapes, and the extras swept on top of it (the other protocols,
trees and shapes the descent seldom reaches from the sweep's best).

>>> from hipipe_compiler.presets import preset
>>> topo = preset("dgx-h100-8x4")
>>> [k.label for k in coarse_sweep(chunk_limit(topo, 1 << 20), allreduce=True, large=False)[:4]]
['k1', 'k1-1s', 'k2', 'k2-ag']
"""

from __future__ import annotations

import math

from ..schedule.baselines import DIRECT_MAX_SIZE, default_algorithms
from ..schedule.fold import fold_depth
from ..topology import Topology
from .knobs import Knobs

#: Most pipeline chunks per loop iteration the search considers (program size grows with it).
MAX_CHUNKS = 64
#: From this call size on, candidates use separate send and receive threadblocks everywhere
#: (the same speed, and a program that neighbouring windows can share).
LARGE_WINDOW = 64 << 20
#: From this call size on, windows are bandwidth-bound: the low-latency protocols and trees
#: are no longer swept (and the search gives the descent a larger budget).
BANDWIDTH_WINDOW = 16 << 20
#: Windows below this size also start from one-shot pipelines on two or three lanes with
#: halved end chunks (on the grid they gain from 64 KiB to 1 MiB, and nothing from 4 MiB).
RAMPED_ONESHOT_WINDOW = 4 << 20
#: Below this size lane pipelines are also tried under LL: its latency can outweigh its halved wire efficiency.
LL_LANES_WINDOW = 4 << 20
#: Below this size one-shot pipelines also fold the innermost dimensions into one switch (schedule/fold.py):
#: one hop fewer each way pays at C6p 64 KiB (6.44 -> 5.87 us), and the bytes it adds lose from 256 KiB.
FOLD_WINDOW = 256 << 10


def chunk_limit(topology: Topology, nominal: int) -> int:
    """The most chunks worth trying for calls of `nominal` bytes: a chunk whose last-stage
    messages carry under ~128 bytes per rank only adds latency (one-shot pipelines on three
    lanes still gain from 5 chunks of 64 KiB on 64 ranks)."""
    return max(1, min(MAX_CHUNKS, nominal // (128 * topology.nranks)))


def coarse_sweep(max_chunks: int, allreduce: bool, large: bool) -> list[Knobs]:
    """The sweep the descent's seeds come from: chunk counts up to max_chunks, plain, with
    all-gather lanes, with mixed orders (ramped, on lanes, on three lanes), one-shot for few
    chunks and fanned out for up to 8; `large` windows split send and receive threadblocks."""
    coarse = [Knobs(1), *(Knobs(1, oneshot=True) for _ in [0] if allreduce)]
    for k in (2, 4, 8, 16, 24, 32, 48, MAX_CHUNKS):
        if k > max_chunks:
            break
        spread = [Knobs(k, mix=True, ag_lane=True, granularity=2, ramp=1, arrange="lanes", spread=v) for v in (2, 3)]
        if k == MAX_CHUNKS:  # the finest pipelines pay only with the slow dimension's latency covered
            coarse += spread
            break
        coarse += [Knobs(k), Knobs(k, ag_lane=True), Knobs(k, mix=True, ag_lane=True),
                   Knobs(k, mix=True, ag_lane=True, granularity=4, ramp=2)]
        if k >= 8:
            coarse.append(Knobs(k, mix=True, ag_lane=True, granularity=8, ramp=2, arrange="lanes", split=large))
            coarse.append(Knobs(k, mix=True, ag_lane=True, granularity=4, ramp=2, lanes=3, split=large))
        if k >= 24:
            coarse += [Knobs(k, mix=True, ag_lane=True, granularity=g, ramp=r, arrange="lanes", split=large)
                       for g, r in ((4, 1), (4, 3), (2, 2), (1, 4))]
            coarse += spread
        if allreduce and k <= 4:
            coarse.append(Knobs(k, ag_lane=True, oneshot=True))
        if k <= 8:
            coarse += [Knobs(k, fan=True), Knobs(k, fan=True, oneshot=allreduce)]
    return coarse


def extra_sweep(topology: Topology, nominal: int, max_chunks: int, allreduce: bool, large: bool) -> list[Knobs]:
    """The candidates swept on top of the coarse sweep, outside the descent's budget: where
    latency counts, the low-latency protocols, trees, lane pipelines and ramped one-shot
    pipelines; on topologies with per-protocol latencies, LL128 (and LL) lane pipelines, and
    below FOLD_WINDOW one-shot pipelines with the inner dimensions folded into one switch."""
    extra: list[Knobs] = []
    if nominal < BANDWIDTH_WINDOW:  # where latency counts, the low-latency protocols and trees compete
        trees = allreduce and has_large_switch(topology)
        # where every protocol pays the same alpha, LL128 stays a neighbour in the descent only
        for proto in protocol_choices(topology)[1:] if per_protocol(topology) else ():
            for k in (1, 2, 4, 8, 16):
                if k <= max_chunks:
                    extra += [Knobs(k, protocol=proto), Knobs(k, mix=True, ag_lane=True, protocol=proto),
                              Knobs(k, fan=True, protocol=proto)]
                    if k >= 4:
                        extra.append(Knobs(k, mix=True, ag_lane=True, granularity=4, ramp=2, lanes=3, protocol=proto))
                    if allreduce:
                        extra += [Knobs(k, ag_lane=True, oneshot=True, protocol=proto),
                                  Knobs(k, fan=True, oneshot=True, protocol=proto)]
                    if trees:
                        extra.append(Knobs(k, ag_lane=True, tree=True, protocol=proto))
        if trees:
            extra += [Knobs(k, ag_lane=True, tree=True) for k in (1, 2, 4) if k <= max_chunks]
        # every order on lanes of its own and every chunk's later stages on lanes of their own:
        # the orders share the dimensions and no message waits behind another's latency (the
        # descent seldom reaches this from the sweep: mixing orders on shared lanes loses first)
        extra += [Knobs(k, mix=True, ag_lane=True, fan=True, arrange="lanes", spread=v, protocol=proto)
                  for proto in protocol_choices(topology) for k in (4, 8) if k <= max_chunks for v in (1, 2)]
        if allreduce and nominal < RAMPED_ONESHOT_WINDOW:
            # one-shot pipelines on two or three lanes whose first and last chunks are halved:
            # the first reaches the slow dimension sooner, the last leaves it sooner
            extra += [Knobs(k, lanes=2, ramp=1, oneshot=True, fan=True, protocol=proto, **shape)
                      for proto in protocol_choices(topology) for k in (6, 8) if k <= max_chunks
                      for shape in ({}, {"mix": True, "arrange": "lanes", "granularity": 2})]
            extra += [Knobs(k, lanes=3, ramp=1, oneshot=True, fan=True, protocol=proto)
                      for proto in protocol_choices(topology) for k in (5, 6) if k <= max_chunks]
    if per_protocol(topology) and nominal >= 1 << 20:
        # pipelines with LL128's lower latency, its slow dimension's messages spread over lanes
        extra += [Knobs(k, mix=True, ag_lane=True, granularity=4, ramp=2, lanes=3, spread=v, protocol="LL128")
                  for k in (8, 16, 24) if k <= max_chunks for v in (1, 2, 3)]
        # and each order on its own lanes, tilted a unit either way: rounded to a dozen chunks, the mix can leave a
        # unit too many on an order, which the descent does not reach from a losing seed (C6p 4 MiB: 59.3 -> 44.3 us)
        protos = ("LL128", "LL") if nominal < LL_LANES_WINDOW else ("LL128",)  # C6p 1 MiB under LL: 22.1 -> 20.6 us
        extra += [Knobs(k, mix=True, ag_lane=True, lanes=2, ramp=1, arrange="lanes", spread=v, tilt=t, protocol=proto,
                        split=large)
                  for proto in protos for k in (12, 16, 24, 32) if k <= max_chunks for v in (1, 3) for t in (-1, 0, 1)]
    if per_protocol(topology) and allreduce and nominal < FOLD_WINDOW and folds(topology):
        extra += [Knobs(k, ag_lane=True, lanes=v, ramp=1, oneshot=True, fan=True, fold=True, protocol=proto)
                  for proto in protocol_choices(topology)[1:] for k in (2, 3, 4) if k <= max_chunks for v in (1, 2, 3)]
    return extra


def rings(topology: Topology) -> bool:
    """Whether some dimension runs rings by default (a ring dimension, or a switch too large
    for direct exchange), so both-way rings are a real choice."""
    return "ring" in default_algorithms(topology)


def both_way_sweep(topology: Topology, nominal: int, max_chunks: int) -> list[Knobs]:
    """Where rings meet per-protocol latencies, below LARGE_WINDOW: LL128 (and below
    BANDWIDTH_WINDOW LL) pipelines with both-way rings (n // 2 latencies per ring stage), each
    order on its own lanes and every chunk's later stages fanned out, so that many messages are
    in flight to cover the rest. The descent does not reach them from the sweep: each of those
    knobs alone loses there."""
    if not (per_protocol(topology) and rings(topology) and nominal < LARGE_WINDOW):
        return []
    protocols = ("LL", "LL128") if nominal < BANDWIDTH_WINDOW else ("LL128",)
    return [Knobs(k, mix=True, ag_lane=True, lanes=v, granularity=4, ramp=1, arrange="lanes", fan=True, bidir=True,
                  spread=s, protocol=proto)
            for proto in protocols for k in (6, 8) if k <= max_chunks for v in (2, 3) for s in (1, 3)]


def protocol_choices(topology: Topology) -> tuple[str, ...]:
    """The protocols the search weighs. Where every protocol pays the same alpha, LL only
    doubles the wire bytes, so it is left out (LL128 stays: its deeper FIFOs can pay)."""
    if per_protocol(topology):
        return ("Simple", "LL128", "LL")
    return ("Simple", "LL128")


def per_protocol(topology: Topology) -> bool:
    """Whether some dimension's latency differs by protocol (the protocol is then a real
    decision, and the search sweeps the low-latency ones)."""
    return any(d.per_protocol for d in topology.dimensions)


def folds(topology: Topology) -> bool:
    """Whether the search folds the innermost dimensions into one switch: where they can fold,
    an outer dimension is left and the folded ranks are few enough for direct exchange."""
    depth = fold_depth(topology)
    return 0 < depth < topology.ndims and math.prod(topology.shape[:depth]) <= DIRECT_MAX_SIZE


def has_large_switch(topology: Topology) -> bool:
    """Whether a switch dimension is too large for direct exchange (it runs a ring by
    default), so a tree's 2 log2(n) latencies can beat the ring's n - 1."""
    return any(d.kind == "switch" and d.size > DIRECT_MAX_SIZE for d in topology.dimensions)
