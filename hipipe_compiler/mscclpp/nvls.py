"""All-reduce inside one NVSwitch domain as an MSCCL++ plan that reduces in the switch
(cost-model.md section 5, mscclpp.md 3-4).

Every rank owns 1/n of the message, cut into one chunk per threadblock. Each threadblock
tells every peer that its kernel has started (a signal per peer, then the waits), runs one
`glres` on its chunk: the switch sums the chunk over every rank's input and stores the sum
into every rank's output; then it tells every peer that its stores are done, and waits for
theirs before the kernel may end. Out of place the switch reads the inputs and writes the
outputs through two switch channels; in place, one channel on the input serves both.

>>> from hipipe_compiler.presets import preset
>>> plan = nvls_allreduce_plan(preset("dgx-h100-8x1"), "demo", inplace=False, threadblocks=2)
>>> [op.name for op in plan.gpus[0].threadblocks[0].ops]
['signal', 'wait', 'nop', 'glres', 'nop', 'signal', 'wait']
"""

from __future__ import annotations

from ..errors import PlanError
from ..topology import Topology
from .plan import (MAX_CHANNELS, MAX_CHANNELS_PER_OP, MAX_MESSAGE_SIZE, Channel, ExecutionPlan, GpuPlan, Op, Operand,
                   TbChannels, Threadblock, bounded)


def switch_domain(topology: Topology) -> int | None:
    """The dimension whose switch reduces over every rank (the topology has no other), or None."""
    for d in topology.nvls_dimensions:
        if topology.dimensions[d].size == topology.nranks:
            return d
    return None


def nvls_allreduce_plan(topology: Topology, name: str, inplace: bool, threadblocks: int,
                        min_message_size: int = 0, max_message_size: int = MAX_MESSAGE_SIZE) -> ExecutionPlan:
    """The plan for every rank; PlanError where the topology is not one NVLS domain or the
    executor's channel limits do not fit it."""
    domain = switch_domain(topology)
    if domain is None:
        raise PlanError("in-switch plans need one switch dimension with nvls that spans every rank")
    n = topology.nranks
    if n - 1 > MAX_CHANNELS:
        raise PlanError(f"{n} ranks need {n - 1} memory channels per threadblock; the executor holds {MAX_CHANNELS}")
    if threadblocks < 1:
        raise PlanError("expected at least one threadblock")
    ranks = tuple(range(n))
    buffers = ("i",) if inplace else ("i", "o")
    switch = tuple(Channel("switch", buffer_type=b, rank_groups=(ranks,)) for b in buffers)
    gpus = []
    for r in ranks:
        # in the order of their shift from r: every rank runs rank 0's plan shifted (sim/plans.py)
        peers = tuple(topology.shift(r, domain, delta) for delta in range(1, n))
        tbs = []
        for t in range(threadblocks):
            chunk = r * threadblocks + t
            handshake = _handshake(len(peers))
            glres = Op("glres", "switch", src=(Operand(None, chunk, 1, switch_channel_id=0),),
                       dst=(Operand(None, chunk, 1, switch_channel_id=len(buffers) - 1),))
            ops = (*handshake, Op("nop"), glres, Op("nop"), *handshake)
            first = t * len(peers)
            tbs.append(Threadblock(t, ops, (TbChannels("memory", tuple(range(first, first + len(peers)))),
                                            TbChannels("switch", tuple(range(len(buffers)))))))
        channels = tuple(Channel("memory", connected_to=peers) for _ in range(threadblocks)) + switch
        gpus.append(GpuPlan(r, n * threadblocks, n * threadblocks, 0, tuple(tbs), channels))
    return bounded(ExecutionPlan(name, "allreduce", "Simple", inplace, tuple(gpus), min_message_size=min_message_size,
                                 max_message_size=max_message_size))


def _handshake(peers: int) -> list[Op]:
    """A release signal to every peer, then a wait on each: at most eight channels per op."""
    groups = [tuple(range(k, min(k + MAX_CHANNELS_PER_OP, peers))) for k in range(0, peers, MAX_CHANNELS_PER_OP)]
    return [Op("signal", "memory", g) for g in groups] + [Op("wait", "memory", g) for g in groups]
