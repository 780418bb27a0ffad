"""The plan's memory as the executor allocates it: scratch per context, and the largest
window a scratch budget allows."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hipipe_compiler.mscclpp.plan import (MAX_MESSAGE_SIZE, context_scratch_bytes, largest_size_within_scratch,
                                          scratch_per_chunk)
from hipipe_compiler.plan_fitting import fit
from hipipe_compiler.presets import preset
from hipipe_compiler.schedule import hierarchical_plan

TOPO = preset("dgx-h100-8x2")
PLANS = {(collective, protocol): fit(hierarchical_plan(TOPO, collective, chunks=2, protocol=protocol,
                                                       max_bytes=1 << 20), TOPO, "m")[1]
         for collective in ("allreduce", "allgather") for protocol in ("Simple", "LL")}


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(PLANS)), st.integers(1, 1 << 34))
def test_the_largest_size_within_a_budget_is_the_last_whose_scratch_fits(key, budget):
    plan = PLANS[key]
    top = largest_size_within_scratch(plan, budget)
    assert context_scratch_bytes(replace(plan, max_message_size=top)) <= budget
    assert context_scratch_bytes(replace(plan, max_message_size=top + 1)) > budget


@pytest.mark.parametrize("protocol", ["Simple", "LL"])
def test_an_all_gathers_scratch_is_sized_by_its_output(protocol):
    """The executor sizes scratch by the send buffer's allocation, capped by max_message_size,
    which an all-gather counts in output bytes: its ranks' count times a call's own scratch."""
    plan = PLANS["allgather", protocol]
    g = plan.gpus[0]
    top = plan.max_message_size // (TOPO.nranks * g.input_chunks * 16) * (TOPO.nranks * g.input_chunks * 16)
    plan = replace(plan, max_message_size=top)
    call_input = top // TOPO.nranks  # what one call at that size sends
    per_call = call_input // g.input_chunks * max(x.scratch_chunks for x in plan.gpus)
    per_call *= (2 if plan.packets else 1) * (2 if plan.use_double_scratch_buffer else 1)
    assert context_scratch_bytes(plan) == TOPO.nranks * per_call


def test_a_plan_without_scratch_has_no_scratch_bound():
    plan = PLANS["allreduce", "Simple"]
    bare = replace(plan, gpus=tuple(replace(g, scratch_chunks=0) for g in plan.gpus))
    assert context_scratch_bytes(bare) == 0 and largest_size_within_scratch(bare, 1) == MAX_MESSAGE_SIZE



def test_less_scratch_per_chunk_is_less_scratch_per_context():
    """What the compiler compares pools by: with two slots per connection the all-reduce's
    scratch per chunk byte drops, and so does every context's at the same largest size."""
    plan = PLANS["allreduce", "Simple"]
    pooled = fit(hierarchical_plan(TOPO, chunks=2, max_bytes=1 << 20), TOPO, "m", pool=2)[1]
    assert 0 < scratch_per_chunk(pooled) < scratch_per_chunk(plan)
    size = min(plan.max_message_size, pooled.max_message_size)
    assert (context_scratch_bytes(replace(pooled, max_message_size=size))
            < context_scratch_bytes(replace(plan, max_message_size=size)))
    assert scratch_per_chunk(replace(plan, gpus=tuple(replace(g, scratch_chunks=0) for g in plan.gpus))) == 0


def test_a_plans_hash_is_kept_and_follows_its_content_not_its_pickle():
    """Plans key the compiler's proofs, and each holds every operation of every rank: the hash
    is computed once. A changed copy hashes anew, and a pickle (another process may hash
    strings differently) carries no hash."""
    plan = PLANS[("allreduce", "Simple")]
    first = hash(plan)
    assert plan.__dict__["_hash"] == first and hash(plan) == first
    assert hash(replace(plan)) == first and replace(plan) == plan
    changed = replace(plan, max_message_size=plan.max_message_size // 2)
    assert changed != plan and "_hash" not in changed.__dict__
    copy = pickle.loads(pickle.dumps(plan))
    assert "_hash" not in copy.__dict__ and copy == plan and hash(copy) == first
