"""multiprocessing.Pool(16) over 64 items; the main process checks the result (tests: lines)."""

import multiprocessing as mp


def square(x):
    return x * x


def main():
    with mp.get_context("spawn").Pool(16) as pool:
        squares = pool.map(square, range(64))
    total = sum(squares)
    print(f"pool total {total}", flush=True)  # line 14: the main process's breakpoint


if __name__ == "__main__":
    main()
