"""The commands that describe a machine: `hipipe calibrate` (a topology fitted to nccl-tests
logs) and `hipipe topo import` (a topology from NCCL's topology XML)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tabulate import tabulate

from .arguments import integer_option, positive_option
from .errors import InputError
from .files import check_output_path, write_atomic
from .nccl.logs import ALGORITHM_NAMES, PROTOCOL_NAMES, read_log


def add_calibrate(sub: Any) -> None:
    p = sub.add_parser("calibrate", help="fit a topology to nccl-tests logs of one machine (NCCL as simulated "
                       "reproduces the measured times)")
    p.add_argument("logs", nargs="+", metavar="LOG", help="nccl-tests output files of one machine (other node counts, "
                   "collectives and NCCL_ALGO / NCCL_PROTO settings may differ between them)")
    p.add_argument("-o", "--output", help="the topology file to write (YAML)")
    p.add_argument("--check", metavar="TOPO", help="fit nothing: how well this topology (a file or preset) predicts "
                   "the logs, and no file written")
    p.add_argument("--nodes", type=integer_option("--nodes", 1, 4096), help="write the machine with this many nodes "
                   "(default: the most any log has)")
    p.add_argument("--name", help="the topology's name (default: the GPU and the node shape)")
    p.add_argument("--topo", help="a topology file or preset to start from: its dimensions, links and values are the "
                   "defaults the fit starts at (default: built from the GPU the logs name)")
    p.add_argument("--net-gbps", type=positive_option("--net-gbps"), help="the network bandwidth per GPU the fit "
                   "starts at, GB/s (default 50: a 400 Gb/s NIC per GPU)")
    p.add_argument("--coll", choices=("allreduce", "reducescatter", "allgather"),
                   help="the collective of logs that do not say")
    p.add_argument("--algo", help="NCCL_ALGO the logs ran with, where they do not say: a name, a comma list, or ^ and "
                   f"the ones left out ({', '.join(sorted(set(ALGORITHM_NAMES.values())))}; default: NCCL picks from all)")
    p.add_argument("--proto", help="NCCL_PROTO the logs ran with, where they do not say, likewise "
                   f"({', '.join(sorted(set(PROTOCOL_NAMES.values())))}; default: NCCL picks from all)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", help="also draw measured against predicted busbw, one line per log (PNG/SVG)")


def cmd_calibrate(args: argparse.Namespace) -> int:
    from . import __version__
    from .nccl.calibrate import calibrate
    from .nccl.report import fit_rows, fitted_rows, plot, to_dict, topology_yaml
    from .presets import load_topology
    if args.check:
        return _check(args)
    if not args.output:
        raise InputError(None, "-o", "expected the topology file to write (or --check TOPO to test one)")
    out = check_output_path(args.output, directory=False)
    if args.plot:
        from .sim.timeline import check_picture_path
        check_picture_path(args.plot)
        check_output_path(args.plot, directory=False, option="--plot")
    logs = [read_log(path, args.coll, args.algo, args.proto) for path in args.logs]
    base = load_topology(args.topo) if args.topo else None
    spans = any(log.nodes > 1 for log in logs) or (base is not None and base.ndims > 1)
    if args.nodes is not None and args.nodes > 1 and not spans:
        raise InputError(None, "--nodes", "no log spans nodes, so nothing says what the network is: calibrate with a "
                         "log of several nodes too, or ask for --nodes 1")
    bar = None
    if not args.json and sys.stderr.isatty():
        from tqdm import tqdm
        bar = tqdm(desc="fitting", unit="step", leave=False)
    try:
        cal = calibrate(logs, base, args.net_gbps, progress=None if bar is None else lambda i: bar.update(1))
    finally:
        if bar is not None:
            bar.close()
    nodes = args.nodes or max(log.nodes for log in logs)
    gpu = (cal.topology.gpu or "gpu").lower()
    name = args.name or f"{gpu}-{logs[0].ranks_per_node}x{nodes}"
    text = topology_yaml(cal, args.logs, nodes if cal.topology.ndims > 1 else None, name,
                         f"hipipe calibrate (hipipe-compiler {__version__})")
    write_atomic(out, text)
    if args.plot:
        plot(cal, args.plot)
    notes = _notes(logs)
    if args.json:
        print(json.dumps({**to_dict(cal, args.logs), "output": str(out), "notes": notes}, indent=2))
        return 0
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(tabulate(fit_rows(cal), headers=("log", "nodes", "size", "NCCL runs", "measured us", "predicted us", "error"),
                   disable_numparse=True))
    print()
    print(tabulate(fitted_rows(cal), headers=("quantity", "default", "value", "source"), disable_numparse=True))
    print(f"rms log error {cal.rms_error:.3f} over {len(cal.points)} measured times; wrote {out}"
          + (f" and {args.plot}" if args.plot else ""))
    return 0


def _notes(logs: list) -> list[str]:
    """What the logs ran with that the simulation does not model, one note per log."""
    return [f"{log.source}: ran with {', '.join(log.unmodelled)}, which the simulation does not model; where its "
            "times are off, that may be why" for log in logs if log.unmodelled]


def _check(args: argparse.Namespace) -> int:
    """`hipipe calibrate --check TOPO LOG...`: each measured time beside the topology's prediction."""
    from .nccl.calibrate import Calibration, predict
    from .nccl.report import fit_rows, plot, to_dict
    from .presets import load_topology
    for option in ("output", "topo", "nodes", "name", "net_gbps"):
        if getattr(args, option) is not None:
            raise InputError(None, "--" + option.replace("_", "-"), "expected nothing with --check, which fits nothing")
    if args.plot:
        from .sim.timeline import check_picture_path
        check_picture_path(args.plot)
        check_output_path(args.plot, directory=False, option="--plot")
    topology = load_topology(args.check)
    logs = [read_log(path, args.coll, args.algo, args.proto) for path in args.logs]
    cal = Calibration(topology, (), predict(topology, logs, args.check))
    if args.plot:
        plot(cal, args.plot)
    notes = _notes(logs)
    if args.json:
        print(json.dumps({**to_dict(cal, args.logs), "checked": args.check, "notes": notes}, indent=2))
        return 0
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(tabulate(fit_rows(cal), headers=("log", "nodes", "size", "NCCL runs", "measured us", "predicted us", "error"),
                   disable_numparse=True))
    print(f"{args.check}: rms log error {cal.rms_error:.3f} over {len(cal.points)} measured times"
          + (f"; wrote {args.plot}" if args.plot else ""))
    return 0


def import_parser() -> argparse.ArgumentParser:
    """`hipipe topo import`: a parser of its own, since `hipipe topo FILE` shows a topology."""
    from .arguments import Parser
    p = Parser(prog="hipipe topo import", description="a topology from NCCL's topology XML (NCCL_TOPO_DUMP_FILE, or "
               "a file for NCCL_TOPO_FILE)")
    p.add_argument("file", help="NCCL's topology XML of one node (or of an NVLink domain of several)")
    p.add_argument("--nodes", type=integer_option("--nodes", 1, 4096),
                   help="nodes of the machine (default: the hosts the file holds, 1 without host_hash)")
    p.add_argument("-o", "--output", help="write the topology here (YAML; default: print it)")
    p.add_argument("--gpu", help="the GPU model, where the file names none (H100, A100, ...)")
    p.add_argument("--nvlink-gbps", type=positive_option("--nvlink-gbps"),
                   help="NVLink GB/s per GPU, where the file lists no NVLinks")
    p.add_argument("--nic-gbps", type=positive_option("--nic-gbps"),
                   help="network GB/s per GPU, where the file gives no NIC speeds (a 400 Gb/s NIC per GPU: 50)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def cmd_topo_import(argv: list[str]) -> int:
    from .nccl.topo_xml import import_topology, read_topology_xml
    args = import_parser().parse_args(argv)
    out = check_output_path(args.output, directory=False) if args.output else None
    machine = read_topology_xml(args.file, gpu=args.gpu)
    topo, why = import_topology(machine, args.nodes, args.nvlink_gbps, args.nic_gbps)
    text = _yaml(topo, args.file, why)
    if out is not None:
        write_atomic(out, text)
    if args.json:
        print(json.dumps({"file": args.file, "topology": topo.to_document(), "sources": why,
                          "nearest_nic": list(machine.nearest), **({"output": str(out)} if out else {})}, indent=2))
        return 0
    print(f"{args.file}: {machine.gpus} x {machine.gpu.name} per node, {machine.nics} NIC(s); nearest NIC per GPU: "
          + ", ".join(f"{i}: {n}" for i, n in enumerate(machine.nearest)))
    for line in why:
        print(f"  {line}")
    if out is None:
        print(text, end="")
    else:
        print(f"wrote {out}")
    return 0


def _yaml(topo: Any, source: str, why: list[str]) -> str:
    """The imported topology as a YAML file, headed by where each number came from."""
    import yaml
    head = [f"# {topo.name}: imported by hipipe topo import from {source}"] + [f"#   {line}" for line in why]
    body = yaml.safe_dump(topo.to_document(), sort_keys=False, default_flow_style=None, width=120)
    return "\n".join(head) + "\n" + body
