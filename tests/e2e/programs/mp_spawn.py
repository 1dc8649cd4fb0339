"""A parent that starts one multiprocessing child with the spawn method (tests: line numbers)."""

import multiprocessing as mp


def work(n):
    total = n * 7
    print(f"child total {total}", flush=True)  # line 8: the child's breakpoint
    return total


def main():
    ctx = mp.get_context("spawn")
    child = ctx.Process(target=work, args=(6,))
    child.start()
    child.join()
    print(f"parent done, child exit code {child.exitcode}", flush=True)  # line 17


if __name__ == "__main__":
    main()
