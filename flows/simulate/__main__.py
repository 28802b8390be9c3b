"""``python -m flows.simulate ...``: the trace-driven simulator without the main CLI."""

import sys

from flows.simulate.cli import main

sys.exit(main())
