"""The MSCCL backend: what the runtime accepts and how it runs a program.

- `program`: the Program IR, one to one with the XML;
- `runtime`: the runtime's limits, protocols and message model;
- `writer`, `reader`, `lexical`: XML out, XML in (safely), and the runtime reader's rules;
- `verify`: the proof that a Program is correct on the runtime.
"""

from .lexical import LexicalIssue, lexical_issues
from .program import Gpu, Program, Step, Threadblock
from .reader import read_header, read_program
from .runtime import Limits
from .verify import Report, VerifyOptions, Violation, verify
from .writer import DIALECTS, save_program, write_program

__all__ = [
    "DIALECTS", "Gpu", "LexicalIssue", "Limits", "Program", "Report", "Step", "Threadblock", "VerifyOptions",
    "Violation", "lexical_issues", "read_header", "read_program", "save_program", "verify", "write_program",
]
