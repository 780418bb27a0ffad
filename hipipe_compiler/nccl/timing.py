"""NCCL as it really runs, timed by our simulator: its algorithms set up as NCCL sets them up
on the machine a topology describes (channels, fewer for small calls; its chunking and
in-flight steps), each call paying the topology's per-call cost of the protocol (and the
in-switch reduction's own per-call cost for NVLS and NVLSTree).

NCCL's kernels move data through a fixed number of channels, each an SM with a throughput of
its own; NCCL's tuning tables state it (per-channel bandwidths, caps for LL, LL128, trees and
NVLSTree, tuned on real systems). The simulation charges it as one more resource per GPU,
shared by every message the GPU sends, so NCCL's algorithm never outruns its own model's
bandwidth as well as the links. (Programs we compile are not charged it; docs/nccl.md says
why this is the honest comparison.)

>>> from hipipe_compiler.topology import Dimension, Topology
>>> topo = Topology((Dimension(8, "switch", 370.8, link="nvlink", nvls={"efficiency": 0.85}),), gpu="H100",
...                 call_latency={"LL": 6.6, "LL128": 14, "Simple": 8.4})
>>> timer = NcclTimer(topo, "allreduce")
>>> run = timer.pick(1 << 30)
>>> run.algorithm, run.protocol, run.channels, 440 < run.busbw_GBps < 480
('nvls', 'Simple', 16, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..bounds import bus_factor
from ..errors import PlanError
from ..hardware import WIRE_EFFICIENCY
from ..lower import lower
from ..msccl.program import SENDING_TYPES, Program
from ..msccl.runtime import Limits
from ..schedule.baselines import nccl_plan
from ..schedule.trees import nccl_tree_fits
from ..sim.dag import Task, run_dag
from ..sim.simulate import Replay, SimulationError, simulate
from ..topology import Topology
from .nvls import loop_count, nvls_tasks, nvlstree_tasks
from .setup import PIPELINING, channels_for
from .tuning import ALGORITHMS, Model, System

#: Lowering limits for NCCL's own algorithms: they are timed, never written, so only the
#: structure matters (NCCL runs up to 64 channels).
NCCL_LIMITS = Limits(max_threadblocks=4096, max_channels=128, max_steps=4096)
#: Loops of a channel of NVLS or NVLSTree after which its pipeline is timed by extension.
STEADY_LOOPS = 64


@dataclass(frozen=True)
class NcclRun:
    """One call as NCCL runs it: the algorithm and protocol, the channels carrying it, the
    simulated time, and NCCL's own prediction of it."""

    collective: str
    nbytes: int
    nranks: int
    algorithm: str
    protocol: str
    channels: int
    time_us: float
    model_us: float | None

    @property
    def label(self) -> str:
        return f"{self.algorithm}/{self.protocol}"

    @property
    def busbw_GBps(self) -> float:
        return self.nbytes / (self.time_us * 1e3) * bus_factor(self.collective, self.nranks)


def nccl_machine(topology: Topology) -> str | None:
    """Why NCCL's pick would be a guess on `topology` (None: it is not): NCCL decides from the
    GPU it finds, so a topology that names none is no machine NCCL runs on, and its rings and
    trees run over switches, not the rings of a torus."""
    if topology.gpu is None:
        return "the topology names no gpu, which NCCL's own choices depend on"
    if any(d.kind != "switch" for d in topology.dimensions):
        return "NCCL runs on switched networks, not the rings of a torus"
    return None


class NcclTimer:
    """Times NCCL's algorithms for one topology and collective; keeps its programs."""

    def __init__(self, topology: Topology, collective: str, programs: dict | None = None) -> None:
        self.topology = topology
        self.collective = collective
        self.system = System.of(topology)
        self.model = Model.of(self.system, collective)
        # lowered programs depend on the shape alone: a caller timing many variants of one
        # machine (a calibration) shares them
        self.programs: dict = {} if programs is None else programs

    def available(self) -> tuple[str, ...]:
        """The algorithms NCCL would consider here that this topology can carry (its tree
        needs switches between nodes; NVLS an in-switch reduction inside them)."""
        out = []
        for a in ALGORITHMS:
            if not any(self.model.algbw_GBps[a][p] > 0 for p in self.model.algbw_GBps[a]):
                continue
            if a == "tree" and not nccl_tree_fits(self.topology):
                continue
            if a == "nvlstree" and not _switched(self.topology):
                continue
            out.append(a)
        return tuple(out)

    def pick(self, nbytes: int, algorithms: Sequence[str] | None = None, protocols: Sequence[str] | None = None
             ) -> NcclRun:
        """What NCCL's own model picks at this size (NCCL_ALGO / NCCL_PROTO restricted to
        `algorithms` / `protocols` where given), timed by the simulator."""
        allowed = [a for a in self.available() if algorithms is None or a in algorithms]
        model = Model.of(self.system, self.collective, allowed, protocols)
        algorithm, protocol = model.pick(nbytes)
        return self.run(nbytes, algorithm, protocol)

    def run(self, nbytes: int, algorithm: str, protocol: str) -> NcclRun:
        """One call of `algorithm` under `protocol`, set up and timed as NCCL runs it."""
        topo, coll = self.topology, self.collective
        bw = self.model.algbw_GBps[algorithm][protocol]
        scale = topo.nccl_channel_scale or 1.0  # the machine's channels against NCCL's tables
        if bw <= 0:
            raise PlanError(f"NCCL does not run {algorithm}/{protocol} for {coll} on {topo.label}")
        channels = channels_for(self.system, self.model.graphs, algorithm, protocol, coll, nbytes)
        start = topo.call_cost(protocol)
        if algorithm in ("nvls", "nvlstree"):
            start += topo.dimensions[0].nvls.call_latency  # type: ignore[union-attr]
            time = self.nvls_time(algorithm, nbytes, start, bw * scale)
        else:
            program = self.program(algorithm, protocol, channels)
            pipe = PIPELINING[(algorithm, protocol)]
            issued = _sent(program) * nbytes / program.nchunksperloop / WIRE_EFFICIENCY[protocol]
            # NCCL's ring under Simple runs at its links' pace (its model's bandwidth is the
            # links'); its other protocols and its tree are capped by their channels
            engine = None if (algorithm, protocol) == ("ring", "Simple") else _engine(issued, nbytes, bw * scale)
            replay = Replay(pipe.chunk_bytes, pipe.window, engine, eager=True)
            try:
                time = simulate(program, topo, nbytes, replay=replay).time_us
            except SimulationError as exc:
                raise PlanError(f"NCCL's {algorithm} cannot run on {topo.label}: {exc}") from None
        return NcclRun(coll, nbytes, topo.nranks, algorithm, protocol, channels, time,
                       self.model.time_us(algorithm, protocol, nbytes))

    def program(self, algorithm: str, protocol: str, channels: int) -> Program:
        """NCCL's ring (a ring through every rank per channel) or tree (per channel a chain in
        each node and one tree of a double binary tree across nodes) on `channels` channels."""
        key = (self.topology.shape, tuple(d.kind for d in self.topology.dimensions), self.collective, algorithm,
               protocol, channels)
        if key not in self.programs:
            topo = self.topology
            plan = nccl_plan(topo, algorithm, self.collective, protocol, channels=channels)
            try:
                self.programs[key] = lower(plan, NCCL_LIMITS)
            except PlanError:  # a limit of our lowering (MSCCL's XML reader), not one NCCL has: say so
                raise PlanError(f"NCCL's {algorithm} on {channels} channel(s) of {topo.label} is too large for "
                                f"hipipe to simulate (over {NCCL_LIMITS.max_nodes} operations per rank)") from None
        return self.programs[key]

    def nvls_tasks(self, algorithm: str, nbytes: int, keep: int | None = None) -> list[Task]:
        if self.collective != "allreduce":
            raise PlanError(f"NCCL's {algorithm} for {self.collective} is not modelled; its ring is")
        build = nvls_tasks if algorithm == "nvls" else nvlstree_tasks
        return build(self.topology, nbytes, keep)

    def nvls_time(self, algorithm: str, nbytes: int, start: float, algbw: float) -> float:
        """The simulated time of NCCL's NVLS or NVLSTree. A channel's loops are alike but
        for its last: beyond STEADY_LOOPS of them the pipeline is in its steady state, so two
        shorter runs (the first k loops and the last) time it, extended by the loops between."""
        loops = loop_count(self.topology, algorithm, nbytes)

        def timed(keep: int | None) -> float:
            tasks = self.nvls_tasks(algorithm, nbytes, keep)
            # the in-switch part runs at the links' pace (NCCL's NVLS model is the links');
            # NVLSTree's channels cap the tree across nodes (perChMaxNVLSTree)
            engine = _engine(_issued(tasks) * loops / min(loops, (keep or loops) + 1), nbytes, algbw) \
                if algorithm == "nvlstree" else None
            return run_dag(tasks, self.topology, start, engine).time_us if tasks else start
        if loops <= 2 * STEADY_LOOPS + 1:
            return timed(None)
        short, long = timed(STEADY_LOOPS), timed(2 * STEADY_LOOPS)
        return long + (loops - 1 - 2 * STEADY_LOOPS) * (long - short) / STEADY_LOOPS


def _switched(topology: Topology) -> bool:
    """Whether every pair of nodes is linked (the dimensions outside the node are switches)."""
    return all(d.kind == "switch" for d in topology.dimensions[1:])


def _sent(program: Program) -> int:
    """The chunks the busiest rank sends in one replay of the program."""
    return max((sum(st.cnt for tb in g.threadblocks for st in tb.steps if st.type in SENDING_TYPES)
                for g in program.gpus), default=0)


def _issued(tasks: Sequence[Task]) -> float:
    """The bytes the busiest rank's point-to-point messages carry."""
    per_rank: dict[int, float] = {}
    for t in tasks:
        if t.kind == "send":
            per_rank[t.rank] = per_rank.get(t.rank, 0.0) + t.nbytes / WIRE_EFFICIENCY[t.protocol]
    return max(per_rank.values(), default=0.0)


def _engine(issued_bytes: float, nbytes: int, algbw_GBps: float) -> float | None:
    """The GB/s a GPU's channels move its messages at, so that moving what the busiest GPU
    issues takes as long as NCCL's model says moving the call does: nbytes / algbw."""
    if issued_bytes <= 0 or nbytes <= 0:
        return None
    return issued_bytes * algbw_GBps / nbytes
