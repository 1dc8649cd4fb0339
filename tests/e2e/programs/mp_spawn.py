"""Starts one multiprocessing child by the method its argument names (spawn, fork); see lines."""

import multiprocessing as mp
import sys


def work(n):
    total = n * 7
    print(f"child total {total}", flush=True)  # line 9: the child's breakpoint
    return total


def main():
    ctx = mp.get_context(sys.argv[1] if len(sys.argv) > 1 else "spawn")
    child = ctx.Process(target=work, args=(6,))
    child.start()
    child.join()
    print(f"parent done, child exit code {child.exitcode}", flush=True)


if __name__ == "__main__":
    main()
