"""A shell on a terminal for a tunnel (``tether shell``): a login shell on a new pseudo-terminal,
in the run's directory with the run's environment.

The shell leads a session of its own whose controlling terminal is the PTY, so the terminal's
line discipline does what a local terminal does: the user's side sends raw keys (Ctrl-C is the
byte ``\\x03``, and the kernel signals the shell's foreground job), and a ``resize`` sets the
window size (the kernel sends ``SIGWINCH``). What the terminal shows goes down as ``data`` on fd
1; when the shell exits, what it wrote last is read out, and its exit status is returned.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import signal
import struct
import termios
from contextlib import suppress
from pathlib import Path

import trio

from protocol_specs.wire.tunnels import CHUNK, TunnelSpec
from protocol_specs.wire.wire import TunnelEntry
from relay.client import RunLink, tunnel_steps

from .debuggee import terminate_group
from .identity import ProgramUser, spawn_options

__all__ = ["run_shell", "set_size"]

#: after the shell exited, how long what it wrote last may take to be read (a background job
#: that keeps the terminal open would otherwise hold the tunnel)
DRAIN = 0.5


def set_size(fd: int, cols: int, rows: int) -> None:
    """The terminal's window size (the kernel tells the foreground job: ``SIGWINCH``)."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _shell(env: dict[str, str]) -> list[str]:
    """The user's shell as a login shell: ``$SHELL`` if it exists here, else bash, else sh."""
    for candidate in (env.get("SHELL", ""), "bash", "sh"):
        path = shutil.which(candidate) if candidate else None
        if path:
            return [path, "-l"]
    return ["/bin/sh", "-l"]


def _controlling_terminal() -> None:  # pragma: no cover (runs in the child)
    """In the child, after ``setsid``: its stdin (the PTY) becomes its controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


async def run_shell(
    link: RunLink, spec: TunnelSpec, cwd: Path, env: dict[str, str], user: ProgramUser | None = None
) -> tuple[int | None, str]:
    """``user``: the shell runs as that uid, owning its terminal as a login's does."""
    master, slave = os.openpty()
    try:
        set_size(slave, spec.cols, spec.rows)
        if user is not None:
            os.fchown(slave, user.uid, user.gid)
        process = await trio.lowlevel.open_process(
            _shell(env),
            cwd=str(cwd),
            env={**env, "TERM": spec.term},
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=_controlling_terminal,
            **spawn_options(user),
        )
    except OSError as exc:
        os.close(master)
        return 126, f"cannot start a shell: {exc.strerror or exc}"
    finally:
        os.close(slave)  # the shell holds it now: when it (and its jobs) end, reads get EIO
    terminal = trio.lowlevel.FdStream(master)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_keys, link, terminal, master, process.pid)
            shown = trio.Event()
            nursery.start_soon(_screen, link, terminal, shown)
            code = await process.wait()
            with trio.move_on_after(DRAIN):
                await shown.wait()
            nursery.cancel_scope.cancel()
    finally:
        if process.returncode is None:  # cancelled: the attempt ended
            with trio.CancelScope(shield=True):
                await terminate_group(process)
        with trio.CancelScope(shield=True):
            await terminal.aclose()
    return (128 - code if code < 0 else code), ""


async def _screen(link: RunLink, terminal: trio.lowlevel.FdStream, shown: trio.Event) -> None:
    """What the terminal shows, down the tunnel, until nothing holds it open any more."""
    try:
        while chunk := await terminal.receive_some(CHUNK):
            await link.publish(TunnelEntry(op="data", fd=1, data=bytes(chunk), transient=True))
    except trio.BrokenResourceError as exc:
        cause = exc.__cause__
        if not (isinstance(cause, OSError) and cause.errno == errno.EIO):
            raise  # EIO: every process let go of the terminal; anything else is not the end
    except trio.ClosedResourceError:
        pass
    shown.set()


async def _keys(link: RunLink, terminal: trio.lowlevel.FdStream, master: int, pid: int) -> None:
    """What comes up the tunnel, to the terminal: keys, the window's size, and a hang-up (the
    user's side went: ``SIGHUP`` to the shell's session, as a closed terminal does)."""
    async for entry in tunnel_steps(link):
        if entry.op == "data":
            with suppress(OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                await terminal.send_all(entry.data)
        elif entry.op == "resize" and entry.cols and entry.rows:
            with suppress(OSError):
                set_size(master, entry.cols, entry.rows)
        elif entry.op == "signal" and entry.detail == "SIGHUP":
            with suppress(OSError):
                os.killpg(pid, signal.SIGHUP)
