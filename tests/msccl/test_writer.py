"""The XML writer: every emitted file validates against the XSD and obeys the runtime
reader's lexical rules, in both dialects, and reads back to the same program."""

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hipipe_compiler.msccl import read_program, write_program
from hipipe_compiler.presets import load_topology

from conftest import COLLECTIVES, SAMPLES, topologies, c1p
from msccl_files import check_file_rules, emitted


@given(topologies(max_ranks=32), st.sampled_from(COLLECTIVES), st.integers(1, 3), st.booleans())
def test_every_emitted_file_validates_and_obeys_the_lexical_rules(topo, coll, chunks, flat):
    program = emitted(topo, coll, chunks, flat)
    check_file_rules(write_program(program))
    check_file_rules(write_program(program, "legacy"), xsd=False)


@pytest.mark.parametrize("sample", sorted(p.name for p in SAMPLES.iterdir() if "pod" not in p.name))
@pytest.mark.parametrize("coll", COLLECTIVES)
def test_every_sample_emits_valid_files(sample, coll):
    check_file_rules(write_program(emitted(load_topology(SAMPLES / sample), coll, 2)))


@given(topologies(max_ranks=32), st.sampled_from(COLLECTIVES), st.integers(1, 3))
def test_round_trip_is_byte_identical_and_deterministic(topo, coll, chunks):
    program = emitted(topo, coll, chunks)
    text = write_program(program)
    assert read_program(text.encode()) == program
    assert write_program(read_program(text.encode())) == text
    assert write_program(emitted(topo, coll, chunks)) == text


@pytest.mark.parametrize("coll", COLLECTIVES)
def test_legacy_dialect_round_trip(coll):
    program = emitted(c1p(2), coll, 2)
    text = write_program(program, "legacy")
    if coll == "reducescatter":
        assert 'coll="reduce_scatter"' in text
    assert f'maxBytes="{program.max_bytes + 1}"' in text  # legacy windows are half-open
    # the legacy runtime matches inplace exactly and has no outofplace flag
    assert "outofplace" not in text
    assert read_program(text.encode(), dialect="legacy") == replace(program, outofplace=not program.inplace)
    assert read_program(text.encode()) == read_program(text.encode(), dialect="legacy")  # detected
