"""The runtime reader's lexical rules: where its hand-written reader would reject or misread
a file that a real XML parser accepts (msccl-runtime.md section 1).

>>> [i.rule for i in lexical_issues('<?xml version="1.0"?>\\n<algo name="x">\\n</algo>\\n')]
['lexical.declaration']
"""

from __future__ import annotations

import re
from dataclasses import dataclass


#: The runtime's reader limits (msccl-runtime.md section 1).
MAX_ATTRIBUTES = 16
MAX_VALUE_CHARS = 254


@dataclass(frozen=True)
class LexicalIssue:
    """A place where the runtime's hand-written reader would reject or misread the file."""

    rule: str
    line: int
    message: str


_TAG = re.compile(rb"<!--.*?-->|<[^>]*>?", re.S)
_ATTR = re.compile(rb'\s*([A-Za-z_][A-Za-z0-9_]*)="([^"]*)"')


def lexical_issues(data: bytes | str, limit: int = 50) -> list[LexicalIssue]:
    """Check the text against the runtime's hand-written reader (msccl-runtime.md section 1).

    Returns at most `limit` issues; an empty list means the runtime reads it as XML would.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    issues: list[LexicalIssue] = []

    def add(rule: str, pos: int, message: str) -> bool:
        issues.append(LexicalIssue(rule, data.count(b"\n", 0, pos) + 1, message))
        return len(issues) >= limit

    first_node_seen = False
    pos = 0
    for m in _TAG.finditer(data):
        between = data[pos:m.start()]
        pos = m.end()
        if between.strip(b" \n\r"):
            kind = "tab" if b"\t" in between and not between.replace(b"\t", b"").strip(b" \n\r") else "text"
            rule = "lexical.tab" if kind == "tab" else "lexical.text-content"
            msg = "a tab between nodes breaks the runtime's reader; indent with spaces" if kind == "tab" else "text content between nodes is not allowed"
            if add(rule, m.start(), msg):
                return issues
        tag = m.group(0)
        if tag.startswith(b"<!--"):
            continue
        if tag.startswith(b"<?"):
            if add("lexical.declaration", m.start(), "an XML declaration or processing instruction is rejected by the runtime (expected >, got '?')"):
                return issues
            continue
        if tag.startswith(b"<!"):
            if add("lexical.markup", m.start(), "DOCTYPE/CDATA markup is not allowed"):
                return issues
            continue
        if not tag.endswith(b">"):
            add("lexical.unterminated", m.start(), "a tag is not closed")
            return issues
        if not first_node_seen:
            first_node_seen = True
            if not tag.startswith(b"<algo"):
                if add("lexical.first-node", m.start(), "the first node after comments must be <algo ...>"):
                    return issues
        if b"\n" in tag or b"\r" in tag:
            if add("lexical.multiline-tag", m.start(), "a tag must sit on one line"):
                return issues
        if tag.startswith(b"</"):
            continue
        body = tag[1:-1].rstrip(b"/")
        name_end = re.match(rb"[A-Za-z_][A-Za-z0-9_]*", body)
        if not name_end:
            if add("lexical.tag-name", m.start(), "malformed tag name"):
                return issues
            continue
        rest = body[name_end.end():]
        count, i = 0, 0
        while i < len(rest):
            am = _ATTR.match(rest, i)
            if not am:
                tail = rest[i:]
                if not tail.strip(b" "):
                    break
                if b"\t" in tail.split(b'"')[0]:
                    msg, rule = "a tab inside a tag breaks the runtime's reader", "lexical.tab"
                elif re.match(rb"\s*[A-Za-z_][A-Za-z0-9_]*\s*=\s*'", tail):
                    msg, rule = "attribute values must use double quotes", "lexical.quotes"
                else:
                    msg, rule = f"expected key=\"value\" attributes, got {tail[:30].decode('utf-8', 'replace')!r}", "lexical.attribute"
                if add(rule, m.start(), msg):
                    return issues
                break
            if am.group(0).startswith(b"  "):
                if add("lexical.double-space", m.start(), "a double space between attributes uses up an attribute slot"):
                    return issues
            key, value = am.group(1), am.group(2)
            count += 1
            if len(value) > MAX_VALUE_CHARS:
                if add("lexical.long-value", m.start(), f"attribute {key.decode()} is {len(value)} characters; the runtime's buffer holds {MAX_VALUE_CHARS}"):
                    return issues
            if b"\t" in value or b"&" in value:
                if add("lexical.value-chars", m.start(), f"attribute {key.decode()} holds a tab or '&', which the runtime copies verbatim"):
                    return issues
            i = am.end()
        if count > MAX_ATTRIBUTES:
            if add("lexical.attribute-count", m.start(), f"{count} attributes; the runtime keeps only the first {MAX_ATTRIBUTES}"):
                return issues
    if data[pos:].strip(b" \n\r"):
        add("lexical.text-content", pos, "text after the last node")
    if not first_node_seen:
        add("lexical.first-node", 0, "no <algo> node")
    return issues
