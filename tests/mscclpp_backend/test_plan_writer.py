"""The writer's text is the plain encoding of the plan's document (one line per GPU), whatever
it shares between plans: operations encoded once, and GPUs that several plans hold."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from hipipe_compiler.mscclpp.nvls import nvls_allreduce_plan
from hipipe_compiler.mscclpp.nvls_pipeline import nvls_pipeline_plan
from hipipe_compiler.mscclpp.plan import ExecutionPlan, Op, Operand
from hipipe_compiler.mscclpp.writer import PlanWriter, plan_document, write_plan
from hipipe_compiler.plan_fitting import fit
from hipipe_compiler.presets import preset
from hipipe_compiler.schedule import hierarchical_plan

from conftest import nvls_nodes


def _plain(plan: ExecutionPlan) -> str:
    """The plan's document encoded directly: the format the writer must keep."""
    doc = plan_document(plan)
    gpus = doc.pop("gpus")
    head = json.dumps(doc, separators=(",", ":"))[:-1]
    body = ",\n".join(json.dumps(g, separators=(",", ":")) for g in gpus)
    return f'{head},"gpus":[\n{body}\n]}}\n'


def _hierarchical(protocol: str) -> ExecutionPlan:
    topo = preset("dgx-h100-8x2")
    return fit(hierarchical_plan(topo, "allreduce", chunks=2, protocol=protocol, max_bytes=1 << 20), topo, "r")[1]


def _pipelined(plan: ExecutionPlan) -> ExecutionPlan:
    """The plan with its first threadblock's operations wrapped in a `pipeline` on every GPU."""
    gpus = []
    for g in plan.gpus:
        first = g.threadblocks[0]
        loop = Op("pipeline", unit_size=1 << 20, num_chunks=1, ops=first.ops)
        gpus.append(replace(g, threadblocks=(replace(first, ops=(loop,)), *g.threadblocks[1:])))
    return replace(plan, gpus=tuple(gpus))


PLANS = {
    "hierarchical Simple": lambda: _hierarchical("Simple"),
    "hierarchical LL": lambda: _hierarchical("LL"),
    "in-switch, one node": lambda: nvls_allreduce_plan(preset("dgx-h100-8x1"), "n", True, 4),
    "in-switch pipeline": lambda: nvls_pipeline_plan(nvls_nodes(4, 2), "p", False, 2),
    "a pipeline operation": lambda: _pipelined(_hierarchical("Simple")),
    "no GPUs": lambda: ExecutionPlan("e", "allreduce", "Simple", False, ()),
}


@pytest.mark.parametrize("name", PLANS)
def test_the_text_is_the_plain_encoding_of_the_document(name):
    plan = PLANS[name]()
    text = write_plan(plan)
    assert text == _plain(plan)
    # the head, a line per GPU (an empty one where there is none), the close
    assert len(text.splitlines()) == 2 + max(len(plan.gpus), 1)


def test_a_writer_shared_by_plans_writes_each_as_it_would_alone():
    """What one plan's writing left behind (operations, GPUs) never leaks into another's text:
    plans that share GPUs and differ in name and mode, and plans that share nothing."""
    simple, ll = _hierarchical("Simple"), _hierarchical("LL")
    parts = [replace(simple, name=f"part-{m}", inplace=m, min_message_size=1 << m) for m in (False, True)]
    sequence = [*parts, ll, simple, _pipelined(simple), parts[0]]
    writer = PlanWriter()
    assert [writer.plan(p) for p in sequence] == [_plain(p) for p in sequence]
    assert len(writer.gpus) == 3 * len(simple.gpus)  # simple's GPUs (shared by the parts), ll's and the pipelined
    assert writer.ops  # operations were encoded once and looked up after


def test_operations_equal_in_value_share_one_text_and_different_ones_do_not():
    writer = PlanWriter()
    a = Op("put", "memory", (0,), src=(Operand("i", 0, 1),), dst=(Operand(None, 0, 1, buffer_id=0),))
    same = Op("put", "memory", (0,), src=(Operand("i", 0, 1),), dst=(Operand(None, 0, 1, buffer_id=0),))
    other = replace(a, dst=(Operand(None, 1, 1, buffer_id=0),))
    assert writer.op(a) is writer.op(same)
    assert writer.op(other) != writer.op(a) and '"index":1' in writer.op(other)
