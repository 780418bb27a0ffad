"""Profiles and costs the training tests share."""

from __future__ import annotations

import pytest

from hipipe_compiler.training import AlphaBetaCost, LayerProfile
from hipipe_compiler.training.commcost import COLLECTIVES
from hipipe_compiler.training.profiles import profile_from_document, shared_data_path


def make_profile(layers, dtype_bytes: int = 4, name: str = "p") -> LayerProfile:
    """layers: (params, fwd_ms, bwd_ms) or (params, fwd_ms, bwd_ms, ready_after)."""
    doc = {"model": name, "dtype_bytes": dtype_bytes, "layers": []}
    for i, spec in enumerate(layers):
        layer = {"name": f"l{i}", "params": spec[0], "fwd_ms": spec[1], "bwd_ms": spec[2]}
        if len(spec) > 3 and spec[3] is not None:
            layer["ready_after"] = f"l{spec[3]}"
        doc["layers"].append(layer)
    return profile_from_document(doc, f"{name}.yaml")


def zero_cost() -> AlphaBetaCost:
    return AlphaBetaCost({c: 0.0 for c in COLLECTIVES}, {c: 0.0 for c in COLLECTIVES})


def needs_shared_data() -> None:
    if not shared_data_path().is_file():
        pytest.skip(f"built-in profiles need {shared_data_path()} (the shared data checkout), which is absent")


def one_ms_cost(latency_ms: float) -> AlphaBetaCost:
    """Every collective on 1 MB takes 1 ms, `latency_ms` of it startup."""
    return AlphaBetaCost({c: latency_ms * 1000 for c in COLLECTIVES},
                         {c: (1 - latency_ms) * 1000 / 1e6 for c in COLLECTIVES})
