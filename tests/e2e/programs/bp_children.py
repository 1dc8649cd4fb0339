"""Children that call ``breakpoint()``, one after the other, started the ways the arguments name:
spawn, fork, forkserver (multiprocessing), subprocess (a new interpreter running this file); and
main: the main process calls it itself."""

import multiprocessing as mp
import subprocess
import sys


def work(n, how):
    total = n * 7
    breakpoint()  # line 12: each process stops at the next line (13)
    print(f"child {how} total {total}", flush=True)
    return total


def start(how):
    """Start one child the way ``how`` names; its exit code."""
    if how == "main":
        work(6, how)
        return 0
    if how == "subprocess":
        return subprocess.run([sys.executable, __file__, "--child", how], check=False).returncode
    child = mp.get_context(how).Process(target=work, args=(6, how))
    child.start()
    child.join()
    return child.exitcode


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        work(6, sys.argv[2])
    else:
        codes = [start(how) for how in sys.argv[1:]]
        print(f"parent done, child exit codes {codes}", flush=True)
