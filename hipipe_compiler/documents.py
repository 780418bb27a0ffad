"""Reading YAML/JSON input files and checking them against our JSON schemas (the top-level
schemas/ directory, installed as hipipe_compiler.schemas).

Every input document goes through here so that every bad file gets the same kind of
message: one line naming the file, the field and what was expected.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from referencing import Registry, Resource

from .errors import InputError

MAX_DOCUMENT_BYTES = 64 << 20


def schema_path(name: str) -> Path:
    """Path of a file of the top-level schemas/ directory (installed as hipipe_compiler.schemas)."""
    try:
        candidate = Path(str(resources.files("hipipe_compiler.schemas") / name))
        if candidate.is_file():
            return candidate
    except ModuleNotFoundError:
        pass
    return Path(__file__).resolve().parent.parent / "schemas" / name


@lru_cache(maxsize=None)
def load_json_schema(name: str) -> dict[str, Any]:
    """The parsed JSON schema schemas/NAME."""
    with open(schema_path(name), encoding="utf-8") as fh:
        return json.load(fh)


class _Loader(yaml.SafeLoader):
    """YAML that means what JSON means: dates stay text, a repeated key is an error, and
    tags that build other types (!!binary, !!set, !!timestamp, ...) are refused."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def refuse_tag(self, node: yaml.Node) -> None:
        raise yaml.constructor.ConstructorError(None, None, f"tag !!{node.tag.rsplit(':', 1)[-1]} is not supported",
                                                node.start_mark)


# a date is text here, as in JSON; only the types JSON has are built
_Loader.yaml_implicit_resolvers = {first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
                                   for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
for _tag in ("timestamp", "binary", "set", "omap", "pairs"):
    _Loader.add_constructor(f"tag:yaml.org,2002:{_tag}", _Loader.refuse_tag)


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice")
        out[key] = value
    return out


#: Values a document may hold once its YAML aliases are expanded (a "billion laughs" file
#: is small but expands to billions, which every later pass would walk).
MAX_VALUES = 1_000_000


def _check_plain(value: Any, field: str = "", active: tuple[int, ...] = (), sizes: dict[int, int] | None = None) -> int:
    """Refuse what no schema can name: a mapping key that is not text, an alias that contains
    itself (YAML `&x [*x]`), or more than MAX_VALUES values once aliases are expanded.
    Returns the expanded count; a shared alias is walked once."""
    sizes = {} if sizes is None else sizes
    if not isinstance(value, (dict, list)):
        return 1
    if id(value) in active:
        raise ValueError(f"{field or '(top level)'} contains itself (a YAML alias refers to its own anchor)")
    if id(value) not in sizes:
        active = (*active, id(value))
        total = 1
        for key, item in (value.items() if isinstance(value, dict) else enumerate(value)):
            if isinstance(value, dict) and not isinstance(key, str):
                raise ValueError(f"{field or '(top level)'}: expected text keys, got {key!r}")
            total += _check_plain(item, f"{field}[{key}]" if isinstance(key, int) else (f"{field}.{key}" if field else key),
                                  active, sizes)
            if total > MAX_VALUES:
                raise ValueError(f"{field or '(top level)'} holds more than {MAX_VALUES:,} values, counting what YAML "
                                 "aliases repeat")
        sizes[id(value)] = total
    return sizes[id(value)]


def load_document(path: str | Path) -> Any:
    """Parse a YAML or JSON file (JSON is chosen by the .json suffix, YAML otherwise)."""
    path = Path(path)
    source = str(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_DOCUMENT_BYTES + 1)  # a device such as /dev/zero has no size to check first
        if len(raw) > MAX_DOCUMENT_BYTES:
            raise InputError(source, None, f"file is larger than {MAX_DOCUMENT_BYTES >> 20} MiB")
    except InputError:
        raise
    except OSError as exc:
        raise InputError(source, None, f"cannot read file: {exc.strerror or exc}") from None
    return parse_document(raw, source, "JSON" if path.suffix.lower() == ".json" else "YAML")


def parse_document(raw: bytes, source: str, kind: str = "YAML") -> Any:
    """Parse the bytes of a YAML or JSON document; InputError names `source`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(source, None, "expected UTF-8 text") from None
    try:
        if kind == "JSON":
            data = json.loads(text, object_pairs_hook=_json_pairs)
        else:
            data = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
        _check_plain(data)
        return data
    except json.JSONDecodeError as exc:
        raise InputError(source, None, f"malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "could not be parsed"
        raise InputError(source, None, f"malformed YAML{where}: {problem}") from None
    except RecursionError:
        raise InputError(source, None, f"malformed {kind}: nested too deeply") from None
    except ValueError as exc:  # a repeated key, a self-containing alias, a number of thousands of digits
        raise InputError(source, None, f"malformed {kind}: {str(exc).split(';')[0]}") from None


def _field_name(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _describe(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _expected(error: jsonschema.ValidationError) -> str:
    v, schema, inst = error.validator, error.schema, error.instance
    kind = schema.get("type", "number")
    noun = "an integer" if kind == "integer" else ("a number" if kind == "number" else "a value")
    if v == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        return f"missing field {missing!r}"
    if v == "type":
        want = schema["type"]
        want = " or ".join(want) if isinstance(want, list) else want
        article = "an" if str(want)[0] in "aeiou" else "a"
        return f"expected {article} {want}, got {_describe(inst)}"
    if v == "minimum":
        return f"expected {noun} >= {schema['minimum']}, got {_describe(inst)}"
    if v == "maximum":
        return f"expected {noun} <= {schema['maximum']}, got {_describe(inst)}"
    if v == "exclusiveMinimum":
        return f"expected {noun} > {schema['exclusiveMinimum']}, got {_describe(inst)}"
    if v == "exclusiveMaximum":
        return f"expected {noun} < {schema['exclusiveMaximum']}, got {_describe(inst)}"
    if v == "enum":
        return f"expected one of {', '.join(map(str, schema['enum']))}, got {_describe(inst)}"
    if v == "const":
        return f"expected {schema['const']!r}, got {_describe(inst)}"
    if v == "additionalProperties":
        allowed = ", ".join(sorted(schema.get("properties", {})))
        extra = sorted(set(inst) - set(schema.get("properties", {})))
        return f"unknown field {', '.join(map(repr, extra))}; expected only {allowed}"
    if v in ("minItems", "maxItems"):
        bound = schema[v]
        return f"expected {'at least' if v == 'minItems' else 'at most'} {bound} item(s), got {len(inst)}"
    if v in ("minLength", "maxLength"):
        return f"expected a string of {'at least' if v == 'minLength' else 'at most'} {schema[v]} characters"
    if v == "pattern":
        return f"expected text matching {schema['pattern']}, got {_describe(inst)}"
    if v == "uniqueItems":
        return "expected unique items"
    return error.message


@lru_cache(maxsize=1)
def _registry() -> Registry:
    """Every schema of schemas/ by its $id, so schemas can refer to each other."""
    directory = schema_path("topology.schema.json").parent
    entries = []
    for path in sorted(directory.glob("*.schema.json")):
        contents = load_json_schema(path.name)
        if "$id" in contents:
            entries.append((contents["$id"], Resource.from_contents(contents)))
    return Registry().with_resources(entries)


def validate_document(data: Any, schema_name: str, source: str | None) -> None:
    """Raise InputError for the first schema violation, in document order."""
    schema = load_json_schema(schema_name)
    validator = jsonschema.Draft202012Validator(schema, registry=_registry())
    errors = list(validator.iter_errors(data))
    if not errors:
        return

    def key(e: jsonschema.ValidationError) -> tuple[Any, ...]:
        return (len(e.absolute_path) == 0 and e.validator != "required", [str(p) for p in e.absolute_path], e.validator != "required")

    error = min(errors, key=key)
    while error.context:
        # a oneOf/anyOf: a branch of the wrong type did not apply; the error of the one that did says more
        applied = [e for e in error.context if not (e.validator == "type" and not e.relative_path)]
        error = min(applied or error.context, key=key)
    field = _field_name(error.absolute_path)
    if error.validator == "required" and "'" in error.message:
        missing = error.message.split("'")[1]
        field = f"{field}.{missing}" if error.absolute_path else missing
        raise InputError(source, field, "missing; this field is required")
    raise InputError(source, field, _expected(error))
