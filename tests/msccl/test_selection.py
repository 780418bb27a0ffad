"""msccl/selection.py decides calls exactly as the runtime's internal scheduler does."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hipipe_compiler.msccl.program import Program
from hipipe_compiler.msccl.reader import read_header
from hipipe_compiler.msccl.selection import call_bytes, element_multiple, refusal, serving, smallest_served

from conftest import examples, real_xml_params

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall")


def runtime_selects(algo: Program, coll: str, nranks: int, count: int, dtype_bytes: int, inplace: bool) -> bool:
    """The executor's test, written from msccl_lifecycle.cc (msccl-runtime.md 14): count > 0,
    (count * sizeMultiplier) % nChunksPerLoop == 0, minBytes <= nBytes <= maxBytes (0: no
    limit) with nBytes = count * dtype * sizeMultiplier, nGpus == nRanks, the collective, and
    the in-place or out-of-place flag."""
    multiplier = nranks if coll in ("allgather", "reducescatter", "alltoall") else 1
    n_bytes = count * dtype_bytes * multiplier
    return (count > 0 and (count * multiplier) % algo.nchunksperloop == 0
            and algo.min_bytes <= n_bytes and (algo.max_bytes == 0 or n_bytes <= algo.max_bytes)
            and algo.ngpus == nranks and algo.collective == coll and (algo.inplace if inplace else algo.outofplace))


@st.composite
def headers(draw) -> Program:
    ngpus = draw(st.sampled_from([2, 4, 8, 16, 32]))
    nch = ngpus * draw(st.sampled_from([1, 2, 3, 4, 8, 16, 64]))
    lo = draw(st.integers(0, 1 << 22))
    hi = draw(st.one_of(st.just(0), st.integers(lo, 1 << 24)))
    inplace, outofplace = draw(st.sampled_from([(True, True), (True, False), (False, True)]))
    return Program("p", draw(st.sampled_from(COLLECTIVES)), "Simple", 1, nch, ngpus, inplace, outofplace, lo, hi, ())


@settings(max_examples=examples(300))
@given(headers(), st.sampled_from(COLLECTIVES), st.sampled_from([2, 4, 8, 16, 32]), st.integers(0, 1 << 22),
       st.sampled_from([1, 2, 4, 8]), st.booleans())
def test_refusal_is_the_runtime_rule(algo, coll, nranks, count, dtype_bytes, inplace):
    reason = refusal(algo, coll, nranks, count, dtype_bytes, inplace)
    assert (reason is None) == runtime_selects(algo, coll, nranks, count, dtype_bytes, inplace), reason


@settings(max_examples=examples(200))
@given(st.lists(headers(), min_size=1, max_size=4), st.integers(1, 1 << 20), st.sampled_from([2, 4]))
def test_padding_goes_to_the_smallest_served_count(algos, count, dtype_bytes):
    coll, nranks = algos[0].collective, algos[0].ngpus
    padded = smallest_served(algos, coll, nranks, count, dtype_bytes)
    if padded is None:  # every window lies below the call: nothing larger is ever served
        assert not any(serving(algos, coll, nranks, c, dtype_bytes) for c in range(count, count + 4096))
        return
    assert padded >= count and serving(algos, coll, nranks, padded, dtype_bytes)
    gap = range(count, padded) if padded - count <= 4096 else range(count, count + 4096)
    assert not any(serving(algos, coll, nranks, c, dtype_bytes) for c in gap)


def test_element_multiple_counts_what_the_call_passes():
    ar = Program("ar", "allreduce", "Simple", 1, 256, 32, True, True, 0, 0, ())
    ag = Program("ag", "allgather", "Simple", 1, 256, 32, True, True, 0, 0, ())
    assert element_multiple(ar) == 256 and element_multiple(ag) == 8  # an all-gather's count is per rank
    assert refusal(ag, "allgather", 32, 8, 4) is None and refusal(ag, "allgather", 32, 4, 4) is not None
    assert call_bytes("allgather", 32, 8, 4) == 1024


@pytest.mark.parametrize("path", real_xml_params(limit=12))
def test_real_files_are_matched_by_their_own_header(path):
    algo = read_header(path)
    nbytes = max(algo.min_bytes, 1 << 20)
    if algo.max_bytes and nbytes > algo.max_bytes:
        nbytes = algo.min_bytes
    per = 4 * (algo.ngpus if algo.collective in ("allgather", "reducescatter", "alltoall") else 1)
    count = max(element_multiple(algo), nbytes // per // element_multiple(algo) * element_multiple(algo))
    for c in (count, count + 1):
        verdicts = [(refusal(algo, algo.collective, algo.ngpus, c, 4, inplace) is None,
                     runtime_selects(algo, algo.collective, algo.ngpus, c, 4, inplace)) for inplace in (True, False)]
        assert all(ours == theirs for ours, theirs in verdicts)
    assert refusal(algo, algo.collective, algo.ngpus, count, 4, algo.inplace) is None or algo.min_bytes > nbytes
