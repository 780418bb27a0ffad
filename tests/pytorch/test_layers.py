"""hipipe_compiler.torch.layers: a module's layers as the planner sees them, and a measured
layer profile that `hipipe plan --profile` plans for."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: pip install '.[torch]' (CPU build: torch==2.13.0+cpu)")

from hipipe_compiler.documents import validate_document  # noqa: E402
from hipipe_compiler.errors import InputError  # noqa: E402
from hipipe_compiler.torch import layer_profile  # noqa: E402
from hipipe_compiler.torch.layers import layer_params, model_layers  # noqa: E402

from conftest import run_hipipe  # noqa: E402


def transformer() -> torch.nn.Module:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=24, dropout=0.0, batch_first=True)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                               torch.nn.Linear(16, 5))


def test_layers_run_forward_and_own_what_runs_inside_them():
    model, x = transformer(), torch.randn(3, 7, 6)
    names = model_layers(model, x)
    assert names[0] == "0" and names[-1] == "2"
    attention = "1.layers.0.self_attn"
    assert attention in names and f"{attention}.out_proj" not in names  # its weights are used, it is never called
    owned = layer_params(model, names)
    assert [n for n, _p in owned[attention]] == [f"{attention}.in_proj_weight", f"{attention}.in_proj_bias",
                                                 f"{attention}.out_proj.weight", f"{attention}.out_proj.bias"]
    assert sum(p.numel() for ps in owned.values() for _n, p in ps) == sum(p.numel() for p in model.parameters())
    assert None not in owned  # every parameter is in a layer


def test_a_profile_validates_and_the_planner_plans_for_it(tmp_path):
    model, x = transformer(), torch.randn(3, 7, 6)
    doc = layer_profile(model, x, iterations=2, model="tiny-transformer")
    validate_document(doc, "layer-profile.schema.json", "profile")
    assert doc["model"] == "tiny-transformer" and doc["batch_size"] == 3 and "measured" in doc["provenance"]
    assert sum(layer["params"] for layer in doc["layers"]) == sum(p.numel() for p in model.parameters())
    assert all(layer["fwd_ms"] >= 0 and layer["bwd_ms"] >= 0 for layer in doc["layers"])
    assert sum(layer["fwd_ms"] for layer in doc["layers"]) > 0
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(doc))
    topo = tmp_path / "t4.json"
    topo.write_text(json.dumps({"name": "t4", "dimensions": [
        {"name": "a", "size": 2, "kind": "switch", "bandwidth": 100, "latency": 1.0},
        {"name": "b", "size": 2, "kind": "switch", "bandwidth": 50, "latency": 2.0}]}))
    done = run_hipipe("plan", "--profile", path, "--topo", topo, "--algo", "hierarchical", "-o", tmp_path / "plan")
    assert done.returncode == 0, done.stderr
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert {layer for b in plan["buckets"] for layer in b["layers"]} == {layer["name"] for layer in doc["layers"]}


def test_the_roots_own_parameters_make_a_layer_and_iterations_are_checked():
    class Idle(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = torch.nn.Linear(3, 3)
            self.spare = torch.nn.Parameter(torch.zeros(2))

        def forward(self, x):
            return self.used(x)

    # the root always runs, so a parameter of the root itself belongs to the root's layer
    assert model_layers(Idle(), torch.randn(1, 3)) == ["", "used"]
    with pytest.raises(InputError, match="iterations: expected an integer >= 1"):
        layer_profile(Idle(), torch.randn(1, 3), iterations=0)
