"""The HiPIPE search: for a topology, collective and size window, candidate plans (knobs.py,
candidates.py) and the baselines are lowered and simulated, and the simulator is the judge
(judge.py; design.md "Optimizer"): a coarse sweep, coordinate descent over every knob from the best
few, and the finalists judged again at both ends of the window. With workers, the candidates
the search is about to ask for are simulated ahead (`ahead`): the same choices, sooner.

>>> from hipipe_compiler.presets import preset
>>> [choice] = optimize(preset("dgx-h100-8x2"), "allreduce", [(1 << 20, 1 << 20)])
>>> choice.plan.label.startswith(("hipipe", "hierarchical", "themis", "ring"))
True
"""

from __future__ import annotations

import math
from contextlib import closing
from dataclasses import dataclass, replace
from itertools import islice
from typing import Callable, Iterable, Iterator, Sequence

from ..bounds import lower_bound_us
from ..collector import settling
from ..errors import PlanError
from ..msccl.program import PROTOCOLS
from ..schedule.baselines import hierarchical_plan, ring_plan, themis_plan, tree_plan
from ..schedule.estimate import time_floor_us
from ..schedule.plan import Plan, plan_shape
from ..schedule.trees import nccl_tree_fits
from ..topology import Topology
from .candidates import (BANDWIDTH_WINDOW, LARGE_WINDOW, MAX_CHUNKS, both_way_sweep, chunk_limit, coarse_sweep,
                         extra_sweep, has_large_switch, protocol_choices, rings)
from .judge import Evaluation, Search
from .knobs import Knobs, build_plan


#: A window keeps its smaller neighbour's plan when that costs less than this (the two windows
#: then share one program and file when the plan does not depend on the window).
REUSE_TOLERANCE = 0.003
#: Simulations per window for the coordinate descent (in a window of one size, plans dropped
#: by their time floor, or of one shape with one simulated already, cost nothing from it: see
#: Reach); bandwidth-bound windows (from BANDWIDTH_WINDOW on) get more on topologies up to
#: BANDWIDTH_RANKS ranks, since balancing every dimension is where the search pays (larger
#: ones cost too much per simulation).
BUDGET = 60
BANDWIDTH_BUDGET = 160
BANDWIDTH_RANKS = 256
#: Among the finalists within this much of the best mean T / T_LB, the one with the smallest
#: nchunksperloop wins: the runtime runs a program only for element counts it divides, so a
#: finer program serves more of a training job's calls (see msccl/selection.py).
GRANULARITY_TOLERANCE = 0.01
#: Scores this close are a tie (the same simulated time, up to rounding), which the finer plan
#: wins in a window of one size too.
TIE = 1e-9
#: Best candidates after the descent that are also tried finer, for that preference.
FINER_TRIALS = 3
#: Candidates of the coarse sweep the coordinate descent starts from (in a window of one size,
#: made up from the others' where the baselines' floors dropped the sweep's).
SEEDS = 3
#: Candidates of the other protocols, trees and shapes swept on top that the descent also
#: starts from, when they beat the sweep's: two, since equal times often hide different
#: shapes that descend differently.
EXTRA_SEEDS = 2
#: The best pipeline of mixed orders with at least this many chunks also refines its chunk
#: count together with its ramp or spread, on what the descents left of the budget.
PAIRED_CHUNKS = 16
#: The most chunks a descent step toggles `fan` at, in a window of one size and in a wider one:
#: each chunk's later stages take a lane of their own, so more chunks run out of channels
#: (zoo02 1 MiB gains at 12).
FAN_CHUNKS = 16
RANGED_FAN_CHUNKS = 8
#: In a window of one size below BANDWIDTH_WINDOW, the best mixed pipeline also tries every
#: tilt up to this many units either way.
TILT_REACH = 8
#: A window of one size may spend this many times its budget, the rest after one budget's
#: passes on descending further from its best few plans: on small tori and PCIe nodes at 1-64
#: MiB those descents still improve when one budget runs out.
ONE_SIZE_BUDGET_SCALE = 2
#: Below BANDWIDTH_WINDOW, a window of one size then spends this share of a budget more on
#: descents from its best plans that no descent came within a step of: the others start from
#: the best few and end in one basin, while the times are rugged where latency counts (zoo02
#: 1 MiB: from 2.3 % to 1.1 % of the reference's best; of 66 points 7 faster, none slower).
FAR_BUDGET_SHARE = 0.5
#: Best candidates of the coarse sweep that are also tried with both-way rings on tori.
BIDIR_TRIALS = 6
#: A candidate whose time floor (plan.time_floor_us) is this much above the best simulated
#: time so far is not lowered or simulated: it cannot win, and the margin keeps the near
#: misses that may still rank among the descent's seeds and the finalists.
FLOOR_MARGIN = 0.05
#: Windows above this size rank their candidates here, and simulate only the finalists and
#: the baselines at their own sizes: from here on every candidate's time is its replays'
#: steady state, which this size already shows, while a replay count grown with the size
#: would cost simulations that the period detector cannot always skip (sim/period.py).
SCREEN_BYTES = 4 << 30


@dataclass(frozen=True)
class Reach:
    """How far a window's descent reaches. A window of one size gets the wider reach and a
    larger budget: its candidates are judged at the very size they are picked at, so a better
    find is a faster program. In a wider window the same finds, better at its middle, changed
    which finalists were judged at its ends, and picks got faster at one end and slower at the
    other (C1's 1 MiB..<2 MiB: 6.6 % slower at 1 MiB), for about 12 % more compile time."""

    fan_chunks: int  # the most chunks a step toggles `fan` at
    tilt_pairs: bool  # paired steps also move the granularity with a unit of tilt
    tilt_reach: int  # below BANDWIDTH_WINDOW, every tilt of the best mixed pipeline this far either way
    free_misses: bool  # plans dropped by their time floor or sharing a simulation cost nothing from the budget
    pooled: bool  # distinct seeds, made up from the extras, the best first, sharing one pool
    budget_scale: int  # times its budget a window may spend: what is beyond one budget goes to its best few
    far_share: float  # below BANDWIDTH_WINDOW, the share of a budget more for descents far from every earlier one


ONE_SIZE = Reach(FAN_CHUNKS, True, TILT_REACH, True, True, ONE_SIZE_BUDGET_SCALE, FAR_BUDGET_SHARE)
RANGED = Reach(RANGED_FAN_CHUNKS, False, 0, False, False, 1, 0.0)


def _knob_neighbours(k: Knobs, allreduce: bool, rings: bool, protocols: Sequence[str] = ("Simple", "LL128"),
                     trees: bool = False, fan_chunks: int = FAN_CHUNKS) -> list[Knobs]:
    out = []
    for chunks in sorted({max(1, k.chunks // 2), max(1, round(k.chunks * 2 / 3)), min(MAX_CHUNKS, round(k.chunks * 3 / 2)),
                          min(MAX_CHUNKS, k.chunks * 2)}):
        if chunks != k.chunks:
            out.append(replace(k, chunks=chunks))
    out += [replace(k, mix=not k.mix), replace(k, ag_lane=not k.ag_lane), replace(k, lp_sizes=not k.lp_sizes)]
    out += [replace(k, lanes=v) for v in (1, 2, 3) if v != k.lanes]
    out += [replace(k, granularity=v) for v in (1, 4, 8, 16) if v != k.granularity]
    out += [replace(k, ramp=v) for v in (0, 1, 2, 3) if v != k.ramp]
    out += [replace(k, spread=v) for v in (1, 2, 3) if v != k.spread]
    out += [replace(k, protocol=v) for v in protocols if v != k.protocol]
    if k.chunks <= fan_chunks:
        out.append(replace(k, fan=not k.fan))
    out.append(replace(k, split=not k.split))
    if k.mix:
        out += [replace(k, arrange=v) for v in ("spread", "lanes") if v != k.arrange]
        out += [replace(k, tilt=k.tilt + d) for d in (1, -1, 3, -3)]
    if allreduce:
        out.append(replace(k, oneshot=not k.oneshot))
    if rings:
        out.append(replace(k, bidir=not k.bidir))
    if trees and allreduce:
        out.append(replace(k, tree=not k.tree))
    # last, a refinement: chunk counts a sixth apart, tried once the coarse steps stop paying
    out += [replace(k, chunks=c) for c in _refined_chunks(k)]  # repeats cost nothing (tried)
    return out


def _refined_chunks(k: Knobs) -> list[int]:
    """Chunk counts a sixth apart from k's."""
    step = max(1, round(k.chunks / 6))
    return [c for c in (k.chunks - step, k.chunks + step) if 1 <= c <= MAX_CHUNKS]


def _paired_neighbours(k: Knobs, tilt_pairs: bool = True) -> list[Knobs]:
    """k's granularity refined together with its tilt (with `tilt_pairs`), and its chunk count
    with its ramp or its spread. A tilt counts units, whose size the granularity sets, so a
    granularity that loses alone can win with a unit more or less tilted (zoo23 1 MiB: g4 ->
    g2-t+1, 4 % faster); and how a mixed pipeline's chunks split among orders and lanes changes
    with their count, so a count that loses alone can win with another ramp or spread (C6p
    256 MiB: k24-r1 -> k28-r2)."""
    if not k.mix:
        return []
    out = [replace(k, granularity=g, tilt=k.tilt + d)
           for g in (k.granularity // 2, k.granularity * 2) if tilt_pairs and 1 <= g <= 16 for d in (1, -1)]
    if k.chunks < PAIRED_CHUNKS:
        return out
    changes = ({"ramp": k.ramp + 1}, {"ramp": max(0, k.ramp - 1)}, *({"spread": v} for v in (1, 2, 3) if v != k.spread))
    return out + [replace(k, chunks=c, **change) for c in _refined_chunks(k) for change in changes]


@dataclass(frozen=True)
class Choice:
    """The plan HiPIPE picked for one size window, with what it was judged on, and the next
    best candidates (to fall back on if the chosen plan does not fit every rank)."""

    min_bytes: int
    max_bytes: int
    plan: Plan
    knobs: Knobs | None
    sizes: tuple[int, ...]
    times_us: tuple[float, ...]
    evaluations: int
    alternatives: tuple[Plan, ...] = ()


def judged_sizes(min_bytes: int, max_bytes: int) -> tuple[int, ...]:
    """The sizes a window's candidates are simulated at: its two ends (one when they meet)."""
    return (min_bytes,) if min_bytes == max_bytes else (min_bytes, max_bytes)


def _baselines(topology: Topology, collective: str, lo: int, hi: int, nominal: int) -> list[tuple[Knobs | None, Plan]]:
    """The baselines of bench: hierarchical with 1, 4, 16 uniform chunks, Themis-like, and the
    flat ring last (it is simulated on every rank, so it is judged only if the others leave
    it a chance)."""
    out: list[tuple[Knobs | None, Plan]] = []
    for k in (1, 4, 16):
        out.append((None, hierarchical_plan(topology, collective, k, min_bytes=lo, max_bytes=hi, nominal_bytes=nominal)))
    out.append((None, themis_plan(topology, collective, 16, min_bytes=lo, max_bytes=hi, nominal_bytes=nominal)))
    out.append((None, ring_plan(topology, collective, 1, "Simple", lo, hi, nominal)))
    return out


def _protocol_baselines(topology: Topology, collective: str, lo: int, hi: int, nominal: int) -> list[Plan]:
    """The baselines under the other protocols, and NCCL's ring and tree under each (the tree
    for an all-reduce over a network where its links exist: every dimension but the innermost
    a switch), on one channel: cheap to judge where latency decides. Bench times NCCL as it
    runs, on its own channels (nccl/timing.py)."""
    out = [hierarchical_plan(topology, collective, 1, proto, min_bytes=lo, max_bytes=hi, nominal_bytes=nominal)
           for proto in ("LL", "LL128")]
    if collective == "allreduce" and nccl_tree_fits(topology):
        out += [tree_plan(topology, collective, 4, proto, lo, hi, nominal) for proto in PROTOCOLS]
    out += [ring_plan(topology, collective, 1, proto, lo, hi, nominal) for proto in ("LL", "LL128")]
    return out


#: Restricted searches for the ablation of `hipipe bench --ablation`: knob values forced on
#: every candidate, and whether the baselines compete.
ABLATIONS: dict[str, tuple[dict[str, object], bool]] = {
    "hipipe-uniform": ({"lp_sizes": False, "ramp": 0, "mix": False}, False),
    "hipipe-lp-1order": ({"lp_sizes": True, "mix": False}, False),
    "hipipe-lp-mixed": ({"lp_sizes": True, "mix": True}, False),
    "hipipe-fixed-k8": ({"chunks": 8}, False),
}


def optimize_window(search: Search, min_bytes: int, max_bytes: int, seeds: Sequence[Knobs] = (),
                    budget: int | None = None, forced: dict[str, object] | None = None, baselines: bool = True,
                    neighbour: Choice | None = None, cap: int | None = None, reach: Reach | None = None) -> Choice:
    """The best plan for calls of min_bytes..max_bytes, judged by the simulator.

    Candidates: the baselines; a coarse sweep of chunk counts, plain or with order mixing
    and all-gather lanes, and with one-shot for few chunks; where latency counts, the other
    protocols, trees and shapes the descent seldom reaches, and where rings meet per-protocol
    latencies, both-way ring lane pipelines; then coordinate descent over every knob from the
    best three, the best two of the extras and the best both-way one (chunk counts refined last),
    and from the best it found with paired steps too, on what the budget has left, as far as
    `reach` goes (by default the wider ONE_SIZE in a window of one size, which then spends a
    second budget descending from its best three and, below BANDWIDTH_WINDOW, half a budget
    from its best plans no descent came within a step of); all judged at the window's middle.
    The five best distinct plans (and the best of each finer nchunksperloop) are judged again
    at both ends of the window; the finest within GRANULARITY_TOLERANCE of the best mean
    T / T_LB wins (in a window of one size, the finest of those that tie with the best), and
    the `neighbour` window's plan wins if it is within REUSE_TOLERANCE of that and no coarser.
    `cap` bounds the element multiple of this window's calls, besides the search's own cap on
    nchunksperloop. Above SCREEN_BYTES, candidates are judged at that size instead of the
    middle, and the baselines join the finalists."""
    topo, coll = search.topology, search.collective
    nominal = int(math.sqrt(min_bytes * max_bytes))
    screened = nominal > SCREEN_BYTES
    middle = (min(nominal, SCREEN_BYTES),)
    if budget is None:
        bandwidth_bound = nominal >= BANDWIDTH_WINDOW and topo.nranks <= BANDWIDTH_RANKS
        budget = BANDWIDTH_BUDGET if bandwidth_bound else BUDGET

    def selectable(plan: Plan) -> bool:
        return search.divides(plan, min_bytes)

    def allowed(plan: Plan) -> bool:
        return search.allowed(plan, cap)

    if reach is None:
        reach = ONE_SIZE if min_bytes == max_bytes else RANGED

    def charged() -> int:
        """What the budget has counted so far."""
        return search.simulations if reach.free_misses else search.evaluations

    start = charged()
    skipped = 0  # candidates dropped by their time floor, where they count toward the budget
    bound = lower_bound_us(topo, coll, middle[0], in_switch=False) or 1.0
    allreduce = coll == "allreduce"
    def hopeless(plan: Plan, scores: Iterable[float]) -> bool:
        """Whether the plan's time floor already loses to the best of these scores."""
        return time_floor_us(plan, middle[0], topo) / bound > min(scores, default=math.inf) * (1 + FLOOR_MARGIN)

    baseline_plans = _baselines(topo, coll, min_bytes, max_bytes, nominal)
    protocol_plans = _protocol_baselines(topo, coll, min_bytes, max_bytes, nominal)
    for knobs, plan in (*baseline_plans, *((None, p) for p in protocol_plans)):
        if allowed(plan) and not plan.flat:  # a flat ring is judged only if the others leave it a chance
            search.prefetch(plan, middle, knobs)
    base_evals: list[Evaluation | None] = []
    for knobs, plan in baseline_plans:
        if allowed(plan) and not hopeless(plan, (ev.score for ev in base_evals if ev is not None and selectable(ev.plan))):
            base_evals.append(search.judge(plan, middle, knobs))
    # the baselines under other protocols and NCCL's tree compete too, but take nothing from
    # the descent's budget
    before = charged()
    for plan in protocol_plans:
        if allowed(plan) and not hopeless(plan, (ev.score for ev in base_evals if ev is not None and selectable(ev.plan))):
            base_evals.append(search.judge(plan, middle))
    start += charged() - before
    # when no plan that fits can divide the window's smallest size (odd sizes, or a rank count
    # that is not a power of two), divisibility cannot steer the choice
    strict = any(ev is not None and selectable(ev.plan) for ev in base_evals)
    evals: list[Evaluation] = [ev for ev in base_evals if ev is not None and (selectable(ev.plan) or not strict)]
    if not baselines:
        evals = []
    tried: set[Knobs] = set()

    max_chunks = chunk_limit(topo, nominal)

    built: dict[Knobs, tuple[list[Knobs], Plan]] = {}
    foreseen: set[Knobs] = set()

    def normal(knobs: Knobs) -> Knobs | None:
        """The knobs as they run, or None when they were tried or are out of range."""
        if forced:
            knobs = replace(knobs, **forced)  # type: ignore[arg-type]
        if knobs.oneshot and allreduce:
            knobs = replace(knobs, bidir=False)  # one-shot plans run their ring stages both ways anyway
        if knobs in tried or knobs.chunks < 1 or (knobs.chunks > max_chunks and not forced):
            return None
        return knobs

    def build(knobs: Knobs) -> tuple[list[Knobs], Plan]:
        """The plan of the knobs made as fine as the cap asks, after the knobs on the way there."""
        if knobs not in built:
            path = [knobs]
            plan = build_plan(topo, coll, min_bytes, max_bytes, knobs, nominal)
            while not allowed(plan) and path[-1].granularity > 1:
                path.append(replace(path[-1], granularity=path[-1].granularity // 2))
                plan = build_plan(topo, coll, min_bytes, max_bytes, path[-1], nominal)
            built[knobs] = (path, plan)
        return built[knobs]

    def promising(plan: Plan) -> bool:
        return not ((strict and not selectable(plan)) or not allowed(plan))

    def attempt(knobs: Knobs) -> Evaluation | None:
        nonlocal skipped
        normalised = normal(knobs)
        if normalised is None:
            return None
        path, plan = build(normalised)
        tried.update(path)
        if not promising(plan):
            return None
        if hopeless(plan, (e.score for e in evals)):
            if not reach.free_misses:
                skipped += 1
            return None
        ev = search.judge(plan, middle, path[-1])
        if ev is not None:
            evals.append(ev)
        return ev

    def ahead(items: Iterable[Knobs]) -> Iterator[Knobs]:
        """The items, while the workers (if any) simulate what the next few would ask for."""
        items = list(items)
        depth = 2 * search.workers.jobs if search.workers is not None else 0
        for i, knobs in enumerate(items):
            for following in items[i + 1:i + 1 + depth]:
                normalised = normal(following)
                if normalised is not None and normalised not in foreseen:
                    foreseen.add(normalised)
                    path, plan = build(normalised)
                    if promising(plan) and not hopeless(plan, (e.score for e in evals)):
                        search.prefetch(plan, middle, path[-1])
            yield knobs

    large = nominal >= LARGE_WINDOW  # windows whose programs can be made size-independent
    coarse = coarse_sweep(max_chunks, allreduce, large)
    for knobs in ahead((*seeds, *coarse)):
        attempt(knobs)
    # the other protocols, trees and shapes the descent seldom reaches are swept on top,
    # taking nothing from the descent's budget
    extra = extra_sweep(topo, nominal, max_chunks, allreduce, large)
    before, skipped_before, first_extra = charged(), skipped, len(evals)
    for knobs in ahead(extra):
        attempt(knobs)
    # both-way ring lane pipelines too, apart: they seed a descent of their own, not the extras'
    first_ring = len(evals)
    for knobs in ahead(both_way_sweep(topo, nominal, max_chunks)):
        attempt(knobs)
    start += charged() - before
    skipped = skipped_before
    extras = {id(e) for e in evals[first_extra:first_ring]}
    both_ways = {id(e) for e in evals[first_ring:]}
    on_top = extras | both_ways
    ring_dims = rings(topo)
    if ring_dims:  # the best few of the sweep also with both-way rings (or without, for seeds)
        best_swept = sorted((e for e in evals if e.knobs is not None and id(e) not in on_top), key=lambda e: e.score)
        toggled = [replace(e.knobs, bidir=not e.knobs.bidir) for e in best_swept[:BIDIR_TRIALS]]  # type: ignore[union-attr]
        for knobs in ahead(toggled):
            attempt(knobs)
    def exact(ev: Evaluation) -> bool:
        return ev.knobs is None or search.exact(ev.plan)

    # the descent starts from the sweep's best three, from the best two swept on top and the
    # best both-way ring lane pipeline too when they beat them
    # (exact() lowers the probe ranks: it is asked of the few that could be picked only)
    by_score = sorted((e for e in evals if e.knobs is not None), key=lambda e: e.score)
    if reach.pooled:
        by_score = list(_distinct(by_score))
    seeds_ranked = list(islice((e for e in by_score if id(e) not in on_top and exact(e)), SEEDS))

    def best_of(group: set[int], count: int) -> list[Evaluation]:
        return list(islice((e for e in by_score if id(e) in group
                            and (len(seeds_ranked) < SEEDS or e.score < seeds_ranked[-1].score) and exact(e)), count))

    best_extras = best_of(extras, EXTRA_SEEDS) + best_of(both_ways, 1)
    regular = len(seeds_ranked)
    if reach.pooled:
        # where the sweep's candidates lost to the baselines' floors, the next best make up its seeds
        chosen = {id(e) for e in (*seeds_ranked, *best_extras)}
        seeds_ranked += islice((e for e in by_score if id(e) not in chosen and exact(e)), SEEDS - len(seeds_ranked))
        seeds_ranked = sorted([*seeds_ranked, *best_extras], key=lambda e: e.score)
    else:
        seeds_ranked += best_extras

    def spent() -> int:
        return charged() - start + skipped

    # pooled: the descents share what the sweep left of the budget and a share of their own
    # for each seed swept on top (their sweeps took nothing from it), the best seed first, so
    # that where the sweep's seeds lose to the others', the budget follows the better ones
    stop = spent() + max(budget - spent(), 0) + len(best_extras) * (budget // SEEDS) if reach.pooled else budget

    visited: list[Knobs] = []  # every place a descent stood

    def steps(knobs: Knobs, paired: bool) -> list[Knobs]:
        return [*(_paired_neighbours(knobs, reach.tilt_pairs) if paired else ()),
                *_knob_neighbours(knobs, allreduce, ring_dims, protocol_choices(topo), has_large_switch(topo),
                                  reach.fan_chunks)]

    def descend(best: Evaluation, until: int, paired: bool = False) -> None:
        """First-improvement coordinate descent from `best` until `until` evaluations are spent."""
        improved = True
        while improved and spent() < until:
            improved = False
            assert best.knobs is not None
            visited.append(best.knobs)
            for knobs in ahead(steps(best.knobs, paired)):
                ev = attempt(knobs)
                # rank 0's time steers the descent; only the seeds and finalists must be exact
                # (the check generates the probe ranks' operations, about one more lowering)
                if ev is not None and ev.score < best.score * (1 - 1e-6):
                    best, improved = ev, True
                    break

    def descend_each(starts: Sequence[Evaluation], until: int, paired: bool = False) -> None:
        """Descend from each start in turn, each on an even share of what is left until `until`."""
        for i, e in enumerate(starts):
            descend(e, spent() + (until - spent()) // (len(starts) - i), paired)

    if reach.pooled:
        descend_each(seeds_ranked, stop)
    else:  # the sweep's seeds share what the sweep left; the others' each get a share of their own
        for i, seed in enumerate(seeds_ranked):
            descend(seed, spent() + ((budget - spent()) // (regular - i) if i < regular else budget // SEEDS))
    # then the best so far, also with paired steps, on what the descents left of the budget
    if seeds_ranked:
        descend(min((e for e in evals if e.knobs is not None), key=lambda e: e.score), stop, paired=True)
    # where latency counts, the best mixed pipeline's every tilt in reach: moving one unit
    # between orders changes which messages meet on a link, so the time is rugged in the tilt
    # and steps of one and three stop short (zoo15 1 MiB: t+0 -> t+11, 2 % faster)
    top_now = min((e for e in evals if e.knobs is not None), key=lambda e: e.score, default=None)
    if reach.tilt_reach and nominal < BANDWIDTH_WINDOW and top_now is not None and top_now.knobs.mix:  # type: ignore[union-attr]
        line = [replace(top_now.knobs, tilt=t) for t in range(-reach.tilt_reach, reach.tilt_reach + 1)]  # type: ignore[arg-type]
        for knobs in ahead(line):
            attempt(knobs)
        tilted = min((e for e in evals if e.knobs is not None), key=lambda e: e.score)
        if tilted is not top_now:
            descend(tilted, spent() + budget // SEEDS, paired=True)
    # a window of one size spends the rest of its larger budget descending further from its
    # best few distinct plans: the passes above are one budget's, so this only adds candidates
    if reach.budget_scale > 1:
        ranked_now = list(islice(_distinct(sorted((e for e in evals if e.knobs is not None), key=lambda e: e.score)),
                                 SEEDS))
        descend_each(ranked_now, spent() + budget * (reach.budget_scale - 1), paired=True)
    if reach.far_share and nominal < BANDWIDTH_WINDOW:
        near = {None, *(k for place in visited for k in (place, *steps(place, paired=True)))}  # None: baselines
        far = list(islice(_distinct(sorted((e for e in evals if e.knobs not in near), key=lambda e: e.score)), SEEDS))
        descend_each(far, spent() + int(budget * reach.far_share), paired=True)
    if not evals:
        if cap is not None:
            raise PlanError(f"no plan for {topo.label} that fits the runtime's limits needs element counts in multiples "
                            f"of at most {cap} (--max-bucket-nchunksperloop)")
        if search.max_nchunksperloop is not None:
            raise PlanError(f"no plan for {topo.label} has at most {search.max_nchunksperloop} chunks per loop "
                            f"(--max-nchunksperloop); the coarsest needs {topo.nranks}")
        raise PlanError(f"no plan for {topo.label} fits the runtime's limits")
    # the best few also finer: fewer units per chunk, or fewer chunks, for the granularity preference
    ranged = min_bytes < max_bytes  # a window of one size needs only that size to divide
    best_few = [e.knobs for e in sorted((e for e in evals if e.knobs is not None), key=lambda e: e.score)]
    finer_knobs = [finer for k in best_few[:FINER_TRIALS if ranged else 0]
                   for finer in (replace(k, granularity=max(1, k.granularity // 2)), replace(k, granularity=1),
                                 replace(k, chunks=max(1, k.chunks // 2)),
                                 replace(k, chunks=max(1, k.chunks // 2), granularity=1))]
    for knobs in ahead(finer_knobs):
        attempt(knobs)
    sizes = judged_sizes(min_bytes, max_bytes)
    ordered = sorted(evals, key=lambda e: e.score)
    distinct = list(_distinct(ordered))
    top = list(islice((e for e in distinct if exact(e)), 5))
    finer = _finer(distinct, top, exact) if ranged else []
    contenders = [*top, *finer]
    if screened:  # ranked at another size, the baselines still bound the pick at the window's own
        chosen = {id(e) for e in contenders}
        contenders += [e for e in evals if e.knobs is None and id(e) not in chosen]
    reuse = None
    if neighbour is not None and not forced:
        # keep the neighbour's plan (its schedule and chunk sizes too) when it is nearly as
        # good and no coarser: the windows then share a program if it does not depend on the window
        plan = neighbour.plan.with_window(min_bytes, max_bytes)
        reuse = plan if (not strict or selectable(plan)) and allowed(plan) and search.exact(plan) else None
    for e in contenders:
        search.prefetch(e.plan, sizes, e.knobs)
    if reuse is not None:
        search.prefetch(reuse, sizes, neighbour.knobs)  # type: ignore[union-attr]
    finalists = [search.judge(e.plan, sizes, e.knobs) for e in contenders]
    ranked = sorted((f for f in finalists if f is not None), key=lambda e: (e.score, e.knobs is not None))
    ranked = _granular(ranked, GRANULARITY_TOLERANCE if ranged else TIE)
    best = ranked[0]
    if reuse is not None:
        previous = search.judge(reuse, sizes, neighbour.knobs)  # type: ignore[union-attr]
        if (previous is not None and previous.score <= best.score * (1 + REUSE_TOLERANCE)
                and previous.plan.nchunksperloop <= best.plan.nchunksperloop):
            ranked.insert(0, previous)
            best = previous
    return Choice(min_bytes, max_bytes, best.plan, best.knobs, sizes, best.times_us, charged() - start,
                  tuple(e.plan for e in ranked[1:]))


def _distinct(evals: Iterable[Evaluation]) -> Iterator[Evaluation]:
    """The evaluations of distinct plans, first of each: knobs that build one plan up to lane
    numbers (spreads or all-gather lanes under `fan`, a mix of one order) would fill the
    finalists with one program."""
    seen: set[Plan] = set()
    for e in evals:
        shape = plan_shape(e.plan)
        if shape not in seen:
            seen.add(shape)
            yield e


def _finer(ordered: Sequence[Evaluation], top: Sequence[Evaluation],
           exact: Callable[[Evaluation], bool]) -> list[Evaluation]:
    """For each nchunksperloop below the best finalist's, the best exact candidate with it
    (`ordered`: distinct plans in score order, so no finalist is judged twice), when it is
    close enough at the window's middle to be within GRANULARITY_TOLERANCE overall."""
    if not top:
        return []
    best: dict[int, Evaluation] = {}
    for e in ordered:
        if e.score > top[0].score * (1 + 2 * GRANULARITY_TOLERANCE):
            break
        n = e.plan.nchunksperloop
        if n < top[0].plan.nchunksperloop and n not in best and e not in top and exact(e):
            best[n] = e
    return [e for _n, e in sorted(best.items())]


def _granular(ranked: list[Evaluation], tolerance: float = GRANULARITY_TOLERANCE) -> list[Evaluation]:
    """`ranked` with its finest plan within `tolerance` of the best moved first."""
    if not ranked:
        return ranked
    close = [e for e in ranked if e.score <= ranked[0].score * (1 + tolerance)]
    pick = min(close, key=lambda e: e.plan.nchunksperloop)  # min keeps the best score among equals
    return [pick, *(e for e in ranked if e is not pick)]


def _next_size(search: Search, previous: Choice, lo: int, hi: int, cap: int | None = None) -> Choice | None:
    """A window of the one size just past its neighbour's largest (such as 4GiB after
    1GiB..<4GiB) takes the neighbour's plan: that plan was judged one byte away. None when
    the plan does not fit or divide the size, or the window is wider."""
    if not lo == hi == previous.max_bytes + 1:
        return None
    plan = previous.plan.with_window(lo, hi)
    if not search.divides(plan, lo) or not search.allowed(plan, cap) or not search.exact(plan):
        return None
    ev = search.judge(plan, (lo,), previous.knobs)
    if ev is None:
        return None
    return Choice(lo, hi, plan, previous.knobs, (lo,), ev.times_us, 0, previous.alternatives)


def optimize(topology: Topology, collective: str, windows: Sequence[tuple[int, int]], limits=None,
             progress=None, dtype_bytes: int = 4, max_nchunksperloop: int | None = None,
             caps: Sequence[int | None] | None = None, jobs: int = 1) -> list[Choice]:
    """One Choice per window; each window starts from its neighbours' best knobs. With
    `max_nchunksperloop`, no program needs element counts in larger multiples; `caps` bounds
    those multiples window by window. `jobs` worker processes simulate ahead of the search
    (the same choices, sooner)."""
    search = Search(topology, collective, limits, dtype_bytes, max_nchunksperloop, jobs)
    # a directory's windows all keep the narrower reach, its last one of one size (4GiB..4GiB)
    # too: that is how its programs were measured against the base commit's, window by window
    # (benchmarks/compile_ratio.py)
    reach = None if len(windows) == 1 else RANGED
    out: list[Choice] = []
    with closing(search), settling() as settle:
        for (lo, hi), cap in zip(windows, caps or [None] * len(windows)):
            seeds = [c.knobs for c in out[-2:] if c.knobs is not None]
            edge = _next_size(search, out[-1], lo, hi, cap) if out else None
            out.append(edge or optimize_window(search, lo, hi, seeds, neighbour=out[-1] if out else None, cap=cap,
                                               reach=reach))
            search.drop_pending()
            settle()  # the programs cached so far stay: later collections need not walk them
            if progress is not None:
                progress(out[-1])
    return out
