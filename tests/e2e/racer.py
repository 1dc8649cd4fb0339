"""Another OS user racing the worker to a run's debugger (run as ``nobody`` by the tests).

``python racer.py FIRST LAST``: watches ``/proc/net/tcp`` (world-readable) in a tight loop for new
listening sockets whose owner is a uid in FIRST..LAST (the worker's programs), connects to each at
once (and again every 0.1 s while it listens) and sends a DAP ``initialize`` request, as a local
attacker would. Prints one JSON line per
connection: ``{"port": P, "uid": U, "answered": bool, "said": "..."}``; ``answered`` means the
debugger (or debugpy's endpoints listener) talked to it: the attack worked. Runs until its stdin
closes. Standalone, stdlib only: it runs on the system's interpreter as another user.
"""

import json
import os
import select
import socket
import sys
import threading
import time

#: how often a listener already seen is tried again (seconds)
AGAIN = 0.1

BODY = json.dumps(
    {"seq": 1, "type": "request", "command": "initialize", "arguments": {"adapterID": "x"}}
).encode()
INITIALIZE = b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY
_lock = threading.Lock()


def say(**fields: object) -> None:
    with _lock:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


def attack(port: int, uid: int) -> None:
    try:
        conn = socket.create_connection(("127.0.0.1", port), timeout=2)
    except OSError as exc:
        say(port=port, uid=uid, answered=False, said=f"connect: {exc}")
        return
    try:
        conn.sendall(INITIALIZE)
        conn.settimeout(5)
        data = conn.recv(200)
    except OSError as exc:
        data = b""
        said = f"{type(exc).__name__}: {exc}"
    else:
        said = data.decode(errors="replace")[:120]
    finally:
        conn.close()
    say(port=port, uid=uid, answered=bool(data), said=said)


def listeners(first: int, last: int) -> list[tuple[str, int, int]]:
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) < 10 or cols[3] != "0A":  # LISTEN
                continue
            uid = int(cols[7])
            if first <= uid <= last:
                found.append((cols[9], int(cols[1].rsplit(":", 1)[1], 16), uid))
    return found


def main() -> None:
    first, last = int(sys.argv[1]), int(sys.argv[2])
    last_try: dict[str, float] = {}  # by listening socket
    say(ready=True, uid=os.getuid())
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], 0)
        if ready and not sys.stdin.buffer.read1(1):
            return
        now = time.monotonic()
        for inode, port, uid in listeners(first, last):
            # a new listener at once; a known one again every AGAIN s (the worker opens a new
            # connection to the adapter for each child process: that is a race too)
            if now - last_try.get(inode, -AGAIN) >= AGAIN:
                last_try[inode] = now
                threading.Thread(target=attack, args=(port, uid), daemon=True).start()


if __name__ == "__main__":
    main()
