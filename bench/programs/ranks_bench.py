"""Rank group benchmark: one rank of ``ranks_launcher.py N ranks_bench.py``. Every rank says it is
up (a file), then waits in a Python loop (a short sleep, so a pause lands at once) until rank 0,
once all N are up, passed its breakpoint and said so (another file). Files beside the run, named
by the launcher's MASTER_PORT (one per run)."""

import os
import time
from pathlib import Path


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    tag = os.environ["MASTER_PORT"]
    Path(f"up-{tag}-{rank}").touch()
    done = Path(f"done-{tag}")
    if rank == 0:
        while not all(Path(f"up-{tag}-{r}").exists() for r in range(world)):
            time.sleep(0.002)
        marker = 1  # BREAK
        marker += 1
        done.touch()
    else:
        while not done.exists():
            time.sleep(0.002)
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
