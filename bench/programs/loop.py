"""The paused program of the latency benchmarks: a loop 20 frames deep, stepped through."""

import sys


def descend(depth: int, steps: int) -> int:
    if depth:
        return descend(depth - 1, steps)
    return spin(steps)


def spin(steps: int) -> int:
    factor = 3
    values = list(range(100))
    table = {"name": "bench", "head": values[:10]}
    total = 0
    for i in range(steps):
        total += i * factor  # BREAK
        total %= 1_000_003
    return total + len(table)


if __name__ == "__main__":
    print(descend(18, int(sys.argv[1]) if len(sys.argv) > 1 else 10**7))
