"""`python -m hipipe_compiler` runs the `hipipe` command."""

import sys

from .cli import main

sys.exit(main())
