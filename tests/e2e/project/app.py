"""The user program the end-to-end tests debug through tether (line numbers are asserted)."""

import sys

from helpers import scale


def compute(values, factor):
    total = 0
    for i, v in enumerate(values):
        total += scale(v, factor)
    result = {"total": total, "count": len(values)}
    return result


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
    data = [1, 2, 3, 4, 5]
    outcome = compute(data, factor=10)
    print("outcome", outcome["total"])
    if mode == "crash":
        raise ValueError("boom: " + str(outcome["total"]))
    if mode == "spin":
        n = 0
        while n >= 0:
            n += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
