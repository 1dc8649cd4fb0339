"""Attempt 1 fails before it starts any child; attempt 2 starts a spawn child (tests: line numbers).

The state mount (``TETHER_MOUNT_STATE``) outlives an attempt: the first one leaves a mark there."""

import multiprocessing as mp
import os
from pathlib import Path


def work(n):
    total = n * 7
    print(f"child total {total}", flush=True)  # line 12: the child's breakpoint
    return total


def main():
    mark = Path(os.environ["TETHER_MOUNT_STATE"], "tried")
    if not mark.exists():
        mark.write_text("1")
        print("attempt first", flush=True)
        os._exit(3)  # not SystemExit: the IDE would stop on it as an uncaught exception
    child = mp.get_context("spawn").Process(target=work, args=(6,))
    child.start()
    child.join()
    print(f"parent done, child exit code {child.exitcode}", flush=True)


if __name__ == "__main__":
    main()
