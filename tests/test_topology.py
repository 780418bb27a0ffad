"""Topologies: coordinates, peers, the link rule of cost-model.md section 2, files and presets."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hipipe_compiler.errors import InputError
from hipipe_compiler.hardware import NETWORK
from hipipe_compiler.topology import Dimension, Topology, topology_from_document
from hipipe_compiler.presets import PRESETS, load_topology, preset

from conftest import SAMPLES, topologies, c1p


@given(topologies(max_ranks=256))
def test_rank_coordinate_bijection(topo):
    seen = set()
    for r in range(topo.nranks):
        c = topo.coords(r)
        assert all(0 <= ci < d.size for ci, d in zip(c, topo.dimensions))
        assert topo.rank(c) == r
        seen.add(c)
    assert len(seen) == topo.nranks


@given(topologies(max_ranks=128), st.data())
def test_shift_moves_one_coordinate(topo, data):
    r = data.draw(st.integers(0, topo.nranks - 1))
    d = data.draw(st.integers(0, topo.ndims - 1))
    delta = data.draw(st.integers(-9, 9))
    s = topo.shift(r, d, delta)
    cr, cs = topo.coords(r), topo.coords(s)
    n = topo.dimensions[d].size
    assert cs[d] == (cr[d] + delta) % n
    assert all(cs[j] == cr[j] for j in range(topo.ndims) if j != d)


@given(topologies(max_ranks=128), st.data())
def test_offsets_shift_one_rank_onto_another_and_mirrors_undo_them(topo, data):
    a, b = (data.draw(st.integers(0, topo.nranks - 1)) for _ in range(2))
    moved = a
    for d, delta in enumerate(topo.offset(a, b)):
        moved = topo.shift(moved, d, delta)
    assert moved == b
    assert topo.offset(a, a) == (0,) * topo.ndims
    # what rank 0 does towards b, b's mirror image does towards rank 0
    assert topo.offset(topo.mirror(b), 0) == topo.offset(0, b)
    assert topo.mirror(topo.mirror(b)) == b


@given(topologies(max_ranks=64))
def test_link_rule(topo):
    """switch: any pair whose highest differing dimension is a switch; ring: neighbours in that
    dimension alone, capacity B/2 per direction (B for a ring of two)."""
    for a in range(topo.nranks):
        for b in range(topo.nranks):
            res = topo.link_resources(a, b)
            if a == b:
                assert res is None
                continue
            ca, cb = topo.coords(a), topo.coords(b)
            d = max(j for j in range(topo.ndims) if ca[j] != cb[j])
            dim = topo.dimensions[d]
            if dim.kind == "switch":
                assert res == ((("out", a, d), dim.bandwidth), (("in", b, d), dim.bandwidth))
            else:
                only_d = all(ca[j] == cb[j] for j in range(topo.ndims) if j != d)
                neighbours = (cb[d] - ca[d]) % dim.size in (1, dim.size - 1)
                if only_d and neighbours:
                    cap = dim.bandwidth / 2 if dim.size >= 3 else dim.bandwidth
                    assert res == ((("link", a, b), cap),)
                else:
                    assert res is None


def test_link_rule_examples():
    torus = preset("torus-4x4")
    assert torus.has_link(0, 1) and torus.has_link(0, 3) and torus.has_link(0, 4)
    assert not torus.has_link(0, 2)  # two hops along x
    assert not torus.has_link(0, 5)  # diagonal
    dgx = c1p(4)
    assert dgx.has_link(0, 13)  # rail-connected fabric reaches any rank of another node
    assert dgx.link_latency(0, 13) == 14.0 and dgx.link_latency(0, 7) == 3.4  # Simple, NCCL's estimates
    assert dgx.link_latency(0, 13, "LL") == 2.7 and dgx.link_latency(0, 7, "LL128") == 1.9


@given(topologies(max_ranks=256))
def test_ring_order_is_a_legal_cycle_through_every_rank(topo):
    order = topo.ring_order()
    assert sorted(order) == list(range(topo.nranks))
    for a, b in zip(order, order[1:] + order[:1]):
        assert topo.has_link(a, b), (a, b)


@given(topologies(max_ranks=128), st.data())
def test_peers_and_groups(topo, data):
    r = data.draw(st.integers(0, topo.nranks - 1))
    for d, dim in enumerate(topo.dimensions):
        group = topo.group(r, d)
        assert len(group) == dim.size and r in group
        assert [topo.coord(x, d) for x in group] == list(range(dim.size))
        for p in topo.peers(r, d):
            assert topo.has_link(r, p)


def test_samples_and_presets_load():
    for path in sorted(SAMPLES.iterdir()):
        topo = load_topology(path)
        assert topo.nranks >= 2 and topo.name
    for name, topo in PRESETS.items():
        assert load_topology(name) == topo
    assert preset("pod-8x4x8x4").nranks == 1024


def test_json_and_yaml_give_the_same_topology(tmp_path):
    doc = preset("torus-4x4x4").to_document()
    (tmp_path / "t.json").write_text(json.dumps(doc))
    import yaml
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(doc))
    assert load_topology(tmp_path / "t.json") == load_topology(tmp_path / "t.yaml") == preset("torus-4x4x4")


BAD = [
    ("dimensions:\n  - {size: 8, kind: switch, bandwidth: -5, latency: 1}\n", "dimensions[0].bandwidth", ">= 0.001"),
    ("dimensions:\n  - {size: 8, kind: switch, bandwidth: 0, latency: 1}\n", "dimensions[0].bandwidth", ">= 0.001"),
    ("dimensions:\n  - {size: 8, kind: switch, bandwidth: 1.0e-100, latency: 1}\n", "dimensions[0].bandwidth", ">= 0.001"),
    ("dimensions:\n  - {size: 8, kind: switch, bandwidth: 2.0e+6, latency: 1}\n", "dimensions[0].bandwidth", "<= 1000000"),
    ("dimensions:\n  - {size: 8, kind: switch, bandwidth: 5, latency: 1.0e+12}\n", "dimensions[0].latency", "<= 1000000"),
    ("dimensions:\n  - {size: 8, kind: switch, bandwidth: 5, latency: {LL: 1, LL128: 2, Simple: 1.0e+308}}\n",
     "dimensions[0].latency.Simple", "<= 1000000"),
    ("dimensions:\n  - {size: 1, kind: ring, bandwidth: 5, latency: 1}\n", "dimensions[0].size", ">= 2"),
    ("dimensions:\n  - {size: 4, kind: torus, bandwidth: 5, latency: 1}\n", "dimensions[0].kind", "ring, switch"),
    ("dimensions:\n  - {size: 4, kind: ring, bandwidth: 5}\n", "dimensions[0].latency", "missing"),
    ("dimensions:\n  - {size: 4, kind: ring, bandwidth: 5, latency: -1}\n", "dimensions[0].latency", ">= 0"),
    ("dimensions:\n  - {size: four, kind: ring, bandwidth: 5, latency: 1}\n", "dimensions[0].size", "integer"),
    ("dimensions:\n  - {size: 4, kind: ring, bandwidth: 5, latency: 1, speed: 3}\n", "dimensions[0]", "unknown field"),
    ("dimensions: []\n", "dimensions", "at least 1"),
    ("name: x\n", "dimensions", "missing"),
    ("dimensions:\n  - {size: 4, kind: ring\n", None, "malformed YAML"),
    ("- just\n- a list\n", "(top level)", "object"),
]


@pytest.mark.parametrize("text,field,expect", BAD)
def test_bad_topology_files_name_file_field_and_expectation(tmp_path, text, field, expect):
    path = tmp_path / "topo.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_topology(path)
    message = str(info.value)
    assert message.startswith(str(path))
    if field:
        assert field in message
    assert expect in message
    assert "\n" not in message


def test_unknown_preset_and_missing_file():
    with pytest.raises(InputError, match="preset"):
        load_topology("no-such-preset")
    with pytest.raises(InputError, match="cannot read"):
        load_topology("/nonexistent/topo.yaml")


def test_dimension_rejects_bad_values_directly():
    with pytest.raises(InputError):
        Dimension(1, "ring", 1.0, 1.0)
    with pytest.raises(InputError):
        Dimension(4, "ring", float("nan"), 1.0)
    with pytest.raises(InputError, match="from 0.001 to 1e"):
        Dimension(4, "ring", 1e-100, 1.0)
    with pytest.raises(InputError, match="from 0 to 1e"):
        Dimension(4, "ring", 1.0, 1e12)
    with pytest.raises(InputError):
        Topology(())


def test_latency_per_protocol_reads_and_writes_back(tmp_path):
    path = tmp_path / "c1p.yaml"
    path.write_text("dimensions:\n"
                    "  - {name: nvlink, size: 8, kind: switch, bandwidth: 300, latency: {LL: 0.6, LL128: 1.9, Simple: 3.4}}\n"
                    "  - {name: ib, size: 4, kind: switch, bandwidth: 50, latency: 5}\n")
    topo = load_topology(path)
    assert [d.alpha("LL") for d in topo.dimensions] == [0.6, 5]
    assert [d.alpha("Simple") for d in topo.dimensions] == [3.4, 5]
    assert topo.dimensions[0].min_alpha == 0.6 and topo.dimensions[0].per_protocol and not topo.dimensions[1].per_protocol
    again = topology_from_document(topo.to_document())
    assert again == topo and hash(again) == hash(topo)


@pytest.mark.parametrize("latency,field,words", [
    ("{LL: 0.6, Simple: 3.4}", "dimensions[0].latency.LL128", "missing"),
    ("{LL: 0.6, LL128: 1.9, Simple: 3.4, Fast: 0.1}", "dimensions[0].latency", "unknown field 'Fast'"),
    ("{LL: -1, LL128: 1.9, Simple: 3.4}", "dimensions[0].latency.LL", ">= 0"),
    ("{LL: .nan, LL128: 1.9, Simple: 3.4}", "dimensions[0].latency.LL", "from 0 to"),
    (".nan", "dimensions[0].latency", "from 0 to"),
    ("fast", "dimensions[0].latency", "number"),
])
def test_bad_latencies_name_the_field(tmp_path, latency, field, words):
    path = tmp_path / "bad.yaml"
    path.write_text(f"dimensions:\n  - {{size: 8, kind: switch, bandwidth: 300, latency: {latency}}}\n")
    with pytest.raises(InputError) as exc:
        load_topology(path)
    assert exc.value.field == field and words in exc.value.message, str(exc.value)


def test_presets_of_real_machines_carry_nccls_latencies():
    for name in ("dgx-h100-8x4", "dgx-h100-8x16", "pod-8x4x8x4"):
        assert all(d.per_protocol for d in preset(name).dimensions), name
    assert c1p(4).dimensions[1].latency == NETWORK
    for name in ("torus-4x4", "torus-4x4x4", "ring-fc-switch-2x8x4"):  # the scalar grid's shapes stay scalar
        assert not any(d.per_protocol for d in preset(name).dimensions), name


def test_the_cost_models_new_fields_read_and_write_back(tmp_path):
    text = """name: m
gpu: H100
cpu: amd
call_latency: {LL: 6.6, LL128: 14, Simple: 8.4}
nccl_channel_scale: 0.9
dimensions:
  - {name: nvlink, size: 8, kind: switch, bandwidth: 360, rated_bandwidth: 370.8, link: nvlink, nvls: {efficiency: 0.85, call_latency: 10}}
  - {name: ib, size: 2, kind: switch, bandwidth: 50, link: network, latency: 5}
"""
    path = tmp_path / "m.yaml"
    path.write_text(text)
    topo = load_topology(path)
    nvlink, ib = topo.dimensions
    assert (topo.call_cost("LL"), topo.call_cost("Simple"), topo.gpu, topo.cpu, topo.nccl_channel_scale) == (6.6, 8.4, "H100", "amd", 0.9)
    assert nvlink.alpha("LL128") == 1.9 and nvlink.rating == 370.8 and ib.rating == 50  # the link's defaults
    assert ib.alpha("LL") == 5  # a latency given wins over the link type's
    assert (nvlink.nvls.efficiency, nvlink.nvls.call_latency, topo.nvls_dimensions) == (0.85, 10, (0,))
    again = tmp_path / "again.json"
    again.write_text(json.dumps(topo.to_document()))
    assert load_topology(again) == topo
    assert Topology((Dimension(4, "ring", 10, 1.0),)).call_cost("LL") == 0.0  # no call_latency: calls cost nothing more


@pytest.mark.parametrize("dimension,top,field,words", [
    ('{size: 8, kind: switch, bandwidth: 3}', "", "dimensions[0].latency", "missing"),
    ('{size: 8, kind: ring, bandwidth: 3, link: nvlink, nvls: {efficiency: 0.8}}', "", "dimensions[0].nvls", "switch"),
    ('{size: 8, kind: switch, bandwidth: 3, link: nvlink, nvls: {efficiency: 1.5}}', "", "efficiency", "<= 1"),
    ('{size: 8, kind: switch, bandwidth: 3, link: infiniband}', "", "link", "nvlink"),
    ('{size: 8, kind: switch, bandwidth: 3, link: nvlink}', "gpu: Z80\n", "gpu", "GPU model"),
    ('{size: 8, kind: switch, bandwidth: 3, link: nvlink}', "cpu: risc\n", "cpu", "intel"),
    ('{size: 8, kind: switch, bandwidth: 3, link: nvlink}', "call_latency: {LL: 1}\n", "call_latency", "LL128"),
    ('{size: 8, kind: switch, bandwidth: 3, link: nvlink}', "nccl_channel_scale: 0\n", "nccl_channel_scale", "0.01"),
])
def test_bad_new_fields_name_the_field(tmp_path, dimension, top, field, words):
    path = tmp_path / "t.yaml"
    path.write_text(f"{top}dimensions:\n  - {dimension}\n")
    with pytest.raises(InputError) as err:
        load_topology(path)
    assert str(err.value).startswith(str(path)) and field in str(err.value) and words in str(err.value)


def test_a_machine_keeps_its_node_shape_with_other_node_counts():
    topo = Topology((Dimension(8, "switch", 370.8, link="nvlink"), Dimension(2, "switch", 50, link="network")), name="x")
    assert topo.with_outer_size(64).shape == (8, 64) and topo.with_outer_size(1).shape == (8,)
