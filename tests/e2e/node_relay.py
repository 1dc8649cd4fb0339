"""A node worker's command line with its own relay: ``python node_relay.py URL COMMAND...``.

A pool starts node K's worker as ``PREFIX... python -m adapter.cli worker ... --relay URL`` with
the pool's own relay URL. A test that gives each node's link a fault proxy of its own puts this
in node K's ``--node-via`` prefix: it replaces the ``--relay`` value with ``URL`` (node K's
proxy) and runs the command in its place."""

import os
import sys

url, argv = sys.argv[1], sys.argv[2:]
argv[argv.index("--relay") + 1] = url
os.execvp(argv[0], argv)
