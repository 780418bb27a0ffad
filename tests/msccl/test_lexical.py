"""The runtime reader's lexical rules: each is caught, with its rule name."""

import pytest

from hipipe_compiler.msccl import lexical_issues

from msccl_files import GOOD


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
    (GOOD.replace("\n</algo>", "\n<![CDATA[x]]>\n</algo>"), "lexical.markup"),
    ("<!DOCTYPE algo>\n" + GOOD, "lexical.markup"),
    (GOOD.replace("\n</algo>", "\n<9gpu id=\"0\"/>\n</algo>"), "lexical.tag-name"),
    (GOOD.rstrip("\n") + '\n<gpu id="0"', "lexical.unterminated"),
    (GOOD.replace('name="a"', 'name="a&amp;b"'), "lexical.value-chars"),
    (GOOD.replace('name="a"', 'name="a\tb"'), "lexical.value-chars"),
])
def test_lexical_rules_are_caught(text, rule):
    assert rule in {i.rule for i in lexical_issues(text)}
    assert lexical_issues(GOOD) == []
