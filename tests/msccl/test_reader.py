"""The safe reader: real files read back with the same semantics, hostile and broken files
refused with one line naming the field, and elements the runtime skips skipped."""

import re

import pytest
from lxml import etree

from hipipe_compiler.errors import InputError
from hipipe_compiler.msccl import lexical_issues, read_program, write_program
from hipipe_compiler.msccl.verify import verify

from conftest import real_xml_files, real_xml_params, shared_path, c1p
from msccl_files import GOOD, XSD, emitted


@pytest.mark.parametrize("path", real_xml_params())
def test_real_files_read_and_write_back_with_the_same_semantics(path):
    program = read_program(path)
    text = write_program(program)
    again = read_program(text.encode())
    assert again == program
    assert XSD.validate(etree.parse(str(path)))
    assert lexical_issues(path.read_bytes()) == []
    assert verify(again).ok == verify(program).ok


def test_real_files_are_present_or_skipped():
    shared_path("msccl-algorithms", "ndv4", "r48ll.xml")  # skips, saying why, in a clone without ../shared
    assert len(real_xml_files()) >= 20, "../shared is here, so its MSCCL files should be found"


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
    text = write_program(emitted(c1p(2), "allreduce"))
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
    import hipipe_compiler.msccl.reader as mx
    monkeypatch.setattr(mx, "MAX_XML_BYTES", 1000)
    path = tmp_path / "big.xml"
    path.write_bytes(_program_text())
    with pytest.raises(InputError, match="larger than"):
        read_program(path)


def test_unknown_elements_are_skipped_like_the_runtime_does():
    text = _program_text().decode().replace("  <gpu id=\"1\"", '  <note a="1"><deep/></note>\n  <gpu id="1"', 1)
    program = read_program(text.encode())
    assert program == read_program(_program_text())


def test_the_executor_dialect_refuses_legacy_files_naming_the_attribute():
    """A file the executor would refuse at communicator init does not pass as its own: the
    legacy runtime's collective names and a missing outofplace are named, with the way out."""
    legacy = write_program(emitted(c1p(2), "reducescatter"), "legacy").encode()
    with pytest.raises(InputError, match="algo.coll: 'reduce_scatter' is a name of the legacy") as info:
        read_program(legacy, dialect="executor")
    assert "--dialect legacy" in str(info.value)
    assert read_program(legacy, dialect="legacy").collective == "reducescatter"
    no_outofplace = _program_text().replace(b' outofplace="1"', b"", 1)
    assert b"outofplace" not in no_outofplace
    with pytest.raises(InputError, match="algo.outofplace: missing; msccl-executor-nccl and RCCL require it"):
        read_program(no_outofplace, dialect="executor")
    custom = _program_text(coll="custom")
    with pytest.raises(InputError, match="algo.coll"):
        read_program(custom, dialect="executor")
    assert read_program(custom, dialect="legacy").collective == "custom"


@pytest.mark.parametrize("max_bytes", ["0", "4096"])
def test_a_legacy_window_that_selects_nothing_is_refused(max_bytes):
    """Legacy windows are half-open, [minBytes, maxBytes): maxBytes 0, or not above minBytes,
    selects no call (it must not read as the executor's 0 = unbounded)."""
    text = write_program(emitted(c1p(2)), "legacy").encode()
    text = re.sub(rb'minBytes="\d+" maxBytes="\d+"', f'minBytes="4096" maxBytes="{max_bytes}"'.encode(), text)
    with pytest.raises(InputError, match="algo.maxBytes: expected more than minBytes"):
        read_program(text, dialect="legacy")
    assert read_program(text.replace(f'maxBytes="{max_bytes}"'.encode(), b'maxBytes="4097"'),
                        dialect="legacy").max_bytes == 4096


@pytest.mark.parametrize("key,value", [("nchunksperloop", 1 << 40), ("s_chunks", 1 << 62), ("i_chunks", 10_000_000)])
def test_chunk_counts_no_runtime_could_address_are_refused_before_any_memory_is_taken(key, value):
    """Offsets are 16-bit: millions of chunks are a hostile file, which would make the
    verifier's model of the buffers take gigabytes (or overflow)."""
    with pytest.raises(InputError, match=f"{key}: expected at most 1048576 chunks"):
        read_program(_program_text(**{key: value}))


def test_a_device_is_read_no_further_than_the_size_limit_and_libxml_messages_are_one_line(tmp_path):
    with pytest.raises(InputError, match="/dev/zero: file is larger than"):
        read_program("/dev/zero")
    nul = tmp_path / "nul.xml"
    nul.write_bytes(_program_text().replace(b'<gpu id="1"', b'\x00<gpu id="1"', 1))
    with pytest.raises(InputError, match="malformed XML at line") as info:
        read_program(nul)
    assert "\n" not in str(info.value)


def test_ranks_share_the_steps_they_repeat_and_a_changed_repeat_is_checked_afresh():
    text = write_program(emitted(c1p(2), "allreduce"))
    program = read_program(text.encode())
    steps = [st for g in program.gpus for tb in g.threadblocks for st in tb.steps]
    assert len({id(st) for st in steps}) == len(set(steps)) < len(steps)
    elements = re.findall(r"<step [^>]*/>", text)
    repeated = next(e for e in elements if elements.count(e) > 1)
    last = text.rindex(repeated)
    broken = text[:last] + repeated.replace(' cnt="', ' cnt="0', 1) + text[last + len(repeated):]
    with pytest.raises(InputError, match="leading zero|plain decimal"):
        read_program(broken.encode(), name="bad.xml")
