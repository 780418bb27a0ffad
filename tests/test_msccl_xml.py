"""The XML backend: writer, safe reader, lexical rules of the runtime's reader, the XSD."""

import re
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lxml import etree

from conftest import COLLECTIVES, SAMPLES, real_xml_files, shared_path, topologies
from hipipe_compiler.errors import InputError
from hipipe_compiler.lowering import lower
from hipipe_compiler.msccl_xml import lexical_issues, read_program, write_program
from hipipe_compiler.plan import hierarchical_plan, ring_plan
from hipipe_compiler.resources import schema_path
from hipipe_compiler.topology import load_topology, preset
from hipipe_compiler.verify import verify

XSD = etree.XMLSchema(etree.parse(str(schema_path("msccl-algo.xsd"))))


def emitted(topo, coll="allreduce", chunks=1, flat=False, max_bytes=1 << 24):
    plan = (ring_plan if flat else hierarchical_plan)(topo, coll, chunks, max_bytes=max_bytes)
    return lower(plan)


def check_file_rules(text: str, xsd: bool = True) -> None:
    """What every emitted file must satisfy: the XSD (executor dialect) and the runtime
    reader's lexical rules."""
    if xsd:
        assert XSD.validate(etree.fromstring(text.encode())), XSD.error_log.last_error
    assert lexical_issues(text) == []
    assert not text.startswith("<?xml")
    assert "\t" not in text
    assert not re.search(r'="0[0-9]', text)  # no zero-padded (octal) numbers
    for line in text.splitlines():
        assert line.count("<") <= 1  # one tag per line
        assert len(re.findall(r'\w+="', line)) <= 16


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
    program = emitted(preset("dgx-h100-8x2"), coll, 2)
    text = write_program(program, "legacy")
    if coll == "reducescatter":
        assert 'coll="reduce_scatter"' in text
    assert f'maxBytes="{program.max_bytes + 1}"' in text  # legacy windows are half-open
    # the legacy runtime matches inplace exactly and has no outofplace flag
    assert "outofplace" not in text
    assert read_program(text.encode(), dialect="legacy") == replace(program, outofplace=not program.inplace)
    assert read_program(text.encode()) == read_program(text.encode(), dialect="legacy")  # detected


@pytest.mark.parametrize("path", real_xml_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_files_read_and_write_back_with_the_same_semantics(path):
    program = read_program(path)
    text = write_program(program)
    again = read_program(text.encode())
    assert again == program
    assert XSD.validate(etree.parse(str(path)))
    assert lexical_issues(path.read_bytes()) == []
    assert verify(again).ok == verify(program).ok


def test_real_files_are_present_or_skipped():
    assert real_xml_files(), "expected the shared MSCCL files"
    shared_path("msccl-algorithms", "ndv4", "r48ll.xml")


# -- the runtime reader's lexical rules ------------------------------------------------------

GOOD = '<algo name="a" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allreduce" inplace="1" outofplace="0" minBytes="0" maxBytes="0">\n</algo>\n'


@pytest.mark.parametrize("text,rule", [
    ('<?xml version="1.0"?>\n' + GOOD, "lexical.declaration"),
    (GOOD.replace("\n</algo>", "\n\t</algo>"), "lexical.tab"),
    (GOOD.replace('name="a" ', 'name="a"\n'), "lexical.multiline-tag"),
    (GOOD.replace('name="a"', "name='a'"), "lexical.quotes"),
    (GOOD.replace('name="a"', 'name = "a"'), "lexical.attribute"),
    (GOOD.replace('name="a"', 'name="' + "x" * 300 + '"'), "lexical.long-value"),
    (GOOD.replace('name="a"', " ".join(f'k{i}="1"' for i in range(12)) + ' name="a"'), "lexical.attribute-count"),
    (GOOD.replace('name="a" ', 'name="a"  '), "lexical.double-space"),
    ('<!-- c -->\n<gpu id="0"/>\n', "lexical.first-node"),
    (GOOD.replace("\n</algo>", "\nhello\n</algo>"), "lexical.text-content"),
])
def test_lexical_rules_are_caught(text, rule):
    assert rule in {i.rule for i in lexical_issues(text)}
    assert lexical_issues(GOOD) == []


# -- hostile and broken input ----------------------------------------------------------------

HOSTILE = {
    "billion laughs": b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;"><!ENTITY c "&b;&b;&b;&b;&b;&b;">]><algo name="&c;"/>',
    "external entity": b'<!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]><algo name="&e;"/>',
    "external dtd": b'<!DOCTYPE algo SYSTEM "http://example.com/x.dtd"><algo/>',
    "deep nesting": b"<algo " + GOOD[6:GOOD.index(">") + 1].encode() + b"<x>" * 5000 + b"</x>" * 5000 + b"</algo>",
    "not xml": b"\x00\x01\x02garbage",
    "truncated": GOOD.encode()[:60],
    "wrong root": b"<gpu id='0'/>",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_xml_is_refused_with_one_line(name):
    with pytest.raises(InputError) as info:
        read_program(HOSTILE[name], name="evil.xml")
    assert str(info.value).startswith("evil.xml")
    assert "\n" not in str(info.value)


def _program_text(**changes) -> bytes:
    text = write_program(emitted(preset("dgx-h100-8x2"), "allreduce"))
    for key, value in changes.items():
        text = re.sub(rf'{key}="[^"]*"', f'{key}="{value}"', text, count=1)
    return text.encode()


@pytest.mark.parametrize("key,value,field", [
    ("cnt", "abc", "cnt"), ("cnt", "1e3", "cnt"), ("cnt", "0x10", "cnt"), ("cnt", "010", "cnt"),
    ("hasdep", "2", "hasdep"), ("type", "ra", "type"), ("proto", "Fast", "proto"), ("srcbuf", "x", "srcbuf"),
    ("ngpus", " 16", "ngpus"), ("depid", "", "depid"), ("coll", "allreduceX", "coll"),
])
def test_wrong_types_and_garbage_numbers_name_the_field(key, value, field):
    with pytest.raises(InputError) as info:
        read_program(_program_text(**{key: value}), name="bad.xml")
    assert f".{field}" in str(info.value) or info.value.field == f"algo.{field}"


def test_missing_attribute_and_leading_zero_message():
    text = _program_text().replace(b' maxBytes="', b' maxbytes="', 1)
    with pytest.raises(InputError, match="maxBytes"):
        read_program(text)
    with pytest.raises(InputError, match="octal"):
        read_program(_program_text(cnt="01"))


def test_oversized_files_are_refused_unread(tmp_path, monkeypatch):
    import hipipe_compiler.msccl_xml as mx
    monkeypatch.setattr(mx, "MAX_XML_BYTES", 1000)
    path = tmp_path / "big.xml"
    path.write_bytes(_program_text())
    with pytest.raises(InputError, match="larger than"):
        read_program(path)


def test_unknown_elements_are_skipped_like_the_runtime_does():
    text = _program_text().decode().replace("  <gpu id=\"1\"", '  <note a="1"><deep/></note>\n  <gpu id="1"', 1)
    program = read_program(text.encode())
    assert program == read_program(_program_text())
