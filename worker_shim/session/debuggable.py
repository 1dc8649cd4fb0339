"""A plain run's program, debuggable later: how it starts, and the worker's end of its line.

Theory of operation
-------------------
A Python program of a plain run (``tether run``, ``spec.debuggable``) starts under the boot
script in attachable mode (``_tether_debugpy_boot.py --tether-attach PATH``): it runs as plain
``python`` would, connected to a unix socket the worker listens on (``PATH``, in a private
directory), with nothing of the debugger loaded. The line carries text lines:

- ``attach`` (worker -> program): an IDE attached to the run; the program starts debugpy
  listening and answers with its adapter's port (or ``error: why``);
- ``post-mortem PORT`` (program -> worker, unasked; ``spec.post_mortem``): an uncaught exception
  is about to end a thread; debugpy listens at ``PORT`` and the thread waits for the worker's
  configuration, then stops in its raising frame;
- ``pause PORT`` (program -> worker, unasked; ``spec.debug_when``): a ``tether.report`` call met
  the condition; as for a post-mortem, then the thread stops in the caller's frame.

Either way the worker connects to debugpy and the run goes on as a debug run
(:func:`worker_shim.shim._run_debug`, with what this attempt took off the link meanwhile).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from protocol_specs.runs.runs import RunRecord
from protocol_specs.wire import wire
from relay.client import RunLink

from ..program.python_command import (
    build_attachable_argv,
    check_python,
    debugpy_home,
    is_python,
    resolve_python,
    split_python_command,
)
from ..program.quarters import Quarters
from .core import parse_delivery, terminates

__all__ = ["ATTACH_BACKLOG", "Debugged", "attach_listener", "attachable_argv", "until_debugged"]

log = logging.getLogger("tether.worker")

#: the most ``to_worker`` entries a plain run keeps for an IDE that attaches (its configuration)
ATTACH_BACKLOG = 10_000
#: how long the program may take to connect to the worker's socket once an IDE wants it
CONNECT_TIMEOUT = 60.0


async def attachable_argv(
    record: RunRecord, quarters: Quarters, env: dict[str, str], python: str
) -> tuple[list[str], str] | None:
    """How a plain run's program starts so that an IDE can attach later (``spec.debuggable``):
    its argv and the unix socket it connects to (in the attempt's private directory). ``None``:
    it runs plain (not asked for, not a Python command, or an interpreter debugpy cannot run)."""
    spec = record.spec
    command = spec.command
    if not spec.debuggable or not (is_python(command[0]) or command[0].endswith(".py")):
        return None
    run_dir, user = str(quarters.run_dir), quarters.user
    try:
        split_python_command(command)
        if is_python(command[0]) or user is not None:
            program = command[0] if is_python(command[0]) else "python"
            python = resolve_python(program, env=env, cwd=run_dir, user=user)
        await check_python(python, env=env, cwd=run_dir, user=user)
    except ValueError as exc:
        log.info("run %s runs without a way to attach later: %s", record.id, exc)
        return None
    socket_path = str(quarters.private / "attach.sock")
    home = str(debugpy_home(quarters.private, quarters.runtime))
    argv = build_attachable_argv(
        command, python=python, home=home, socket=socket_path, post_mortem=spec.post_mortem,
        runtime=quarters.runtime,
    )  # fmt: skip
    return argv, socket_path


async def attach_listener(path: str, quarters: Quarters | None = None) -> trio.socket.SocketType:
    """The unix socket a debuggable program connects to at its start, before its own code
    (handed to the attempt's user: the only one but the worker who may connect)."""
    listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    try:
        await listener.bind(path)
        if quarters is not None:
            quarters.hand_over(Path(path))
        listener.listen(1)
    except OSError:
        listener.close()
        raise
    return listener


@dataclass(frozen=True)
class Debugged:
    """debugpy listens in the program at ``port``: an IDE attached, or (``post_mortem``) an
    uncaught exception holds a thread; ``backlog``: what the link delivered until then."""

    port: int
    post_mortem: bool
    backlog: list[wire.Deliver]
    #: it stopped where ``--debug-when`` was met (``post_mortem`` too: nobody waits for an IDE)
    pause: bool = False


def parse_line(line: str) -> tuple[int | None, bool]:
    """A line from the program: (the port of debugpy's adapter, whether the program stopped
    itself: a post-mortem, or a ``pause`` where ``--debug-when`` was met); (None, False) for
    ``error: why`` or anything else."""
    words = line.split()
    post_mortem = words[:1] in (["post-mortem"], ["pause"])
    word = words[1] if post_mortem and len(words) > 1 else (words[0] if words else "")
    if word.isdecimal() and 0 < int(word) < 65536:
        return int(word), post_mortem
    return None, False


async def until_debugged(
    link: RunLink,
    record: RunRecord,
    process: trio.Process,
    terminate: Callable[[], Awaitable[None]],
    listener: trio.socket.SocketType,
    say: Callable[[str], None],
    *,
    on_entry: Callable[[wire.AnyEntry | None], object] = lambda _entry: None,
) -> Debugged | None:
    """Watch a debuggable plain run until debugpy listens in its program (:class:`Debugged`),
    or ``None`` once the program exited; a ``terminate`` meant for this attempt is done at once,
    and every entry goes to ``on_entry`` too (tunnels to open)."""
    seen: deque[wire.Deliver] = deque(maxlen=ATTACH_BACKLOG)
    found: list[tuple[int, bool, bool]] = []
    connected = trio.Event()
    streams: list[trio.SocketStream] = []

    async def stop_at_exit() -> None:
        await process.wait()
        nursery.cancel_scope.cancel()

    async def read_program() -> None:
        conn, _addr = await listener.accept()  # it connects when it starts
        stream = trio.SocketStream(conn)
        streams.append(stream)
        connected.set()
        buffer = b""
        while chunk := await stream.receive_some(1024):
            buffer += chunk
            while b"\n" in buffer:
                raw, buffer = buffer.split(b"\n", 1)
                text = raw.decode(errors="replace").strip()
                port, post_mortem = parse_line(text)
                if port is None:
                    say(f"run {record.id}: the program could not start debugpy: {text}")
                    continue
                found.append((port, post_mortem, text.startswith("pause")))
                nursery.cancel_scope.cancel()
                return

    async def ask_attach() -> None:
        with trio.move_on_after(CONNECT_TIMEOUT) as waited:
            await connected.wait()
        if waited.cancelled_caught:
            say(f"run {record.id}: an IDE attached, but the program never connected to the worker")
            return
        try:
            await streams[0].send_all(b"attach\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the program is ending: its exit ends the watch

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_at_exit)
        nursery.start_soon(read_program)
        asked = False
        async for delivery in link.deliveries:
            seen.append(delivery)
            _cursor, entry = parse_delivery(delivery)
            on_entry(entry)
            if terminates(entry, record):
                await terminate()
            elif isinstance(entry, wire.PresenceEntry) and entry.attached and not asked:
                asked = True
                nursery.start_soon(ask_attach)
    for stream in streams:
        await stream.aclose()
    if not found:
        return None
    port, post_mortem, pause = found[0]
    return Debugged(port, post_mortem, list(seen), pause)
