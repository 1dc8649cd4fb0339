"""The local stacks (``tether up``), one per data directory, and which one a command talks to.

Several ``tether up`` may run side by side, each with a data directory of its own, as several
Jupyter servers do: each keeps what belongs to it apart, and none touches the others' or the
user's config file.

- **The token** of the local user lives in the data directory (``DATA/token``, mode 0600), next to
  the store that knows it: a restart of the same directory presents the same token, and a second
  stack never replaces the first one's.
- **The address**: a running stack records itself in ``$TETHER_HOME/stacks/<key>.json`` (mode
  0600; ``key``: a hash of the data directory): its relay URL, its process (pid and start time, so
  a record whose process is gone, or whose pid was reused, is recognised), its data directory. It
  removes the record when it ends; a record left by a killed one is ignored, and removed when
  read.
- **Which one** (when no ``--relay``, ``$TETHER_RELAY`` or profile names a relay): ``--stack DIR``
  or ``$TETHER_STACK`` (a data directory) names one; else the one that runs; of several, the one
  of the default data directory (``$TETHER_HOME/data``); else the command refuses in one line that
  lists them and says how to choose. So when the stack a command used ends, the next command
  falls back to the one still running. :func:`choose` makes that decision, without I/O.
- **The token a command presents** to a stack's relay (``--relay`` naming it too) is that stack's,
  unless ``$TETHER_TOKEN`` or the profile that named the relay gives one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "StackRecord",
    "choose",
    "live_stacks",
    "read_token",
    "record_stack",
    "stack_at",
    "unrecord_stack",
    "write_token",
]


@dataclass(frozen=True)
class StackRecord:
    relay: str  #: ``ws://127.0.0.1:PORT``
    data_dir: Path
    pid: int
    #: the process's start time (``/proc/PID/stat``'s, in clock ticks; "" where unknown)
    started: str = ""
    #: when it became ready (seconds since the epoch)
    since: float = 0.0

    def describe(self) -> str:
        return f"{self.data_dir} ({self.relay})"


def choose(stacks: list[StackRecord], wanted: Path | None, default_dir: Path) -> StackRecord | str:
    """The stack a command uses, or why none (one line, without ``tether:``): ``wanted`` (a data
    directory) if it runs; else the only one; else the default data directory's; else none."""
    if wanted is not None:
        for stack in stacks:
            if stack.data_dir == wanted:
                return stack
        running = "; running: " + ", ".join(s.describe() for s in stacks) if stacks else ""
        return f"no `tether up` serves the data directory {wanted}{running}"
    if not stacks:
        return (
            "no relay to talk to. Start one with `tether up` (in another terminal), "
            "or pass --relay ws://HOST:PORT / set TETHER_RELAY."
        )
    if len(stacks) == 1:
        return stacks[0]
    for stack in stacks:
        if stack.data_dir == default_dir:
            return stack
    listed = ", ".join(s.describe() for s in stacks)
    return (
        f"{len(stacks)} `tether up` stacks run here: {listed}; choose one with --stack DATA_DIR "
        "(or TETHER_STACK=DATA_DIR), or --relay URL"
    )


def _records_dir(home: Path) -> Path:
    return home / "stacks"


def _record_path(home: Path, data_dir: Path) -> Path:
    key = hashlib.sha256(str(data_dir).encode()).hexdigest()[:16]
    return _records_dir(home) / f"{key}.json"


def _start_time(pid: int) -> str | None:
    """The process's start time from ``/proc`` ("" where there is no ``/proc``; ``None``: no
    such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if not Path("/proc/self/stat").exists():  # no /proc here: the pid is all there is
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return None
            except PermissionError:
                pass
            return ""
        return None
    except OSError:
        return None
    # after the command's name (in parentheses, which may hold spaces), field 22 is the start
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""


def record_stack(home: Path, relay: str, data_dir: Path) -> None:
    """Record this process's stack (it serves ``relay`` for ``data_dir``)."""
    pid = os.getpid()
    record = {
        "relay": relay,
        "data_dir": str(data_dir),
        "pid": pid,
        "started": _start_time(pid) or "",
        "since": time.time(),
    }
    path = _record_path(home, data_dir)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = path.with_suffix(f".{pid}.tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(record))
    partial.replace(path)


def unrecord_stack(home: Path, data_dir: Path) -> None:
    """Remove this process's record of ``data_dir``'s stack (another's is left alone)."""
    path = _record_path(home, data_dir)
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()


def live_stacks(home: Path) -> list[StackRecord]:
    """The stacks whose process still runs, oldest first; records of ended ones are removed."""
    found = []
    try:
        paths = sorted(_records_dir(home).glob("*.json"))
    except OSError:
        return []
    for path in paths:
        try:
            data = json.loads(path.read_text())
            record = StackRecord(
                relay=str(data["relay"]),
                data_dir=Path(data["data_dir"]),
                pid=int(data["pid"]),
                started=str(data.get("started") or ""),
                since=float(data.get("since") or 0.0),
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
        now = _start_time(record.pid)
        if now is None or (record.started and now and now != record.started):
            with contextlib.suppress(OSError):
                path.unlink()  # its process is gone (killed): nothing serves there any more
            continue
        found.append(record)
    return sorted(found, key=lambda r: r.since)


def stack_at(home: Path, relay: str) -> StackRecord | None:
    """The running stack whose relay is ``relay`` (``localhost`` taken as 127.0.0.1)."""
    wanted = relay.rstrip("/").replace("://localhost:", "://127.0.0.1:")
    for stack in live_stacks(home):
        if stack.relay.rstrip("/") == wanted:
            return stack
    return None


def read_token(data_dir: Path) -> str:
    """The local user's token of ``data_dir``'s stack, or "" (none yet, or not ours to read)."""
    try:
        return (data_dir / "token").read_text().strip()
    except OSError:
        return ""


def write_token(data_dir: Path, token: str) -> Path:
    """Keep the local user's token in ``data_dir`` (readable by its owner only)."""
    path = data_dir / "token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return path
