"""Execution plans as the executor's JSON (mscclpp.md section 2), written atomically.

>>> from hipipe_compiler.mscclpp.plan import ExecutionPlan
>>> plan_document(ExecutionPlan("p", "allreduce", "Simple", False, ()))["min_message_size"]
0
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..files import write_atomic
from .plan import ExecutionPlan, GpuPlan, Op, Operand, Threadblock


def operand_document(o: Operand) -> dict[str, Any]:
    if o.buffer is not None:
        where: dict[str, Any] = {"type": o.buffer}
    elif o.buffer_id is not None:
        where = {"buffer_id": o.buffer_id}
    else:
        where = {"switch_channel_id": o.switch_channel_id}
    return {**where, "index": o.index, "size": o.size}


def op_document(op: Op) -> dict[str, Any]:
    """One operation with only its own family's keys."""
    doc: dict[str, Any] = {"name": op.name}
    if op.name == "pipeline":
        doc["iter_context"] = {"unit_size": op.unit_size, "num_chunks": op.num_chunks}
        doc["ops"] = [op_document(o) for o in op.ops]
        return doc
    if op.name == "barrier":
        doc["barrier_id"] = op.barrier_id
        doc["num_threadblocks"] = op.num_threadblocks
        return doc
    if op.semaphore_ids:
        doc["semaphore_ids"] = list(op.semaphore_ids)
        return doc
    if op.channel_type != "none":
        doc["channel_type"] = op.channel_type
    if op.channel_ids:
        doc["channel_ids"] = list(op.channel_ids)
    if op.src:
        doc["src_buff"] = [operand_document(o) for o in op.src]
    if op.dst:
        doc["dst_buff"] = [operand_document(o) for o in op.dst]
    if op.tbg is not None:
        doc["tbg_info"] = {"tb_id": op.tbg[0], "tbg_size": op.tbg[1]}
    return doc


def threadblock_document(tb: Threadblock) -> dict[str, Any]:
    return {
        "id": tb.id,
        "ops": [op_document(op) for op in tb.ops],
        "channels": [{"channel_type": c.channel_type, "channel_ids": list(c.channel_ids)} for c in tb.channels],
        "remote_buffer_refs": [{"access_channel_type": b.access_channel_type, "remote_buffer_ids": list(b.remote_buffer_ids)}
                               for b in tb.remote_buffer_refs],
    }


def gpu_document(g: GpuPlan) -> dict[str, Any]:
    channels = []
    for c in g.channels:
        if c.channel_type == "switch":
            channels.append({"channel_type": "switch", "buffer_type": c.buffer_type,
                             "rank_groups": [{"size": len(r), "ranks": list(r)} for r in c.rank_groups]})
        else:
            channels.append({"channel_type": c.channel_type, "connected_to": list(c.connected_to)})
    return {
        "id": g.id, "input_chunks": g.input_chunks, "output_chunks": g.output_chunks, "scratch_chunks": g.scratch_chunks,
        "threadblocks": [threadblock_document(tb) for tb in g.threadblocks],
        "channels": channels,
        "remote_buffers": [{"rank": b.rank, "type": b.type, "access_channel_types": list(b.access_channel_types)}
                           for b in g.remote_buffers],
        "semaphores": [{"init_value": v} for v in g.semaphores],
    }


def plan_document(plan: ExecutionPlan) -> dict[str, Any]:
    return {
        "name": plan.name, "collective": plan.collective, "protocol": plan.protocol, "inplace": plan.inplace,
        "reuse_resources": plan.reuse_resources, "use_double_scratch_buffer": plan.use_double_scratch_buffer,
        "num_threads_per_block": plan.num_threads_per_block, "buffer_alignment": plan.buffer_alignment,
        "min_message_size": plan.min_message_size, "max_message_size": plan.max_message_size,
        "gpus": [gpu_document(g) for g in plan.gpus],
    }


class PlanWriter:
    """Plans as JSON text, each distinct operation encoded once (a pipeline repeats a few
    thousand) and each GPU once for the plans that share it (a window's parts)."""

    def __init__(self) -> None:
        self.ops: dict[Op, str] = {}
        self.gpus: dict[int, tuple[GpuPlan, str]] = {}  # id -> (the GPU, kept alive, its text)

    def op(self, op: Op) -> str:
        text = self.ops.get(op)
        if text is None:
            text = self.ops[op] = _compact(op_document(op))
        return text

    def gpu(self, g: GpuPlan) -> str:
        known = self.gpus.get(id(g))
        if known is not None:
            return known[1]
        doc = gpu_document(replace(g, threadblocks=()))
        tbs = ",".join(self.threadblock(tb) for tb in g.threadblocks)
        head, tail = _compact(doc).split('"threadblocks":[]', 1)  # the GPU's own keys keep their order
        text = f'{head}"threadblocks":[{tbs}]{tail}'
        self.gpus[id(g)] = (g, text)
        return text

    def threadblock(self, tb: Threadblock) -> str:
        doc = threadblock_document(replace(tb, ops=()))
        head, tail = _compact(doc).split('"ops":[]', 1)
        return f'{head}"ops":[{",".join(self.op(op) for op in tb.ops)}]{tail}'

    def plan(self, plan: ExecutionPlan) -> str:
        """The JSON text: one line per GPU keeps files diffable without the size of full indentation."""
        doc = plan_document(replace(plan, gpus=()))
        del doc["gpus"]  # the GPUs come last, one per line
        head = _compact(doc)[:-1]
        body = ",\n".join(self.gpu(g) for g in plan.gpus)
        return f'{head},"gpus":[\n{body}\n]}}\n'


def _compact(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"))


def write_plan(plan: ExecutionPlan) -> str:
    """The plan's JSON text (PlanWriter: one line per GPU)."""
    return PlanWriter().plan(plan)


def save_plan(plan: ExecutionPlan, path: str | Path) -> None:
    write_atomic(path, write_plan(plan))
