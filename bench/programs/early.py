"""Time to first stop: a breakpoint on an early line."""

import sys

first = len(sys.argv)  # BREAK
print("stopped early", first)
