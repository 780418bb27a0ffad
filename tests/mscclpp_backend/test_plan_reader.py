"""Plans from JSON: what we write reads back the same; hostile or malformed JSON is one
InputError naming the file and the field, never a traceback."""

from __future__ import annotations

import gc
import json

import pytest
from hypothesis import given, strategies as st

from hipipe_compiler.errors import InputError
from hipipe_compiler.plan_fitting import fit
from hipipe_compiler.mscclpp.reader import (MAX_DEPTH, _depth, _depth_escaped, _depth_unescaped, looks_like_plan,
                                            read_plan, read_plan_text)
from hipipe_compiler.mscclpp.writer import plan_document, write_plan
from hipipe_compiler.presets import preset
from hipipe_compiler.schedule import hierarchical_plan


def _plan(protocol: str = "Simple"):
    topo = preset("dgx-h100-8x2")
    return fit(hierarchical_plan(topo, "allreduce", chunks=2, protocol=protocol, max_bytes=1 << 20), topo, "r")[1]


@pytest.mark.parametrize("protocol", ["Simple", "LL"])
def test_round_trip(protocol, tmp_path):
    plan = _plan(protocol)
    path = tmp_path / "p.json"
    path.write_text(write_plan(plan))
    assert looks_like_plan(path)
    assert read_plan(path) == plan


def _doc() -> dict:
    return plan_document(_plan())


BREAKAGES = [
    (lambda d: d.pop("name"), "name", "expected a string"),
    (lambda d: d.update(inplace="yes"), "inplace", "expected true or false"),
    (lambda d: d["gpus"][1].update(input_chunks=-1), "gpus[1].input_chunks", "expected an integer"),
    (lambda d: d["gpus"][0]["threadblocks"][0]["ops"][0].update(src_buff=[{"type": "x", "index": 0, "size": 1}]),
     "gpus[0].threadblocks[0].ops[0].src_buff[0].type", "expected one of i, o, s"),
    (lambda d: d["gpus"][0]["threadblocks"][0]["ops"][0].update(src_buff=[{"index": 0, "size": 1}]),
     "gpus[0].threadblocks[0].ops[0].src_buff[0]", "type, buffer_id or switch_channel_id"),
    (lambda d: d["gpus"][0]["channels"][0].update(channel_type="nvlink"), "gpus[0].channels[0].channel_type",
     "memory, port, switch"),
    (lambda d: d["gpus"][0].update(threadblocks={}), "gpus[0].threadblocks", "expected a list"),
    (lambda d: d["gpus"][0]["semaphores"].append({"init_value": 1.5}), "gpus[0].semaphores", "expected an integer"),
    (lambda d: d.update(max_message_size=2 ** 64), "max_message_size", "expected an integer"),
]


@pytest.mark.parametrize("case", range(len(BREAKAGES)))
def test_malformed_fields_are_named(case, tmp_path):
    breaking, field, message = BREAKAGES[case]
    doc = _doc()
    breaking(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as err:
        read_plan(path)
    assert err.value.source == str(path)
    assert err.value.field and err.value.field.startswith(field), err.value
    assert message in err.value.message


@pytest.mark.parametrize("text, message", [
    ("[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5), "nested deeper"),
    ('{"name": "a", "name": "b"}', "appears twice"),
    ('{"name": NaN}', "not valid JSON"),
    ("{", "not valid JSON"),
    ("[]", "expected an object"),
])
def test_hostile_json_is_one_error(text, message):
    with pytest.raises(InputError) as err:
        read_plan_text(text, "h.json")
    assert message in str(err.value) and "\n" not in str(err.value)
    assert gc.isenabled()  # paused while reading, back on after an error too


def test_a_key_given_twice_is_named_wherever_it_is():
    doc = json.loads(write_plan(_plan()))
    text = json.dumps(doc).replace('"scratch_chunks":', '"output_chunks": 1, "scratch_chunks":', 1)
    with pytest.raises(InputError, match="'output_chunks' appears twice"):
        read_plan_text(text, "h.json")
    assert gc.isenabled()


def test_binary_and_missing_files(tmp_path):
    blob = tmp_path / "blob.json"
    blob.write_bytes(b"{\xff\xfe")
    with pytest.raises(InputError, match="not UTF-8"):
        read_plan(blob)
    with pytest.raises(InputError, match="cannot read"):
        read_plan(tmp_path / "absent.json")


@pytest.mark.parametrize("name, content, plan", [
    ("p.json", b"[1, 2]", True),
    ("p.json", b"", True),  # named as JSON: reported as bad JSON, not as bad XML
    ("p.json", b"\xef\xbb\xbf  {}", True),
    ("p.xml", b"\n  [", True),
    ("p.xml", b"<algo/>", False),
    ("p.json", b"<algo/>", False),  # it is XML, whatever its name
    ("p", b"", False),
])
def test_plans_are_told_from_xml_by_their_first_character_or_name(name, content, plan, tmp_path):
    path = tmp_path / name
    path.write_bytes(content)
    assert looks_like_plan(path) is plan


def test_a_byte_order_mark_is_skipped_as_the_loader_skips_it(tmp_path):
    plain, marked = tmp_path / "plain.json", tmp_path / "marked.json"
    plain.write_text(write_plan(_plan()))
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert read_plan(marked) == read_plan(plain)


def _nesting(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_nesting, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_nesting, value), default=0)
    return 0


_TEXT = st.text(alphabet='[]{}"\\ab\n', max_size=8)
_JSON = st.recursive(st.none() | st.integers() | _TEXT,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3), max_leaves=20)


@given(_JSON, st.booleans())
def test_the_depth_check_counts_brackets_outside_strings_as_json_nests_them(value, compact):
    text = json.dumps(value, separators=(",", ":") if compact else None)  # strings full of brackets, quotes, escapes
    assert _depth(text) == _nesting(value)


@given(st.text(alphabet='[]{}"a ,:\u00e9', max_size=60))
def test_without_escapes_a_count_of_quotes_finds_the_strings_as_the_regex_does(text):
    # any text, JSON or not: unbalanced brackets, strings left open, non-ASCII
    assert _depth_unescaped(text) == _depth_escaped(text)


def test_a_string_left_open_hides_the_brackets_after_it():
    assert _depth('[["a\\"]]') == 2 and _depth('[["a\\"[[[[') == 2 and _depth('{"x": "[[[') == 1


def test_ranks_share_the_operations_they_repeat():
    plan = read_plan_text(write_plan(_plan()))
    ops = [op for g in plan.gpus for tb in g.threadblocks for op in tb.ops]
    assert len({id(op) for op in ops}) == len(set(ops)) < len(ops)
    lists = [tb.ops for g in plan.gpus for tb in g.threadblocks]
    assert len({id(t) for t in lists}) == len(set(lists))


@pytest.mark.parametrize("value", [True, 1.0, "1", [1]])
def test_a_repeat_that_only_looks_equal_is_checked_afresh(value):
    """1 == True == 1.0 in Python: an operation seen before with an integer must not let the
    same operation with another type of value pass as a repeat."""
    doc = _doc()
    ops = doc["gpus"][1]["threadblocks"][0]["ops"]
    twin = json.loads(json.dumps(next(op for op in ops if op.get("src_buff"))))
    twin["src_buff"][0]["size"] = 1
    ops += [dict(twin), json.loads(json.dumps(twin).replace('"size": 1', f'"size": {json.dumps(value)}'))]
    with pytest.raises(InputError) as err:
        read_plan_text(json.dumps(doc), "h.json")
    assert err.value.field == f"gpus[1].threadblocks[0].ops[{len(ops) - 1}].src_buff[0].size"
