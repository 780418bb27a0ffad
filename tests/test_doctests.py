"""Every usage example in a docstring of the package runs as written."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil

import pytest

import hipipe_compiler

MODULES = sorted(m.name for m in pkgutil.walk_packages(hipipe_compiler.__path__, "hipipe_compiler.")
                 if m.name != "hipipe_compiler.__main__")


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    if name.startswith("hipipe_compiler.torch") and importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed: pip install '.[torch]' (CPU build: torch==2.13.0+cpu)")
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring example(s) of {name} failed"
