"""Layer profiles: built-in data, derived times, user files and the errors bad files get."""

from __future__ import annotations

import doctest
import json
import math
from pathlib import Path

import pytest
import yaml

import hipipe_compiler.training.profiles as profiles_module
from hipipe_compiler.errors import InputError
from hipipe_compiler.training import load_profile
from hipipe_compiler.training.profiles import (
    A100_AMP, BUILTIN_PROFILES, DeviceModel, builtin_profile, derive_times, profile_document, profile_from_document,
    shared_data_path,
)

from training_helpers import needs_shared_data

#: Layers and parameters of the built-ins (data/README.md "Sizes"), counted from the architectures.
SIZES = {"vgg16": (16, 138_357_544), "resnet50": (107, 25_557_032), "densenet201": (402, 20_013_928),
         "bert_base": (105, 110_111_042), "gpt2": (75, 124_439_808)}


def raw_entry(name: str) -> dict:
    return json.loads(shared_data_path().read_text())["models"][name]


def write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc) if path.suffix == ".json" else yaml.safe_dump(doc))
    return path


def tiny_doc(**overrides) -> dict:
    doc = {"model": "tiny", "dtype_bytes": 4, "layers": [
        {"name": "embed", "params": 100, "fwd_ms": 0.5, "bwd_ms": 1.0, "tensors": [["embed.weight", 100]]},
        {"name": "fc", "params": 30, "fwd_ms": 0.25, "bwd_ms": 2.0, "tensors": [["fc.weight", 20], ["fc.bias", 10]]},
        {"name": "head", "params": 8, "fwd_ms": 0.125, "bwd_ms": 0.5}]}
    doc.update(overrides)
    return doc


def raises_input_error(fn, *args, **kwargs) -> InputError:
    with pytest.raises(InputError) as info:
        fn(*args, **kwargs)
    assert "\n" not in str(info.value)
    return info.value


# -- built-in profiles --------------------------------------------------------------------


@pytest.mark.parametrize("name", BUILTIN_PROFILES)
def test_builtin_sizes_match_the_architectures(name):
    needs_shared_data()
    profile = builtin_profile(name)
    assert (profile.nlayers, profile.params) == SIZES[name]
    assert profile.nbytes == 4 * SIZES[name][1]
    assert all(layer.fwd_ms > 0 and layer.bwd_ms > 0 for layer in profile.layers)
    assert profile.notes and any("synthetic" in note for note in profile.notes)


def test_resnet50_forward_is_derived_from_macs_and_backward_kept_as_measured():
    needs_shared_data()
    raw, profile = raw_entry("resnet50"), builtin_profile("resnet50")
    for layer, entry in zip(profile.layers, raw["layers"]):
        expected = max(2 * entry["fwd_macs"] * 64 / (60.0 * 1e9), A100_AMP.layer_floor_ms)
        assert layer.fwd_ms == pytest.approx(expected, rel=1e-12)
        assert layer.bwd_ms == entry["bwd_ms"]
    # 4.09 GMACs per image, batch 64, 60 TFLOP/s: about 8.7 ms plus the BatchNorm floors
    assert 8.7 < profile.fwd_ms < 9.1
    assert profile.bwd_ms == pytest.approx(253.277, abs=1e-3)
    assert any("fwd_ms derived from MACs at 60 TFLOP/s" in note and "synthetic" in note for note in profile.notes)
    assert any("bwd_ms kept as measured" in note for note in profile.notes)


def test_derived_times_scale_with_the_device():
    needs_shared_data()
    slow = builtin_profile("vgg16", DeviceModel("slow", 30.0, 64, layer_floor_ms=0.0))
    fast = builtin_profile("vgg16", DeviceModel("fast", 60.0, 64, layer_floor_ms=0.0))
    half_batch = builtin_profile("vgg16", DeviceModel("fast", 60.0, 32, layer_floor_ms=0.0))
    assert slow.fwd_ms == pytest.approx(2 * fast.fwd_ms, rel=1e-9)
    assert half_batch.fwd_ms == pytest.approx(fast.fwd_ms / 2, rel=1e-9)
    assert slow.bwd_ms == fast.bwd_ms  # measured, kept


def test_keep_measured_false_derives_backward_from_the_same_device():
    needs_shared_data()
    profile = builtin_profile("resnet50", keep_measured=False)
    assert profile.bwd_ms == pytest.approx(2 * profile.fwd_ms, rel=1e-9)
    assert any("--derive-all" in note for note in profile.notes)


def test_gpt2_tied_embedding_is_ready_last_and_its_head_runs_at_the_ends():
    needs_shared_data()
    profile = builtin_profile("gpt2")
    wte = profile.layers[0]
    assert wte.name == "transformer.wte" and wte.ready_after == "transformer.wte"
    ready = profile.grad_ready_ms
    assert ready[0] == pytest.approx(profile.bwd_ms) and ready[0] == ready.max()
    head_fwd = 2 * 39_523_713_024 * 64 / 60e9  # LM head: 39.5 GMACs per 1024-token sequence
    assert profile.layers[-1].fwd_ms == pytest.approx(head_fwd + A100_AMP.layer_floor_ms, rel=1e-9)
    assert profile.layers[-1].bwd_ms == pytest.approx(2 * profile.layers[-1].fwd_ms, rel=1e-9)
    assert wte.fwd_ms == A100_AMP.layer_floor_ms
    assert profile.bwd_ms == pytest.approx(2 * profile.fwd_ms, rel=1e-9)
    assert profile.fwd_ms == pytest.approx(2 * 145.824e9 * 64 / 60e9, rel=1e-3)
    assert any("tied layer(s) transformer.wte" in note for note in profile.notes)


def test_bert_backward_is_derived_and_forward_no_longer_implausible():
    needs_shared_data()
    profile = builtin_profile("bert_base")
    assert raw_entry("bert_base")["totals"]["fwd_ms"] == 0.2
    flops_only = 2 * 14.2507392e9 * 64 / 60e9  # 14.25 GMACs per 128-token sequence
    assert flops_only <= profile.fwd_ms <= flops_only + profile.nlayers * A100_AMP.layer_floor_ms
    assert any("backward times are 'synthetic" in note for note in profile.notes)
    assert profile.layers[0].ready_after == profile.layers[0].name


def test_densenet_forward_is_half_its_measured_backward():
    needs_shared_data()
    raw, profile = raw_entry("densenet201"), builtin_profile("densenet201")
    assert "fwd_macs" not in raw["layers"][0]
    for layer, entry in zip(profile.layers, raw["layers"]):
        assert layer.bwd_ms == entry["bwd_ms"]
        assert layer.fwd_ms == pytest.approx(entry["bwd_ms"] / 2)
    assert any("bwd_ms / 2" in note and "no fwd_macs" in note for note in profile.notes)


def test_grad_ready_is_the_reverse_cumulative_backward():
    needs_shared_data()
    profile = builtin_profile("vgg16")
    bwd = [layer.bwd_ms for layer in profile.layers]
    assert profile.grad_ready_ms[-1] == pytest.approx(bwd[-1])
    assert profile.grad_ready_ms[5] == pytest.approx(sum(bwd[5:]))


def test_shared_dir_override_and_its_absence(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    write(tmp_path / "data" / "layer-profiles.json", {"models": {"resnet50": tiny_doc()}})
    monkeypatch.setenv("HIPIPE_SHARED_DIR", str(tmp_path))
    assert shared_data_path() == tmp_path / "data" / "layer-profiles.json"
    profile = load_profile("resnet50")
    assert (profile.name, profile.nlayers, profile.params) == ("resnet50", 3, 138)
    monkeypatch.setenv("HIPIPE_SHARED_DIR", str(tmp_path / "nowhere"))
    err = raises_input_error(load_profile, "gpt2")
    assert err.source.endswith("layer-profiles.json") and "HIPIPE_SHARED_DIR" in err.message


# -- user files ---------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_user_file_round_trip(tmp_path, suffix):
    path = write(tmp_path / f"net{suffix}", tiny_doc())
    profile = load_profile(path)
    assert profile.name == "tiny" and profile.nlayers == 3 and profile.params == 138
    assert profile.compute_ms == pytest.approx(0.875 + 3.5)
    assert profile.grad_ready_ms.tolist() == [3.5, 2.5, 0.5]
    assert profile.notes == ()  # nothing synthetic, nothing derived
    again = load_profile(write(tmp_path / f"again{suffix}", profile_document(profile)))
    assert again.layers == profile.layers


def test_user_file_with_synthetic_times_gets_them_derived(tmp_path):
    doc = tiny_doc(time_source={"fwd": "synthetic: guessed", "bwd": "measured"}, batch_size=8)
    for layer, macs in zip(doc["layers"], (0, 3_000_000_000, 1_000_000)):
        layer["fwd_macs"] = macs
    profile = load_profile(write(tmp_path / "p.yaml", doc))
    assert profile.layers[1].fwd_ms == pytest.approx(2 * 3e9 * 8 / 60e9)
    assert profile.layers[0].fwd_ms == A100_AMP.layer_floor_ms
    assert [layer.bwd_ms for layer in profile.layers] == [1.0, 2.0, 0.5]
    assert "batch 8" in profile.fwd_source


def test_ready_after_holds_a_tied_layer_until_that_layer(tmp_path):
    doc = tiny_doc()
    doc["layers"][2]["ready_after"] = "embed"
    profile = load_profile(write(tmp_path / "tied.yaml", doc))
    assert profile.grad_ready_ms.tolist() == [3.5, 2.5, 3.5]


def test_derive_is_identity_without_synthetic_times():
    profile = profile_from_document(tiny_doc(), "t.yaml")
    assert derive_times(profile) is profile


@pytest.mark.parametrize("mutate, field, words", [
    (lambda d: d["layers"][1].update(bwd_ms=-1.0), "layers[1].bwd_ms", ">= 0"),
    (lambda d: d["layers"][0].update(fwd_ms=-0.5), "layers[0].fwd_ms", ">= 0"),
    (lambda d: d.update(layers=[]), "layers", "at least 1"),
    (lambda d: d["layers"][1].update(params=31), "layers[1].params", "sum of the layer's tensors (30)"),
    (lambda d: d["layers"][1].update(params=0, tensors=[]), "layers[1].params", ">= 1"),
    (lambda d: d["layers"][2].update(name="fc"), "layers[2].name", "unique"),
    (lambda d: d["layers"][2].update(ready_after="nope"), "layers[2].ready_after", "name of a layer"),
    (lambda d: d.pop("dtype_bytes"), "dtype_bytes", "required"),
    (lambda d: d.update(dtype_bytes=3), "dtype_bytes", "one of 1, 2, 4, 8"),
    (lambda d: d["layers"][0].update(bwd_sm=1.0), "layers[0]", "unknown field 'bwd_sm'"),
    (lambda d: d.update(totals={"params": 139}), "totals.params", "sum over layers (138)"),
    (lambda d: d.update(totals={"bwd_ms": 9.0}), "totals.bwd_ms", "sum over layers"),
    (lambda d: d["layers"][0].update(bwd_ms=float("nan")), "layers[0].bwd_ms", "from 0 to 8.64e+07 ms"),
    (lambda d: d["layers"][0].update(fwd_ms=1e308), "layers[0].fwd_ms", "from 0 to 8.64e+07 ms"),
    (lambda d: d["layers"][1].update(params=10**18, tensors=[]), "layers", "at most 1TiB of gradients"),
])
def test_bad_profiles_name_file_and_field(tmp_path, mutate, field, words):
    doc = tiny_doc()
    mutate(doc)
    path = write(tmp_path / "bad.yaml", doc)
    err = raises_input_error(load_profile, path)
    assert err.source == str(path) and err.field == field and words in err.message
    assert str(err).startswith(f"{path}: {field}: ")


def test_unknown_model_name():
    err = raises_input_error(load_profile, "resnet51")
    assert err.field == "model" and err.source == "resnet51"
    assert "vgg16, resnet50, densenet201, bert_base, gpt2" in err.message


def test_missing_and_malformed_files(tmp_path):
    assert "cannot read" in raises_input_error(load_profile, tmp_path / "absent.yaml").message
    (tmp_path / "broken.json").write_text("{\"layers\": [")
    assert "malformed JSON" in raises_input_error(load_profile, tmp_path / "broken.json").message


def test_device_model_rejects_nonsense():
    assert raises_input_error(DeviceModel, "x", 0.0, 64).field == "tflops"
    assert raises_input_error(DeviceModel, "x", 10.0, 0).field == "batch_size"
    assert not math.isnan(A100_AMP.tflops)


def test_docstring_examples():
    assert doctest.testmod(profiles_module, optionflags=doctest.ELLIPSIS).failed == 0


def test_an_editable_install_finds_the_shared_data_from_any_directory(tmp_path, monkeypatch):
    checkout = Path(profiles_module.__file__).resolve().parents[2]
    beside = checkout.parent / "shared" / "data" / "layer-profiles.json"
    if not (checkout / "pyproject.toml").is_file() or not beside.is_file():
        pytest.skip("needs an editable install with ../shared beside the checkout")
    monkeypatch.delenv(profiles_module.SHARED_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert profiles_module.shared_data_path() == beside
