"""The debuggee of the fault-injection suite: records what the IDE side sends, in arrival order.

The program (``python probe.py``) starts one child, ``python probe.py child``, that runs the same
loop with its own ``SEEN``; ``flood`` tags its lines with the process's role, since a child's
output goes to the same pipe as its parent's."""

import json
import os
import subprocess
import sys

SEEN = []
ROLE = sys.argv[1] if len(sys.argv) > 1 else "main"


def record(i):
    SEEN.append(i)
    return i


def flood(start, count):
    for j in range(start, start + count):
        print(f"tseq {ROLE} {j}", flush=True)
    return count


def check():
    return json.dumps(SEEN)


def main():
    parent = os.getppid()
    for rounds in range(1_000_000):
        pause_here = rounds  # the breakpoint (line 34)
        del pause_here
        if os.getppid() != parent:
            return  # the child's parent is gone: end with it


if __name__ == "__main__":
    if ROLE == "main":
        subprocess.Popen([sys.executable, __file__, "child"])
    main()
