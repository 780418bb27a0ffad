"""The verifier: proves a Program correct under the runtime's semantics, or names each
broken rule (msccl-runtime.md sections 7-12).

Checks, in order:
1. structure (structure.py): the rules the runtime's parser enforces and the ones it
   silently does not;
2. connections (structure.py): per (channel, sender, receiver) the send and receive
   sequences agree in number and cnt;
3. execution (execution.py) with the runtime's bounded connection FIFOs at the worst size
   of the window: deadlock freedom; on the way every step gets a level (one more than the
   steps it follows), so steps of one level are unordered;
4. semantics (semantics.py) by symbolic execution, a level at a time in array operations;
5. races (races.py): two threadblocks of a rank touching the same chunk, at least one
   writing, with no order between them through dependencies or messages.

>>> from hipipe_compiler.presets import preset
>>> from hipipe_compiler.schedule import hierarchical_plan
>>> from hipipe_compiler.lower import lower
>>> report = verify(lower(hierarchical_plan(preset("dgx-h100-8x2"), max_bytes=1 << 20)))
>>> report.ok, report.violations
(True, ())
"""

from __future__ import annotations

from ...collector import paused
from ..program import Program
from .execution import execute, step_table
from .races import check_races
from .report import Collector, Report, VerifyOptions, Violation
from .semantics import SEMANTIC_COLLECTIVES, check_input_untouched, check_results, symbolic_execution
from .structure import check_connections, check_structure


def verify(program: Program, options: VerifyOptions = VerifyOptions()) -> Report:
    """Check every rule; a Report with `ok` True is a proof for the modelled runtime."""
    with paused():  # the run builds a state per threadblock and step: collections would walk them all
        return _verify(program, options)


def structural_violations(program: Program, options: VerifyOptions = VerifyOptions()) -> tuple[Violation, ...]:
    """The structural rules alone (structure and connections, steps 1-2): what a program must
    keep for the simulator to run it at all."""
    out = Collector(options.max_violations)
    check_structure(program, options, out)
    check_connections(program, out)
    return tuple(out.items)


def _verify(program: Program, options: VerifyOptions) -> Report:
    out = Collector(options.max_violations)
    checked, skipped = ["structure"], []
    runnable = check_structure(program, options, out)
    conns = check_connections(program, out)
    checked.append("connections")
    if any(v.rule.startswith("connection.") for v in out.items):
        runnable = False
    if not runnable:
        skipped.append("execution, semantics and races not checked: fix the structural rules first")
        return Report(tuple(out.items), tuple(checked), tuple(skipped))
    semantic = program.collective in SEMANTIC_COLLECTIVES
    modes = [m for m, on in ((True, program.inplace), (False, program.outofplace)) if on] if semantic else []
    if not semantic:
        skipped.append(f"semantics not checked: no reference semantics for {program.collective} (the XML names no root)")
    ok, ex = execute(program, options, out)
    checked.append("deadlock")
    table = step_table(program, ex)
    del ex  # the run's state per step is not needed any more: free it before the symbolic execution
    if program.outofplace:
        check_input_untouched(program, table, out)
    budget = 20  # semantic violations reported, over both modes
    for inplace in modes:  # one at a time: each mode's values are as large as every rank's buffers
        values, budget = symbolic_execution(program, table, inplace, out, budget)
        if ok:
            check_results(program, values, "in place" if inplace else "out of place", out)
        del values
    if not ok:  # what went wrong on the way may explain the deadlock
        skipped.append("results and races not checked: the program does not run to completion")
    else:
        if modes:
            checked.append("semantics")
        check_races(program, table, conns, program.inplace, out)
        checked.append("races")
    stats = {"ranks": program.ngpus, "steps": program.nsteps, "threadblocks": program.max_threadblocks}
    return Report(tuple(out.items), tuple(checked), tuple(skipped), stats)
