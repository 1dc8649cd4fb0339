"""``python -m adapter.cli``: what a Slurm job script runs (``python -m adapter.cli worker ...``)."""

import sys

from .main import main

sys.exit(main())
