"""MSCCL files the XML tests share: the XSD, a minimal valid file, our programs, and the rules
every file we emit obeys."""

import re

from lxml import etree

from hipipe_compiler.documents import schema_path
from hipipe_compiler.lower import lower
from hipipe_compiler.msccl import lexical_issues
from hipipe_compiler.schedule import hierarchical_plan, ring_plan

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


GOOD = '<algo name="a" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allreduce" inplace="1" outofplace="0" minBytes="0" maxBytes="0">\n</algo>\n'
