"""The output flood of the responsiveness figure: N short lines, then idle until ended.

``n`` counts the lines printed: a pause during the flood stops in the first loop, a later one in
the second (Python-level waiting, so that a pause lands within 50 ms).
"""

import sys
import time

total = int(sys.argv[1])
n = 0
while n < total:
    print("line", n)
    n += 1
while True:
    time.sleep(0.05)
