"""The output flood: N short lines on stdout under the debugger, then a breakpoint.

The stop comes after every line in debugpy's one ordered queue, so the client holding ``stopped``
has all the output (a program that exits at once can take its last output events with it: pydevd
drops what it has not sent when the process ends).
"""

import sys

n = int(sys.argv[1])
for i in range(n):
    print("line", i)
printed = n  # BREAK
