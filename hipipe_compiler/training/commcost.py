"""Collective costs for the training planner: what one reduce-scatter, all-gather or
all-reduce of a bucket costs on the job's network.

`SimulatedCost` is the one the planner uses: it compiles our own programs for the topology
(one per size window, as `hipipe compile` would) and times each call size with the simulator.
`AlphaBetaCost` is a closed-form model for tests and quick what-ifs.

>>> from hipipe_compiler.presets import preset
>>> cost = SimulatedCost(preset("dgx-h100-8x2"), algorithm="hierarchical")
>>> cost.call_bytes("allreduce", 1000) % 64, round(cost.time_us("allreduce", 1 << 20), 1) > 0
(0, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Protocol, Sequence

from ..compiler import CompiledWindow, CompileOptions, compile_range
from ..errors import InputError
from ..msccl.runtime import Limits
from ..sim.simulate import simulate_exact
from ..topology import Topology
from ..windows import Window, window_of

COLLECTIVES: tuple[str, ...] = ("allreduce", "reducescatter", "allgather")


class CommCostModel(Protocol):
    """Time of one collective call on the whole job, in microseconds.

    `nbytes` follows nccl-tests: the buffer for all-reduce, the whole input for
    reduce-scatter, the whole output for all-gather; a bucket of S bytes is passed as S to
    all three. `latency_us` is the part of a call's time that uses no bandwidth (startup);
    two calls on different lanes overlap those parts and share the rest of the network.
    """

    def time_us(self, collective: str, nbytes: int) -> float: ...

    def latency_us(self, collective: str) -> float: ...

    def call_bytes(self, collective: str, nbytes: int) -> int:
        """The size the call is actually made with: nbytes padded to what the programs accept."""
        ...


@dataclass(frozen=True)
class AlphaBetaCost:
    """time_us = alpha_us[c] + us_per_byte[c] * nbytes, per collective c (Hockney model).

    >>> cost = AlphaBetaCost.ring(4, 100.0, 2.0)
    >>> cost.time_us("reducescatter", 4_000_000), cost.time_us("allreduce", 4_000_000)
    (36.0, 72.0)
    """

    alpha_us: Mapping[str, float]
    us_per_byte: Mapping[str, float]

    def time_us(self, collective: str, nbytes: int) -> float:
        return self.alpha_us[collective] + self.us_per_byte[collective] * nbytes

    def latency_us(self, collective: str) -> float:
        return self.alpha_us[collective]

    def call_bytes(self, collective: str, nbytes: int) -> int:
        return nbytes

    @classmethod
    def hierarchical(cls, levels: Sequence[tuple[int, float, float]], launch_us: float = 0.0) -> AlphaBetaCost:
        """Rings per level (size, GB/s per rank, latency µs; innermost first), reduce-scatter
        innermost first on the whole buffer, each next level on 1/prod(inner sizes) of it."""
        alpha, beta, inner = 0.0, 0.0, 1
        for size, bandwidth_gbps, latency_us in levels:
            if size < 1 or bandwidth_gbps <= 0 or latency_us < 0:
                raise InputError(None, "levels", f"expected size >= 1, GB/s > 0, latency >= 0, got {(size, bandwidth_gbps, latency_us)}")
            alpha += (size - 1) * latency_us
            beta += (size - 1) / size / inner * 1e-3 / bandwidth_gbps  # 1 GB/s = 1e3 bytes per µs
            inner *= size
        half = {"reducescatter": alpha + launch_us, "allgather": alpha + launch_us}
        return cls(alpha_us={**half, "allreduce": 2 * alpha + launch_us},
                   us_per_byte={"reducescatter": beta, "allgather": beta, "allreduce": 2 * beta})

    @classmethod
    def ring(cls, world_size: int, bandwidth_gbps: float, latency_us: float, launch_us: float = 0.0) -> AlphaBetaCost:
        """One ring of `world_size` ranks: RS(S) = AG(S) = (P-1)a + (P-1)/P * S/B, AR = RS + AG."""
        return cls.hierarchical([(world_size, bandwidth_gbps, latency_us)], launch_us)


@dataclass(frozen=True)
class CostCache:
    """Memoises a cost model for the length of one planning call (the real one is slow)."""

    cost: CommCostModel
    memo: dict[tuple[str, int], tuple[float, float]]

    def phases_ms(self, collective: str, nbytes: int) -> tuple[float, float]:
        """(latency, bandwidth work) in ms, both >= 0 and summing to the call's time."""
        key = (collective, nbytes)
        if key not in self.memo:
            total = float(self.cost.time_us(collective, nbytes))
            latency = float(self.cost.latency_us(collective))
            if not (math.isfinite(total) and total >= 0 and math.isfinite(latency)):
                raise ValueError(f"cost model gave {total!r} µs for {collective} of {nbytes} bytes; expected a finite time >= 0")
            latency = min(max(latency, 0.0), total)
            self.memo[key] = (latency / 1000.0, (total - latency) / 1000.0)
        return self.memo[key]

    def time_ms(self, collective: str, nbytes: int) -> float:
        return sum(self.phases_ms(collective, nbytes))

    def time_us(self, collective: str, nbytes: int) -> float:
        return self.time_ms(collective, nbytes) * 1000.0

    def latency_us(self, collective: str) -> float:
        return float(self.cost.latency_us(collective))

    def call_bytes(self, collective: str, nbytes: int) -> int:
        return self.cost.call_bytes(collective, nbytes)


def cached(cost: CommCostModel | CostCache) -> CostCache:
    return cost if isinstance(cost, CostCache) else CostCache(cost, {})


#: The call size whose simulated time stands for a collective's start-up cost (no bandwidth).
LATENCY_PROBE_BYTES = 1


class SimulatedCost:
    """Collective times from the simulator, on the programs our compiler emits for `topology`.

    A call of S bytes falls into one of the compiler's size windows; that window's program is
    compiled once (`algorithm`, as `hipipe compile` would) and the call is timed by the
    simulator at S padded up to a size the runtime can select the program for (a multiple of
    nchunksperloop elements; see `call_bytes`). Every call is padded, so no window caps its
    element multiple for unpadded buckets (--max-bucket-nchunksperloop 0): each takes its
    fastest program. Programs and times are cached, so a planning
    run compiles each window once however many bucket sizes it tries. `progress` is called
    with (collective, window) before each compile.
    """

    def __init__(self, topology: Topology, algorithm: str = "hipipe", dtype_bytes: int = 4,
                 limits: Limits | None = None, progress: Callable[[str, Window], None] | None = None) -> None:
        self.topology = topology
        self.options = CompileOptions(algorithm=algorithm, dtype_bytes=dtype_bytes, limits=limits or Limits(), check=False,
                                      max_bucket_nchunksperloop=None)
        self.progress = progress
        self._programs: dict[tuple[str, Window], CompiledWindow] = {}
        self._times: dict[tuple[str, int], float] = {}

    @property
    def algorithm(self) -> str:
        return self.options.algorithm

    def compiled(self, collective: str, nbytes: int) -> CompiledWindow:
        """The (unverified) program of the size window holding nbytes."""
        if collective not in COLLECTIVES:
            raise InputError(None, "collective", f"expected one of {', '.join(COLLECTIVES)}, got {collective!r}")
        window = window_of(nbytes)
        key = (collective, window)
        if key not in self._programs:
            if self.progress is not None:
                self.progress(collective, window)
            options = replace(self.options, collective=collective)
            self._programs[key] = compile_range(self.topology, options, window.min_bytes, window.max_bytes, merge=False)[0]
        return self._programs[key]

    def call_bytes(self, collective: str, nbytes: int) -> int:
        """nbytes rounded up to a multiple of nchunksperloop elements of the program that
        serves the result (padding can carry a call into the next window, with its own
        program, so this repeats until it holds)."""
        size = max(int(nbytes), 1)
        while True:
            multiple = self.compiled(collective, size).program.nchunksperloop * self.options.dtype_bytes
            padded = -(-size // multiple) * multiple
            if padded == size:
                return size
            size = padded

    def time_us(self, collective: str, nbytes: int) -> float:
        """Simulated time of one call of nbytes (after padding) on the whole job."""
        size = self.call_bytes(collective, nbytes)
        key = (collective, size)
        if key not in self._times:
            self._times[key] = simulate_exact(self.compiled(collective, size).program, self.topology, size).time_us
        return self._times[key]

    def latency_us(self, collective: str) -> float:
        """The time of the smallest call the programs take: start-up cost, no bandwidth."""
        return self.time_us(collective, LATENCY_PROBE_BYTES)

    def programs(self) -> list[tuple[str, CompiledWindow]]:
        """Every program compiled so far, by collective and window."""
        return [(c, cw) for (c, _), cw in sorted(self._programs.items(), key=lambda kv: (COLLECTIVES.index(kv[0][0]), kv[0][1].min_bytes))]
