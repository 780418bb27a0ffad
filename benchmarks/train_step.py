"""Training iterations of a profile-sized synthetic model under every policy's plan, run by
hipipe_compiler.torch.PlannedDataParallel in a real process group.

    python benchmarks/train_step.py [--profile samples/profiles/mlp.yaml] [--world 2] [--scale 0.01]
                                    [--iterations 5] [--backend gloo]

Each layer of the profile becomes one parameter of `scale` x its elements, and sleeps its
forward and backward times (scaled by `--time-scale`), so compute follows the profile. Each
policy's plan comes from the planner on a `world`-rank switch topology, exactly as `hipipe
plan` makes it. Per policy the table has the iteration time, the compute in it, the time spent
in collectives, the time forward layers waited for their all-gathers, and the exposed
communication (iteration minus compute), all from the runtime's hook timestamps.

On GPUs (`--backend nccl`, one process per GPU) this is the real comparison. On CPU with gloo
the collectives block the compute, so nothing overlaps; it still runs every plan's order.
Target: each policy's recorded trace issues its plan's ops in order, on their lanes, and no
layer starts before the ops it waits for are done.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from harness import print_table

from hipipe_compiler.topology import Dimension, Topology
from hipipe_compiler.training import SimulatedCost, load_profile, plan_training
from hipipe_compiler.training.planner import plan_document
from hipipe_compiler.training.profiles import profile_from_document


class _Compute(torch.autograd.Function):
    """x + mean(w), sleeping a layer's forward time on the way and its backward time back."""

    @staticmethod
    def forward(ctx, x, w, fwd_s: float, bwd_s: float):
        time.sleep(fwd_s)
        ctx.bwd_s, ctx.n = bwd_s, w.numel()
        return x + w.mean()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.bwd_s)
        return grad, grad.sum().expand(ctx.n) / ctx.n, None, None


class Layer(torch.nn.Module):
    def __init__(self, params: int, fwd_ms: float, bwd_ms: float) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(params))
        self.fwd_s, self.bwd_s = fwd_ms / 1e3, bwd_ms / 1e3

    def forward(self, x):
        return _Compute.apply(x, self.weight, self.fwd_s, self.bwd_s)


def synthetic(profile, scale: float, time_scale: float) -> tuple[torch.nn.Sequential, dict]:
    """The model and its layer profile (what `layer_profile` would measure, without noise)."""
    layers = [Layer(max(1, round(layer.params * scale)), layer.fwd_ms * time_scale, layer.bwd_ms * time_scale)
              for layer in profile.layers]
    model = torch.nn.Sequential(*layers)
    doc = {"schema": "layer-profile/v1", "model": f"{profile.name} x{scale:g}", "dtype_bytes": 4,
           "layers": [{"name": str(i), "params": m.weight.numel(), "fwd_ms": m.fwd_s * 1e3, "bwd_ms": m.bwd_s * 1e3}
                      for i, m in enumerate(layers)]}
    return model, doc


def _worker(rank: int, world: int, backend: str, rendezvous: str, args: argparse.Namespace, plans: dict, out: str) -> None:
    from hipipe_compiler.torch import PlannedDataParallel

    dist.init_process_group(backend, init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    rows = {}
    profile = load_profile(args.profile)
    for policy, plan in plans.items():
        model, _doc = synthetic(profile, args.scale, args.time_scale)
        pdp = PlannedDataParallel(model.to(device), plan, lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9), trace=True)
        x = torch.zeros(4, device=device)
        times, comm, waits = [], [], []
        for it in range(args.iterations + 1):
            pdp.trace.clear()
            c0, w0 = pdp.comm_seconds, pdp.wait_seconds
            start = time.perf_counter()
            pdp(x).sum().backward()
            pdp.step()
            pdp.zero_grad()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if it:  # the first is a warm-up
                times.append(time.perf_counter() - start)
                comm.append(pdp.comm_seconds - c0)
                waits.append(pdp.wait_seconds - w0)
        pdp(x)  # the last iteration's forward-phase ops, traced
        ops = [e for e in pdp.trace if e["kind"] == "op"]
        done = {e["seq"]: e["end"] for e in ops}
        starts = {e["layer"]: e["time"] for e in pdp.trace if e["kind"] == "forward"}
        in_order = [(e["seq"], e["lane"]) for e in ops] == [(o["seq"], o["lane"]) for o in plan["ops"]]
        waited = all(done.get(w["op_done"], float("inf")) <= starts.get(layer, 0.0)
                     for layer, ws in plan["forward_waits"].items() for w in ws)
        rows[policy] = {"iteration_ms": 1e3 * sum(times) / len(times), "comm_ms": 1e3 * sum(comm) / len(comm),
                        "wait_ms": 1e3 * sum(waits) / len(waits), "follows_plan": in_order and waited,
                        "predicted_ms": plan["predicted"]["iteration_ms"]}
    if rank == 0:
        torch.save(rows, out)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=str(Path(__file__).resolve().parents[1] / "samples" / "profiles" / "mlp.yaml"))
    parser.add_argument("--world", type=int, default=2, help="processes (ranks); a power of two")
    parser.add_argument("--scale", type=float, default=0.01, help="fraction of each layer's parameters to allocate")
    parser.add_argument("--time-scale", type=float, default=1.0, help="factor on the profile's compute times")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    args = parser.parse_args()
    if args.world < 2 or args.world & (args.world - 1):
        sys.exit("--world: expected a power of two >= 2")
    profile = load_profile(args.profile)
    _model, doc = synthetic(profile, args.scale, args.time_scale)
    topo = Topology(tuple(Dimension(2, "switch", 100, 1.0, name=f"d{i}") for i in range(args.world.bit_length() - 1)),
                    name=f"switch-{args.world}")
    report = plan_training(profile_from_document(doc, "synthetic"), SimulatedCost(topo, "hierarchical"), args.world)
    plans = {policy: plan_document(report, policy) for policy in report.policies}
    compute = sum(layer["fwd_ms"] + layer["bwd_ms"] for layer in doc["layers"])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.pt"
        mp.spawn(_worker, args=(args.world, args.backend, str(Path(tmp) / "rendezvous"), args, plans, str(out)),
                 nprocs=args.world)
        rows = torch.load(out)
    print(f"{doc['model']}: {len(doc['layers'])} layers, {sum(l['params'] for l in doc['layers']):,} parameters, "
          f"compute {compute:.2f} ms per iteration; {args.world} ranks, {args.backend}, mean of {args.iterations} iterations")
    print_table([(p, f"{r['iteration_ms']:.2f}", f"{compute:.2f}", f"{r['comm_ms']:.2f}", f"{r['wait_ms']:.2f}",
                  f"{r['iteration_ms'] - compute:.2f}", "yes" if r["follows_plan"] else "NO") for p, r in rows.items()],
                ("policy", "iteration ms", "compute ms", "in collectives ms", "forward waits ms", "exposed ms", "follows plan"))
    holds = all(r["follows_plan"] for r in rows.values())
    print(f"target: every policy's trace follows its plan's order and waits: {'holds' if holds else 'MISSED'}")
    sys.exit(0 if holds else 1)


if __name__ == "__main__":
    main()
