"""Benchmark 16's program: the last node of the run stops at the breakpoint; the others wait for
it to be continued (a marker file in ``$OUT``), so no node ends while the stop is measured."""

import os
import time

node = int(os.environ.get("TETHER_NODE", "0"))
last = int(os.environ.get("TETHER_NNODES", "1")) - 1
done = os.path.join(os.environ["OUT"], "continued")


def on_the_last_node():
    return node  # BREAK


if node == last:
    on_the_last_node()
    with open(done, "w") as f:
        f.write("continued\n")
else:
    deadline = time.monotonic() + 300
    while not os.path.exists(done) and time.monotonic() < deadline:
        time.sleep(0.05)
