"""Rank group benchmark: one rank of ``ranks_launcher.py N ranks_bench.py``. Every rank says it is
up (a file), then waits in a Python loop (a short sleep, so a pause lands at once) until rank 0,
once all N are up, passed its breakpoint and said so (another file). Files beside the run, named
by the launcher's MASTER_PORT (one per run).

Rank 0 stops :data:`SETTLE_S` after the last rank is up: the worker configures a rank's debug
session (its breakpoints) while the rank already runs, and debugpy answers a pause only after
the configuration requests before it (some 40 ms each with 16 ranks on 2 cores), so a stop right
at start-up would time the last ranks' configuration, not the group stop. A training job stops
minutes after its ranks started."""

import os
import time
from pathlib import Path

#: seconds between the last rank up and rank 0's breakpoint: every rank's session configured
SETTLE_S = 0.5


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    tag = os.environ["MASTER_PORT"]
    Path(f"up-{tag}-{rank}").touch()
    done = Path(f"done-{tag}")
    if rank == 0:
        while not all(Path(f"up-{tag}-{r}").exists() for r in range(world)):
            time.sleep(0.002)
        time.sleep(SETTLE_S)
        marker = 1  # BREAK
        marker += 1
        done.touch()
    else:
        while not done.exists():
            time.sleep(0.002)
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
