"""Processes benchmark: a parent that starts K multiprocessing spawn children, each stopping at a
breakpoint on its function's first line. The parent writes each child's pid and start time (Linux
``/proc/PID/stat``, clock ticks since boot) to the file its second argument names, as it starts it.

    python spawn_children.py K BORN_FILE
"""

import json
import multiprocessing as mp
import sys


def work(i):
    got = i + 1  # BREAK
    return got


def born(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def main():
    count, out = int(sys.argv[1]), sys.argv[2]
    ctx = mp.get_context("spawn")
    kids = [ctx.Process(target=work, args=(i,)) for i in range(count)]
    with open(out, "w") as f:
        for kid in kids:
            kid.start()
            f.write(json.dumps({"pid": kid.pid, "born_ticks": born(kid.pid)}) + "\n")
            f.flush()
    for kid in kids:
        kid.join()
    print(f"parent done, exit codes {[kid.exitcode for kid in kids]}", flush=True)


if __name__ == "__main__":
    main()
