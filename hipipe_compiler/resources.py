"""Where the JSON schemas and the XSD live, whether installed or run from a checkout."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any


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
