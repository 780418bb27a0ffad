"""hipipe_compiler.torch.planned run for real: gloo process groups of 2 and 4 CPU processes
train three small models under every policy's plan with SGD (momentum) and Adam, against plain
DDP; the trace follows the plan; the optimizer state is sharded; checkpoints round-trip; bad
plans are refused before anything changes."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import pytest

from hipipe_compiler.errors import InputError
from hipipe_compiler.topology import Dimension, Topology
from hipipe_compiler.training import SimulatedCost, plan_training
from hipipe_compiler.training.planner import plan_document
from hipipe_compiler.training.profiles import profile_from_document

from gloo import require_gloo

torch, dist, mp = require_gloo()
#: one worker runs this module, so its process groups and compiled fixtures are made once
pytestmark = pytest.mark.xdist_group("planned")

STEPS = 4
RTOL = 1e-5


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(12, 37), torch.nn.Tanh(), torch.nn.Linear(37, 30), torch.nn.Tanh(),
                                       torch.nn.Linear(30, 5))

    def forward(self, x):
        return self.net(x)

    @staticmethod
    def batch(gen):
        return torch.randn(8, 12, generator=gen), torch.randn(8, 5, generator=gen)


class Cnn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3)
        self.conv2 = torch.nn.Conv2d(8, 12, 3)
        self.head = torch.nn.Linear(12, 5)

    def forward(self, x):
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.head(x.mean(dim=(2, 3)))

    @staticmethod
    def batch(gen):
        return torch.randn(4, 3, 10, 10, generator=gen), torch.randn(4, 5, generator=gen)


class Transformer(torch.nn.Module):
    """Two encoder layers: their attention's output projection runs inside the attention."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(6, 16)
        layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=24, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x)).mean(dim=1))

    @staticmethod
    def batch(gen):
        return torch.randn(4, 7, 6, generator=gen), torch.randn(4, 5, generator=gen)


MODELS = {"mlp": Mlp, "cnn": Cnn, "transformer": Transformer}
#: Adam's eps is raised from 1e-8: Adam divides each gradient by its own magnitude, so on a
#: gradient that is zero in exact arithmetic (the attention's key bias) it turns rounding noise
#: into full-size steps, and four ranks' sums in another order give other noise than DDP's.
OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01, eps=1e-4),
}


def fresh(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return MODELS[name]()


def topology(world: int) -> Topology:
    return Topology(tuple(Dimension(2, "switch", 100, 1.0, name=f"d{i}") for i in range(world.bit_length() - 1)),
                    name=f"t{world}")


def plans_for(world: int) -> dict[str, dict[str, dict]]:
    """Every policy's plan.json dict for each model, from the model's measured layer profile."""
    from hipipe_compiler.torch import layer_profile
    cost = SimulatedCost(topology(world), "hierarchical")
    out = {}
    for name, cls in MODELS.items():
        x, _y = cls.batch(torch.Generator().manual_seed(0))
        profile = profile_from_document(layer_profile(fresh(name), x, iterations=1), name)
        report = plan_training(profile, cost, world)
        out[name] = {policy: plan_document(report, policy) for policy in report.policies}
    return out


def deferred_plan(doc: dict) -> dict:
    """A DeAR-style plan of the same buckets: every all-gather in the next forward, one
    bucket ahead, so that some are still pending after the step."""
    doc = copy.deepcopy(doc)
    rs = [o for o in doc["ops"] if o["op"] in ("RS", "AR")]
    ops, seq_of = [], {}
    for o in rs:
        seq_of[o["bucket"]] = len(ops)
        ops.append({**o, "seq": len(ops), "op": "RS", "lane": 0, "phase": "backward", "after": [{"grad_ready": o["bucket"]}]})
    order = sorted(seq_of, key=lambda b: -b)  # the forward reaches the last bucket's layers first
    waits: dict[str, list] = {}
    for j, b in enumerate(order):
        after = [{"op_done": seq_of[b]}, {"op_done": len(rs) - 1}]
        if j >= 1:
            after.append({"forward_start": doc["buckets"][order[j - 1]]["layers"][0]})
        waits[doc["buckets"][b]["layers"][0]] = [{"op_done": len(ops)}]
        ops.append({**rs[seq_of[b]], "seq": len(ops), "op": "AG", "lane": 1, "phase": "forward", "after": after,
                    "program": rs[seq_of[b]]["program"].replace("reducescatter", "allgather")})
    for b in doc["buckets"]:
        b["primitive"] = "rs+ag"
    doc.update(ops=ops, forward_waits=waits, policy="deferred")
    return doc


def _train(model, step, batches) -> None:
    for x, y in batches:
        torch.nn.functional.mse_loss(model(x), y).backward()
        step()


def _state_numel(optimizer) -> int:
    return sum(v.numel() for entry in optimizer.state.values() for k, v in entry.items()
               if isinstance(v, torch.Tensor) and k != "step")


def _worker(rank: int, world: int, rendezvous: str, plans: dict, out: str) -> None:
    from torch.nn.parallel import DistributedDataParallel

    from hipipe_compiler.torch import PlannedDataParallel

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    results: dict = {"match": {}, "trace": {}, "memory": {}, "pending": None, "checkpoint": None}
    try:
        for name, cls in MODELS.items():
            gen = torch.Generator().manual_seed(100 + rank)
            batches = [cls.batch(gen) for _ in range(STEPS)]
            for opt_name, factory in OPTIMIZERS.items():
                ref = DistributedDataParallel(fresh(name))
                ref_opt = factory(ref.parameters())
                _train(ref, lambda: (ref_opt.step(), ref_opt.zero_grad()), batches)
                for policy, plan in plans[name].items():
                    pdp = PlannedDataParallel(fresh(name), plan, factory, trace=True)
                    _train(pdp, lambda: (pdp.step(), pdp.zero_grad()), batches)
                    full = pdp.full_parameters()
                    worst = max(float(((full[n] - p.detach()).abs() / (p.detach().abs() + 1e-6)).max())
                                for n, p in ref.module.named_parameters())
                    results["match"][(name, opt_name, policy)] = (
                        all(torch.allclose(full[n], p, rtol=RTOL, atol=1e-6) for n, p in ref.module.named_parameters()), worst)
                    if opt_name == "adam":
                        results["memory"][(name, policy)] = (_state_numel(pdp.optimizer), _state_numel(ref_opt),
                                                             sum(b.length for b in pdp.buckets))
                    if opt_name == "sgd" and name == "transformer":
                        # one more iteration, traced from its backward to the end of the next forward
                        pdp.trace.clear()
                        x, y = batches[0]
                        torch.nn.functional.mse_loss(pdp(x), y).backward()
                        pdp.step()
                        pdp.zero_grad()
                        pdp(x)
                        results["trace"][policy] = list(pdp.trace)
        # all-gathers still pending between a step and the next forward
        plan = deferred_plan(plans["mlp"]["pipedap"])
        batches = [Mlp.batch(torch.Generator().manual_seed(7 + rank)) for _ in range(3)]
        pdp = PlannedDataParallel(fresh("mlp"), plan, OPTIMIZERS["adam"], trace=True)
        ref = DistributedDataParallel(fresh("mlp"))
        ref_opt = OPTIMIZERS["adam"](ref.parameters())
        _train(ref, lambda: (ref_opt.step(), ref_opt.zero_grad()), batches)
        _train(pdp, lambda: (pdp.step(), pdp.zero_grad()), batches)
        pending = sum(1 for o in plan["ops"] if o["seq"] >= pdp._cursor)
        full = pdp.full_parameters()
        results["pending"] = (pending, all(torch.allclose(full[n], p, rtol=RTOL, atol=1e-6)
                                           for n, p in ref.module.named_parameters()))
        # checkpoints: save mid-training, continue; a fresh runtime loaded from it continues alike
        results["checkpoint"] = {}
        for gather in (True, False):
            plan = plans["cnn"]["hipipe"]
            batches = [Cnn.batch(torch.Generator().manual_seed(11 + rank)) for _ in range(4)]
            a = PlannedDataParallel(fresh("cnn"), plan, OPTIMIZERS["adam"])
            _train(a, lambda: (a.step(), a.zero_grad()), batches[:2])
            ckpt = a.checkpoint(gather_optimizer=gather)
            _train(a, lambda: (a.step(), a.zero_grad()), batches[2:])
            b = PlannedDataParallel(fresh("cnn"), plan, OPTIMIZERS["adam"])
            b.load_checkpoint(ckpt)
            _train(b, lambda: (b.step(), b.zero_grad()), batches[2:])
            fa, fb = a.full_parameters(), b.full_parameters()
            results["checkpoint"][gather] = all(torch.allclose(fa[n], fb[n], rtol=RTOL, atol=1e-7) for n in fa)
        if rank == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()


#: Each world size's run, kept for the module's life: a run takes minutes, and pytest makes a
#: module fixture again whenever the tests that use it do not run back to back.
RUNS: dict[int, tuple] = {}


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def run(request):
    world = request.param
    if world not in RUNS:
        plans = plans_for(world)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "results.pt"
            mp.spawn(_worker, args=(world, str(Path(tmp) / "rendezvous"), plans, str(out)), nprocs=world)
            RUNS[world] = (world, plans, torch.load(out, weights_only=False))
    return RUNS[world]


def test_every_policy_trains_like_ddp(run):
    _world, plans, results = run
    assert len(results["match"]) == len(MODELS) * len(OPTIMIZERS) * len(next(iter(plans.values())))
    bad = {key: worst for key, (ok, worst) in results["match"].items() if not ok}
    assert not bad, f"parameters differ from DDP's (largest relative difference): {bad}"


def test_the_trace_follows_the_plan(run):
    _world, plans, results = run
    for policy, trace in results["trace"].items():
        plan = plans["transformer"][policy]
        ops = [e for e in trace if e["kind"] == "op"]
        assert [(e["seq"], e["op"], e["bucket"], e["lane"]) for e in ops] == \
               [(o["seq"], o["op"], o["bucket"], o["lane"]) for o in plan["ops"]], policy
        done = {e["seq"]: e["end"] for e in ops}
        starts = {e["layer"]: e["time"] for e in trace if e["kind"] == "forward"}
        assert set(starts) >= set(plan["forward_waits"])
        for layer, waits in plan["forward_waits"].items():
            assert all(done[w["op_done"]] <= starts[layer] for w in waits), (policy, layer)


def test_the_optimizer_state_is_sharded(run):
    world, plans, results = run
    for (name, policy), (mine, ddp, buffers) in results["memory"].items():
        primitives = {b["primitive"] for b in plans[name][policy]["buckets"]}
        if primitives == {"rs+ag"}:
            assert mine == 2 * buffers // world  # Adam: two moments of this rank's shard
            assert mine <= ddp / world * 1.05 + 2 * world, (name, policy, mine, ddp)
        elif primitives == {"allreduce"}:
            assert mine == 2 * buffers >= ddp  # all-reduced buckets keep the whole (padded) state, as DDP does


def test_pending_all_gathers_complete_for_full_parameters(run):
    _world, _plans, results = run
    pending, ok = results["pending"]
    assert pending > 0 and ok


def test_checkpoints_round_trip(run):
    _world, _plans, results = run
    assert results["checkpoint"] == {True: True, False: True}


# -- bad plans, in a process group of one ------------------------------------------------------


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path_factory.mktemp('pg') / 'rendezvous'}", rank=0, world_size=1)
    yield plans_for(2)
    dist.destroy_process_group()


@pytest.mark.parametrize("case", ["world size", "model", "layers", "dtype", "corrupt", "schema", "order"])
def test_a_bad_plan_is_refused_and_changes_nothing(case, one_rank, tmp_path):
    from hipipe_compiler.torch import PlannedDataParallel

    plan = copy.deepcopy(one_rank["mlp"]["pipedap"])
    plan["world_size"] = 1
    model = fresh("mlp")
    expected = ""
    if case == "world size":
        plan["world_size"], expected = 2, "world_size: the plan is for 2 ranks; this process group has 1"
    elif case == "model":
        plan["buckets"][0]["elems"] += 1
        expected = "buckets[0].elems: the plan has"
    elif case == "layers":
        model, expected = fresh("cnn"), "buckets.layers: the module has no submodule"
    elif case == "dtype":
        model, expected = fresh("mlp").double(), "dtype_bytes: the plan is for 4-byte elements; the module's parameters are float64"
    elif case == "corrupt":
        path = tmp_path / "plan.json"
        path.write_text(json.dumps(plan)[:-20])
        plan, expected = str(path), "plan.json"
    elif case == "schema":
        plan["ops"][0]["lane"], expected = -1, "ops[0].lane"
    else:  # a reduce after an op that waits for the next forward: the step could never finish
        plan["ops"][0]["after"].append({"forward_start": plan["buckets"][0]["layers"][0]})
        expected = "ops[2]: expected every reduce before op 0, which waits for the next forward"
    before = {k: v.clone() for k, v in model.state_dict().items()}
    built = []
    with pytest.raises(InputError) as info:
        PlannedDataParallel(model, plan, lambda params: built.append(params))
    assert expected in str(info.value) and "\n" not in str(info.value)
    assert not built, "the optimizer was built"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
