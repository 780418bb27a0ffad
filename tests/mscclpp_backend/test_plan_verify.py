"""The plan verifier: every plan we emit is proven, on random topologies too; every deliberate
breakage is rejected with the rule it breaks; the executor's limits and the worked example
of mscclpp.md section 5."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from hipipe_compiler.errors import PlanError
from hipipe_compiler.plan_compiler import POOLS, size_multiple, timed_size
from hipipe_compiler.plan_fitting import fit
from hipipe_compiler.mscclpp.plan import ExecutionPlan, Op, largest_message_size, message_sizes
from hipipe_compiler.mscclpp.ordering import needless_credits, step_graph
from hipipe_compiler.mscclpp.reader import read_plan_text
from hipipe_compiler.mscclpp.translate import translate
from hipipe_compiler.mscclpp.verify import layouts_of, verify_plan
from hipipe_compiler.mscclpp.verify.execution import clock_type
from hipipe_compiler.presets import preset
from hipipe_compiler.sim.plans import time_plan
from hipipe_compiler.sim.simulate import SimulationError
from hipipe_compiler.schedule import hierarchical_plan, ring_plan

from conftest import SHARED
from plan_mutations import MUTATIONS
from strategies import plans

DOCS = Path(__file__).resolve().parents[2] / "docs"


@functools.lru_cache(maxsize=None)
def emitted(name: str, collective: str, protocol: str, schedule: str = "hierarchical") -> ExecutionPlan:
    topo = preset(name)
    plan = (hierarchical_plan(topo, collective, chunks=2, protocol=protocol, max_bytes=1 << 20) if schedule != "ring"
            else ring_plan(topo, collective, protocol=protocol, max_bytes=1 << 20))
    return fit(plan, topo, "t", pool=2 if schedule == "pooled" else None)[1]


#: a ring across nodes in LL forwards packets through the proxy; a Simple ring all-gather
#: closes some of its connections with a handshake, where nothing else orders a slot's reuse;
#: a pooled plan writes its slots again within the launch, after the receiver's credit
SUBJECTS = [("dgx-h100-8x2", "allreduce", "Simple"), ("dgx-h100-8x2", "reducescatter", "LL"),
            ("dgx-h100-8x1", "allreduce", "LL"), ("torus-4x4", "allgather", "Simple"),
            ("dgx-h100-8x2", "allgather", "LL", "ring"), ("dgx-h100-8x2", "allgather", "Simple", "ring"),
            ("torus-4x4", "allgather", "Simple", "pooled")]


@pytest.mark.parametrize("subject", SUBJECTS, ids="-".join)
def test_emitted_plans_verify_in_every_layout(subject):
    plan = emitted(*subject)
    for layout in ("separate", "inplace" if subject[1] != "reducescatter" else "nccl"):
        report = verify_plan(replace(plan, inplace=layout == "inplace"), (layout,))
        assert report.ok, [str(v) for v in report.violations[:3]]


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_every_mutation_is_rejected(name):
    mutate, rules = MUTATIONS[name]
    tried = 0
    for subject in SUBJECTS:
        plan = emitted(*subject)
        broken = mutate(plan)
        if broken is None or broken == plan:
            continue
        tried += 1
        report = verify_plan(broken, layouts_of(broken))
        assert not report.ok, f"{name} on {subject} went unnoticed"
        assert report.rules() & rules, f"{name} on {subject}: {sorted(report.rules())}, expected one of {sorted(rules)}"
    assert tried, f"no subject has what {name} breaks"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans(max_ranks=16, max_chunks=3), st.sampled_from(["Simple", "LL"]), st.data())
def test_random_topologies_every_plan_verifies(plan, protocol, data):
    topo = plan.topology
    divisors = [d for d in range(1, topo.nranks + 1) if topo.nranks % d == 0]
    node = data.draw(st.sampled_from(divisors))
    try:
        program, ep = fit(replace(plan, protocol=protocol), topo, "random", node_size=node)
    except PlanError:
        assume(False)
    for layout in layouts_of(ep, aliased=True):
        report = verify_plan(ep, (layout,))
        assert report.ok, [str(v) for v in report.violations[:3]]
    inplace = replace(ep, inplace=True)
    if program.inplace and ep.collective != "reducescatter":
        assert verify_plan(inplace).ok


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans(max_ranks=16, max_chunks=4), st.sampled_from((1, *POOLS)))
def test_random_pooled_plans_verify_unless_their_credits_deadlock_and_the_simulator_agrees(plan, pool):
    """Receives in a pool of slots per connection: the credits either keep every write after
    the read before it, or close a cycle of waits, which the verifier and the simulator (what
    the compiler asks before it keeps a pooled plan) both find. Windows up to 1 MiB, so that
    no offset limit stops the proof before it runs."""
    topo = plan.topology
    try:
        program, ep = fit(replace(plan, protocol="Simple", min_bytes=min(plan.min_bytes, 1 << 20),
                                   max_bytes=min(plan.max_bytes, 1 << 20)), topo, "pooled", pool=pool)
    except PlanError:
        assume(False)
    m = size_multiple(ep)
    size = max(-(-ep.min_message_size // m) * m, timed_size(ep, min(ep.max_message_size, 1 << 20)))
    assume(size <= ep.max_message_size)
    if needless_credits(step_graph(program), pool):
        event("the program's own order makes some credits needless")
    report = verify_plan(ep)
    try:
        time_plan(ep, topo, size)
    except SimulationError as exc:
        event("the credits deadlock")
        assert "deadlock" in str(exc)
        assert "deadlock" in report.rules(), [str(v) for v in report.violations[:3]]
    else:
        assert report.ok, [str(v) for v in report.violations[:3]]


def test_pooled_slots_take_less_scratch_and_a_credit_waited_for_too_late_is_caught():
    """With two slots per connection, torus-4x4's all-gather needs less than half the scratch
    (at some cost in time, as the docs say); with one credit waited for after the write it guards instead of before,
    a sender overwrites a slot its receiver may not have read (the signals still balance)."""
    topo = preset("torus-4x4")
    _program, plain = fit(hierarchical_plan(topo, "allgather", chunks=2, max_bytes=1 << 20), topo, "t")
    pooled = emitted("torus-4x4", "allgather", "Simple", "pooled")
    assert pooled.gpus[0].scratch_chunks * 2 < plain.gpus[0].scratch_chunks
    slower = time_plan(pooled, topo, 1 << 20).time_us / time_plan(plain, topo, 1 << 20).time_us - 1
    doc = " ".join((DOCS / "mscclpp.md").read_text().split())
    assert (f"needs {pooled.gpus[0].scratch_chunks} scratch chunks per rank with two slots per connection instead of "
            f"{plain.gpus[0].scratch_chunks}, but at 1 MiB it is {slower:.0%} slower") in doc
    g = pooled.gpus[0]
    for i, tb in enumerate(g.threadblocks):
        # a credit: a wait on the channel whose signal publishes the put that follows it
        credit = next((k for k in range(len(tb.ops) - 2) if tb.ops[k].name == "wait" and tb.ops[k + 1].name == "nop"
                       and tb.ops[k + 2].remote_writes and next(o for o in tb.ops[k + 2:] if o.name == "signal")
                       .channel_ids == tb.ops[k].channel_ids), None)
        if credit is not None:
            break
    assert credit is not None
    ops = list(tb.ops)
    ops.insert(credit + 2, ops.pop(credit))  # after the put
    tbs = list(g.threadblocks)
    tbs[i] = replace(tb, ops=tuple(ops))
    late = replace(pooled, gpus=(replace(g, threadblocks=tuple(tbs)), *pooled.gpus[1:]))
    assert verify_plan(pooled).ok
    assert verify_plan(late).rules() & {"slot-reuse", "race"}


@pytest.mark.parametrize("subject", SUBJECTS, ids="-".join)
def test_the_largest_size_is_where_the_first_offset_would_wrap(subject):
    """At the largest size, the input, the output and the whole scratch end within uint32; one
    size more (the plan's size multiple), one of them passes it."""
    plan = emitted(*subject)
    largest = largest_message_size(plan)
    step = size_multiple(plan)
    assert largest % step == 0 and verify_plan(replace(plan, max_message_size=largest)).ok

    def ends(nbytes: int) -> int:  # of the input, the output and the scratch a call of nbytes fills
        inp, out = message_sizes(plan.collective, nbytes, plan.ngpus)
        chunk = inp // plan.gpus[0].input_chunks
        scratch = max(g.scratch_chunks for g in plan.gpus) * chunk * (2 if plan.packets else 1)
        return max(inp, out, scratch * (2 if plan.use_double_scratch_buffer else 1))
    assert ends(largest) <= (1 << 32) - 1 < ends(largest + step)


def test_a_ring_across_nodes_verifies():
    topo = preset("dgx-h100-8x2")
    _, ep = fit(ring_plan(topo, "allreduce", max_bytes=1 << 20), topo, "ring")
    assert verify_plan(ep).ok


def test_unmodelled_operations_fail_the_proof_instead_of_passing():
    plan = emitted("dgx-h100-8x1", "allreduce", "LL")
    g = plan.gpus[0]
    tb = replace(g.threadblocks[0], ops=(Op("barrier", barrier_id=0, num_threadblocks=1), *g.threadblocks[0].ops))
    broken = replace(plan, gpus=(replace(g, threadblocks=(tb, *g.threadblocks[1:])), *plan.gpus[1:]))
    assert "unsupported" in verify_plan(broken).rules()


def test_clocks_are_a_byte_within_the_executors_limit_and_wider_beyond_it():
    assert [clock_type(n) for n in (64, 254, 255, 70000)] == [np.uint8, np.uint8, np.uint16, np.uint32]
    plan = emitted("dgx-h100-8x1", "allreduce", "LL")
    g = plan.gpus[0]
    tb = replace(g.threadblocks[0], ops=(*(Op("nop"),) * 300, *g.threadblocks[0].ops))
    longer = replace(plan, gpus=(replace(g, threadblocks=(tb, *g.threadblocks[1:])), *plan.gpus[1:]))
    assert verify_plan(longer).rules() == {"op-limit"}  # refused before any clock runs


def _worked_example() -> str:
    doc = SHARED / "docs" / "mscclpp.md"
    if not doc.exists():
        pytest.skip(f"{doc} is absent: this clone has no ../shared beside it")
    match = re.search(r"```json\n(.*?)```", doc.read_text(), re.S)
    assert match, "mscclpp.md has no JSON example"
    return match.group(1)


def test_the_worked_example_of_the_runtime_notes_verifies():
    plan = read_plan_text(_worked_example(), "mscclpp.md")
    report = verify_plan(plan)
    assert report.ok, [str(v) for v in report.violations]


def test_the_worked_example_without_its_closing_handshake_is_rejected():
    doc = json.loads(_worked_example())
    for g in doc["gpus"]:
        g["threadblocks"][0]["ops"] = g["threadblocks"][0]["ops"][:-3]  # nop, signal, wait
    report = verify_plan(read_plan_text(json.dumps(doc)))
    # the peer's store into o may land after this rank's kernel ended, and the counters no longer balance
    assert report.rules() & {"unfinished-write", "slot-reuse"}, sorted(report.rules())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_corrupted_number_gives_a_verdict_not_a_crash(data):
    """Hostile plans: every integer of an operation may be anything the reader accepts. The
    verifier answers (it never raises), and whatever it proves runs in the simulator."""
    subject = data.draw(st.sampled_from(SUBJECTS))
    plan = emitted(*subject)
    g = plan.gpus[data.draw(st.integers(0, plan.ngpus - 1))]
    tb = g.threadblocks[data.draw(st.integers(0, len(g.threadblocks) - 1))]
    at = data.draw(st.integers(0, len(tb.ops) - 1))
    op = tb.ops[at]
    small = st.integers(0, 70)
    field = data.draw(st.sampled_from(["index", "size", "buffer_id", "channel_ids", "semaphore_ids", "type"]))
    if field in ("index", "size", "buffer_id") and (op.src or op.dst):
        side = data.draw(st.sampled_from([s for s in ("src", "dst") if getattr(op, s)]))
        operands = list(getattr(op, side))
        k = data.draw(st.integers(0, len(operands) - 1))
        if field == "buffer_id" and operands[k].buffer is not None:
            operands[k] = replace(operands[k], buffer=None, buffer_id=data.draw(small))
        elif field != "buffer_id":
            operands[k] = replace(operands[k], **{field: data.draw(small)})
        op = replace(op, **{side: tuple(operands)})
    elif field == "channel_ids":
        op = replace(op, channel_ids=tuple(data.draw(st.lists(small, max_size=10))))
    elif field == "semaphore_ids":
        op = replace(op, semaphore_ids=tuple(data.draw(st.lists(small, max_size=18))))
    else:
        op = replace(op, channel_type=data.draw(st.sampled_from(["memory", "port", "none"])))
    ops = list(tb.ops)
    ops[at] = op
    tbs = tuple(replace(t, ops=tuple(ops)) if t.id == tb.id else t for t in g.threadblocks)
    broken = replace(plan, gpus=tuple(replace(x, threadblocks=tbs) if x.id == g.id else x for x in plan.gpus))
    report = verify_plan(broken)
    if report.ok:
        assert time_plan(broken, preset(subject[0]), 1 << 20).time_us > 0


def _exchange(handshake: str) -> ExecutionPlan:
    """A two-rank reduce-scatter: each rank puts the peer's chunk into the peer's scratch slot
    and sums its own with what it received there, with `handshake` ("none", "opening" or
    "closing") ordering the peer's next write after this launch's read of the slot."""
    def op(name: str, **fields: object) -> dict:
        return {"name": name, **({"channel_type": "memory", "channel_ids": [0]} if name in ("signal", "wait") else {}),
                **fields}

    def gpu(rank: int) -> dict:
        put = op("put", channel_type="memory", src_buff=[{"type": "i", "index": 1 - rank, "size": 1}],
                 dst_buff=[{"buffer_id": 0, "index": 0, "size": 1}])
        reduce = op("re", src_buff=[{"type": "i", "index": rank, "size": 1}, {"type": "s", "index": 0, "size": 1}],
                    dst_buff=[{"type": "o", "index": 0, "size": 1}])
        opening = [op("signal")] if handshake == "opening" else []
        before_put = [op("wait"), op("nop")] if handshake == "opening" else []
        closing = [op("nop"), op("signal"), op("wait")] if handshake == "closing" else []
        ops = [*opening, *before_put, put, op("nop"), op("signal"), op("wait"), op("nop"), reduce, *closing]
        return {"id": rank, "input_chunks": 2, "output_chunks": 1, "scratch_chunks": 1, "semaphores": [],
                "channels": [{"channel_type": "memory", "connected_to": [1 - rank]}],
                "remote_buffers": [{"rank": 1 - rank, "type": "s", "access_channel_types": ["memory"]}],
                "threadblocks": [{"id": 0, "channels": [{"channel_type": "memory", "channel_ids": [0]}],
                                  "remote_buffer_refs": [{"access_channel_type": "memory", "remote_buffer_ids": [0]}],
                                  "ops": ops}]}
    doc = {"name": f"exchange-{handshake}", "collective": "reducescatter", "protocol": "Simple", "inplace": False,
           "buffer_alignment": 16, "num_threads_per_block": 1024, "min_message_size": 32,
           "max_message_size": 1 << 20, "reuse_resources": False, "use_double_scratch_buffer": False,
           "gpus": [gpu(0), gpu(1)]}
    return read_plan_text(json.dumps(doc), "exchange.json")


@pytest.mark.parametrize("handshake", ["opening", "closing"])
def test_a_slot_is_reused_safely_after_an_opening_or_a_closing_handshake(handshake):
    # opening: the peer's next write follows this rank's next kernel start, so its last read
    report = verify_plan(_exchange(handshake))
    assert report.ok, [str(v) for v in report.violations]


def test_a_slot_whose_next_write_nothing_orders_after_its_read_is_rejected():
    # the peer's next launch may start as soon as it has this rank's data, before this rank read its slot
    assert verify_plan(_exchange("none")).rules() == {"slot-reuse"}


def test_opening_handshakes_verify_and_are_rejected_without_their_wait():
    """The Simple ring all-gather with the handshakes it needs opening instead of closing:
    proven in every layout; with the first wait of a threadblock that opens one dropped, a
    peer may write a slot before this launch has started (or the signals no longer balance)."""
    topo = preset("dgx-h100-8x2")
    program, closed = fit(ring_plan(topo, "allgather", protocol="Simple", max_bytes=1 << 20), topo, "t")
    opened = translate(program, topo, "t", opening=True)
    for layout in ("separate", "inplace"):
        report = verify_plan(replace(opened, inplace=layout == "inplace"), (layout,))
        assert report.ok, [str(v) for v in report.violations[:3]]
    g = opened.gpus[0]
    i, tb = next((i, tb) for i, tb in enumerate(g.threadblocks) if tb.ops != closed.gpus[0].threadblocks[i].ops)
    first_wait = next(k for k, op in enumerate(tb.ops) if op.name == "wait")
    tbs = list(g.threadblocks)
    tbs[i] = replace(tb, ops=tb.ops[:first_wait] + tb.ops[first_wait + 1:])
    broken = replace(opened, gpus=(replace(g, threadblocks=tuple(tbs)), *opened.gpus[1:]))
    assert verify_plan(broken).rules() & {"slot-reuse", "signal-balance", "unpublished-read"}
