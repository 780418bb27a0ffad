"""Deliberate breakages of a verified execution plan, each with the rules that must catch it."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from hipipe_compiler.mscclpp.plan import ExecutionPlan, Op, Operand, largest_message_size

Mutation = Callable[[ExecutionPlan], ExecutionPlan | None]


def _edit_ops(plan: ExecutionPlan, edit: Callable[[int, int, list[Op]], bool]) -> ExecutionPlan | None:
    """Apply `edit(rank, tb, ops)` (in place on a list) to the first threadblock it accepts."""
    for g in plan.gpus:
        for tb in g.threadblocks:
            ops = list(tb.ops)
            if edit(g.id, tb.id, ops):
                tbs = tuple(replace(t, ops=tuple(ops)) if t.id == tb.id else t for t in g.threadblocks)
                gpus = tuple(replace(x, threadblocks=tbs) if x.id == g.id else x for x in plan.gpus)
                return replace(plan, gpus=gpus)
    return None


def _drop_first(pattern: Callable[[list[Op], int], bool]) -> Mutation:
    def mutate(plan: ExecutionPlan) -> ExecutionPlan | None:
        def edit(_r: int, _t: int, ops: list[Op]) -> bool:
            for i in range(len(ops)):
                if pattern(ops, i):
                    del ops[i]
                    return True
            return False
        return _edit_ops(plan, edit)
    return mutate


def _data(op: Op) -> bool:
    return bool(op.src or op.dst)


def _shift_remote(plan: ExecutionPlan) -> ExecutionPlan | None:
    def edit(_r: int, _t: int, ops: list[Op]) -> bool:
        for i, op in enumerate(ops):
            if op.remote_writes and not op.packet:
                dst = tuple(replace(o, index=o.index + 1) if o.buffer_id is not None else o for o in op.dst)
                ops[i] = replace(op, dst=dst)
                return True
        return False
    return _edit_ops(plan, edit)


def _first_op(wanted: Callable[[Op], bool], change: Callable[[ExecutionPlan, int, Op], Op]) -> Mutation:
    """Change the first operation `wanted` accepts, in the first threadblock that has one."""
    def mutate(plan: ExecutionPlan) -> ExecutionPlan | None:
        def edit(rank: int, _t: int, ops: list[Op]) -> bool:
            for i, op in enumerate(ops):
                if wanted(op):
                    ops[i] = change(plan, rank, op)
                    return True
            return False
        return _edit_ops(plan, edit)
    return mutate


def _other_chunk(o: Operand) -> Operand:
    return replace(o, index=o.index + o.size if o.index == 0 else o.index - o.size)


_wrong_reduce_operand = _first_op(
    lambda op: op.name in ("re", "res", "repkt", "respkt") and op.src[0].buffer in ("i", "o"),
    lambda _plan, _rank, op: replace(op, src=(_other_chunk(op.src[0]), *op.src[1:])))
_out_of_bounds = _first_op(
    lambda op: op.name == "copy",
    lambda plan, rank, op: replace(op, dst=(replace(op.dst[0], index=plan.gpus[rank].output_chunks
                                                    + plan.gpus[rank].scratch_chunks * 4),)))
_port_from_input = _first_op(
    lambda op: op.name in ("pws", "pwsf"),
    lambda _plan, _rank, op: replace(op, src=(Operand("i", 0, op.src[0].size),)))
_many_operands = _first_op(
    lambda op: op.name == "re", lambda _plan, _rank, op: replace(op, src=op.src + (op.src[-1],) * 10))


def _too_many_ops(plan: ExecutionPlan) -> ExecutionPlan | None:
    def edit(_r: int, _t: int, ops: list[Op]) -> bool:
        ops[:0] = [Op("nop")] * (65 - len(ops))
        return True
    return _edit_ops(plan, edit)


def _packet_twice(plan: ExecutionPlan) -> ExecutionPlan | None:
    def edit(_r: int, _t: int, ops: list[Op]) -> bool:
        for i, op in enumerate(ops):
            if op.name == "ppkt" and op.src[0].index:  # the same slot again, from the chunk before
                moved = replace(op, src=(replace(op.src[0], index=0),))
                ops.insert(i + 1, moved)
                return True
        return False
    return _edit_ops(plan, edit)


def _unpaired_channel(plan: ExecutionPlan) -> ExecutionPlan | None:
    g = plan.gpus[0]
    channels = list(g.channels)
    if not channels:
        return None
    first = channels[0]
    channels[0] = replace(first, connected_to=first.connected_to + (first.connected_to[0],))
    return replace(plan, gpus=(replace(g, channels=tuple(channels)), *plan.gpus[1:]))


def _single_scratch(plan: ExecutionPlan) -> ExecutionPlan | None:
    """An LL plan without its double scratch buffer: with no closing handshake, a fast sender's
    next launch could write packets over ones not yet read."""
    return replace(plan, use_double_scratch_buffer=False) if plan.use_double_scratch_buffer else None


#: name -> (mutation, rules of which at least one must be reported)
def _past_offsets(plan: ExecutionPlan) -> ExecutionPlan:
    """A plan declared for one size more than its uint32 offsets allow."""
    step = plan.buffer_alignment * plan.gpus[0].input_chunks * (plan.ngpus if plan.collective == "allgather" else 1)
    return replace(plan, max_message_size=largest_message_size(plan) + step)


MUTATIONS: dict[str, tuple[Mutation, set[str]]] = {
    "nop before a signal dropped": (
        # a put's stores are published by the signal after the nop (a nop before a closing
        # signal that follows a read of the input only orders nothing that matters)
        _drop_first(lambda ops, i: ops[i].name == "nop" and i + 1 < len(ops) and ops[i + 1].name == "signal"
                    and i > 0 and ops[i - 1].name in ("put", "res")),
        {"unpublished-read", "nop-hazard"}),
    "nop after a wait dropped": (
        _drop_first(lambda ops, i: ops[i].name == "nop" and i > 0 and ops[i - 1].name == "wait"
                    and i + 1 < len(ops) and _data(ops[i + 1])),
        {"unpublished-read", "nop-hazard"}),
    "a publishing signal dropped": (
        _drop_first(lambda ops, i: ops[i].name == "signal" and i + 1 < len(ops) and ops[i + 1].name != "wait"),
        {"deadlock", "unpublished-read", "signal-balance"}),
    "closing wait dropped": (
        _drop_first(lambda ops, i: ops[i].name == "wait" and i == len(ops) - 1),
        {"signal-balance", "slot-reuse", "unfinished-write"}),
    "closing signal dropped": (
        _drop_first(lambda ops, i: ops[i].name == "signal" and i == len(ops) - 2 and ops[-1].name == "wait"),
        {"deadlock"}),
    "a wait dropped": (
        _drop_first(lambda ops, i: ops[i].name == "wait" and i < len(ops) - 1),
        {"unpublished-read", "signal-balance", "race", "nop-hazard"}),
    "a semaphore release dropped": (
        _drop_first(lambda ops, i: ops[i].name == "sem_release"), {"deadlock"}),
    "a semaphore acquire dropped": (
        _drop_first(lambda ops, i: ops[i].name == "sem_acquire"),
        {"unpublished-read", "race", "semaphore-balance", "nop-hazard", "slot-reuse"}),
    "a remote region shifted": (_shift_remote, {"semantics", "race", "unpublished-read", "operand-bounds", "slot-reuse"}),
    "a reduction reads the wrong chunk": (_wrong_reduce_operand, {"semantics"}),
    "an operand past its buffer": (_out_of_bounds, {"operand-bounds"}),
    "65 operations in a threadblock": (_too_many_ops, {"op-limit"}),
    "a port put from the input": (_port_from_input, {"port-source"}),
    "a packet slot written twice": (_packet_twice, {"packet-rewrite", "semantics"}),
    "eleven operands": (_many_operands, {"operand-limit"}),
    "a size past the uint32 offsets": (_past_offsets, {"offset-limit"}),
    "a channel without its pair": (_unpaired_channel, {"channel-pairing", "deadlock"}),
    "the double scratch buffer of an LL plan turned off": (_single_scratch, {"slot-reuse"}),
    "the packing before a port packet put dropped": (
        _drop_first(lambda ops, i: ops[i].name in ("cpkt", "recpkt") and any(
            o.name == "rppkt" and o.channel_type == "port" for o in ops[i + 1:])), {"deadlock"}),
}
