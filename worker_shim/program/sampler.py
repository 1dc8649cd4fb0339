"""The Python stacks of a run's processes, read without stopping them (``tether stacks RUN``).

The worker knows its program's pid; the run's processes are that process and its descendants
(``/proc``). Each Python one among them (not tether's own: the debugger's adapter, the guard,
the launcher of a non-Python command) is read with ``py-spy dump --json --nonblocking``: py-spy
reads the process's memory (``process_vm_readv``) and never stops it, so a rank blocked in a
collective's native code shows the Python frame it called from. py-spy runs as the run's uid
(on a worker that gives programs uids of their own), which may read its own processes with no
capability; its binary comes from the runtime the worker publishes for programs
(``identity.Runtime``). What it cannot read is said per process (``stack unreadable: <why>``).

The answer is one JSON object: ``program`` (its pid) and ``processes``, a list of
:class:`~protocol_specs.session.stacks.ProcessStack` (state
``running``: which are paused is the relay's to say, from the worker's ``paused`` statuses); the
user's side merges and renders it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path, PurePath

import trio

from protocol_specs.session.processes import MAIN, ProcessInfo
from protocol_specs.session.stacks import (
    ProcessStack,
    ThreadStack,
    as_workdir,
    threads_from_pyspy,
)

from .identity import ProgramUser, spawn_options
from .process_names import ProcFacts, describe, read_proc

__all__ = ["MAX_PROCESSES", "run_processes", "sample_stacks"]

log = logging.getLogger("tether.worker")

#: the most processes read per request (a DataLoader per rank: 64 ranks x 8 workers fit)
MAX_PROCESSES = 1024
#: py-spy runs read at once, and how long one may take
_AT_ONCE = 8
_TIMEOUT = 20.0
#: tether's own processes among the program's descendants (not sampled)
_TETHERS = frozenset({"_tether_debugpy_adapter.py", "_tether_guard.py", "_tether_launch.py"})


def run_processes(program: int, proc: str = "/proc") -> list[int]:
    """``program`` and its descendants, parents before children."""
    children: dict[int, list[int]] = {}
    for name in os.listdir(proc):
        if name.isdecimal():
            ppid = read_proc(int(name), proc).ppid
            if ppid is not None:
                children.setdefault(ppid, []).append(int(name))
    found: list[int] = []
    todo = [program]
    while todo and len(found) < MAX_PROCESSES:
        pid = todo.pop(0)
        found.append(pid)
        todo += sorted(children.get(pid, []))
    return found


def _is_python(pid: int, facts: ProcFacts) -> bool:
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = facts.cmdline[0] if facts.cmdline else ""
    return PurePath(exe).name.startswith("python")


def _tethers(facts: ProcFacts) -> bool:
    return any(
        PurePath(arg).name in _TETHERS or arg == "debugpy.adapter" or "/debugpy/adapter" in arg
        for arg in facts.cmdline[:4]
    )


async def sample_stacks(
    program: int,
    pyspy: Path | None,
    user: ProgramUser | None,
    *,
    paths: tuple[Path, str] | None = None,
) -> bytes:
    """The stacks of ``program``'s Python processes, as JSON (see the module's docstring).
    ``paths``: the run's directory here and the user's workdir it stands for (the frames' paths
    are shown under the latter: one file is one place on every node)."""
    pids = await trio.to_thread.run_sync(run_processes, program)
    facts = {pid: read_proc(pid) for pid in pids}
    infos: dict[int, ProcessInfo] = {}
    out: dict[int, ProcessStack] = {}
    for pid in pids:
        f = facts[pid]
        parent = infos.get(f.ppid or 0)
        info = describe(
            pid, f, parent=parent.key if parent else MAIN, nth=0, host="",
            key=MAIN if pid == program else None,
        )  # fmt: skip
        infos[pid] = info
        if not f.cmdline or _tethers(f) or not _is_python(pid, f):
            continue
        is_rank = info.rank is not None and (parent is None or parent.rank != info.rank)
        out[pid] = ProcessStack(
            pid=pid, name=info.title(parent), rank=info.rank if is_rank else None
        )
    limit = trio.CapacityLimiter(_AT_ONCE)
    local = () if paths is None else (str(paths[0]), str(await trio.Path(paths[0]).resolve()))

    async def one(pid: int) -> None:
        async with limit:
            threads, error = await _dump(pid, pyspy, user)
        if paths is not None:
            threads = as_workdir(threads, local, paths[1])
        out[pid] = out[pid].model_copy(update={"threads": threads, "error": error})

    async with trio.open_nursery() as nursery:
        for pid in out:
            nursery.start_soon(one, pid)
    processes = [p.model_dump(mode="json") for p in out.values()]
    return json.dumps({"program": program, "processes": processes}).encode()


async def _dump(
    pid: int, pyspy: Path | None, user: ProgramUser | None
) -> tuple[list[ThreadStack], str]:
    """One process's threads, or why they could not be read (one line)."""
    if pyspy is None:
        return [], "py-spy is not installed on the worker (pip install py-spy)"
    argv = [str(pyspy), "dump", "--pid", str(pid), "--json", "--nonblocking"]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "RUST_BACKTRACE": "0"}
    said = ""
    for _ in range(2):  # a read without stopping it may catch a stack mid-change: once more
        with trio.move_on_after(_TIMEOUT):
            try:
                done = await trio.run_process(
                    argv, capture_stdout=True, capture_stderr=True, check=False, env=env,
                    **spawn_options(user),
                )  # fmt: skip
            except OSError as exc:
                return [], f"cannot run py-spy: {exc.strerror or exc}"
            if done.returncode == 0:
                try:
                    return threads_from_pyspy(json.loads(done.stdout), pid), ""
                except ValueError:
                    said = "py-spy's answer was not JSON"
                    continue
            said = _first_error(done.stderr + done.stdout) or f"py-spy exited {done.returncode}"
            if not await trio.Path(f"/proc/{pid}").exists():
                return [], "the process ended"
            continue
        said = f"py-spy did not answer within {_TIMEOUT:g} s"
    log.info("stacks of process %s: %s", pid, said)
    return [], said


def _first_error(said: bytes) -> str:
    """py-spy's ``Error: ...`` line, with the cause when it names one; a refusal to read the
    process (it says ``Permission Denied`` on stdout) as such."""
    text = said.decode(errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    error = next((ln.removeprefix("Error: ") for ln in lines if ln.startswith("Error:")), "")
    cause = next((ln.split(": ", 1)[-1] for ln in lines if ln.startswith("0: ")), "")
    if any(word in text.lower() for word in ("permission denied", "operation not permitted")):
        return "not permitted to read the process (py-spy: permission denied)"
    if cause and cause not in error:
        error = f"{error} ({cause})"
    return error[:300]
