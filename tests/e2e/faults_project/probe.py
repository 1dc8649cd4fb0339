"""The debuggee of the fault-injection suite: records what the IDE side sends, in arrival order."""

import json

SEEN = []


def record(i):
    SEEN.append(i)
    return i


def flood(start, count):
    for j in range(start, start + count):
        print(f"tseq {j}", flush=True)
    return count


def check():
    return json.dumps(SEEN)


def main():
    for rounds in range(1_000_000):
        pause_here = rounds  # the breakpoint (line 25)
        del pause_here


main()
