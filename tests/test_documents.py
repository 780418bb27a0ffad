"""Input documents: YAML means what JSON means, and what no schema can name (repeated keys,
tags of other types, aliases that contain themselves or expand to billions, nesting and
numbers too large) is refused in one line naming the file."""

import pytest

from hipipe_compiler.documents import MAX_VALUES, load_document, validate_document
from hipipe_compiler.errors import InputError


@pytest.mark.parametrize("name,text,message", [
    ("dup.yaml", "dimensions: []\ndimensions: []\n", "at line 2, column 1: key 'dimensions' appears twice"),
    ("dup.json", '{"dimensions": [], "dimensions": []}', "malformed JSON: key 'dimensions' appears twice"),
    ("binary.yaml", "name: !!binary aGVsbG8=\n", "tag !!binary is not supported"),
    ("set.yaml", "name: !!set {a, b}\n", "tag !!set is not supported"),
    ("keys.yaml", "1: a\nfoo: b\n", "(top level): expected text keys, got 1"),
    ("self.yaml", "dimensions: &x [*x]\n", "dimensions[0] contains itself"),
    ("deep.yaml", "dimensions: " + "[" * 20000 + "\n", "nested too deeply"),
    ("deep.json", '{"dimensions": ' + "[" * 20000 + "}", "nested too deeply"),
    ("digits.yaml", "name: " + "9" * 5000 + "\n", "Exceeds the limit"),
])
def test_what_no_schema_can_name_is_one_line_naming_the_file(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_document(path)
    assert message in str(info.value) and str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_a_date_stays_text_as_in_json(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("name: 2024-01-01\nsize: 2024-01-01\n")
    assert load_document(path) == {"name": "2024-01-01", "size": "2024-01-01"}


def test_billion_laughs_is_refused_without_expanding_it(tmp_path):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, cur in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{cur}: &{cur} [{','.join([f'*{prev}'] * 9)}]")
    path = tmp_path / "laughs.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=f"holds more than {MAX_VALUES:,} values, counting what YAML aliases"):
        load_document(path)
    shared = tmp_path / "shared.yaml"  # aliases that stay small are fine
    shared.write_text('a: &a [1, 2]\nb: [*a, *a, *a]\n')
    assert load_document(shared) == {"a": [1, 2], "b": [[1, 2]] * 3}


def test_a_device_is_read_no_further_than_the_size_limit():
    with pytest.raises(InputError, match="/dev/zero: file is larger than"):
        load_document("/dev/zero")


def test_a_one_of_names_the_error_of_the_branch_that_applied():
    """A grid's topology is a preset name or an inline topology: an inline one with a bad size
    is named by its size, not by 'expected a string'."""
    doc = {"sizes": ["1MiB"], "topologies": {"a": {"dimensions": [{"size": 1, "kind": "ring", "bandwidth": 1, "latency": 1}]}}}
    with pytest.raises(InputError, match=r"topologies.a.dimensions\[0\].size: expected an integer >= 2, got 1"):
        validate_document(doc, "grid.schema.json", "g.yaml")
    with pytest.raises(InputError, match="topologies.a: expected a string, got 5"):
        validate_document({**doc, "topologies": {"a": 5}}, "grid.schema.json", "g.yaml")
