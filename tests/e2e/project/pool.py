"""A DataLoader-style worker pool: must run to completion under tether, not hang."""

import multiprocessing as mp


def square(x):
    return x * x


def main():
    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        results = pool.map(square, range(8))
    total = sum(results)
    print("pool total", total)


if __name__ == "__main__":
    main()
