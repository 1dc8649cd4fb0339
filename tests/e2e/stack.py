"""Real tether processes for end-to-end tests: `tether up`, `tether worker`, `tether debug`.

Each process is started with the installed console script, its stdout read line by line; readiness is a
line it prints (never a sleep). On exit, SIGINT, then SIGKILL after a deadline.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio
from leaks import PROCESS_LINES

TETHER = str(Path(sys.executable).with_name("tether"))
REPO = Path(__file__).resolve().parents[2]
PROJECT = Path(__file__).resolve().parent / "project"


@dataclass
class Proc:
    process: trio.Process
    name: str
    lines: list[str] = field(default_factory=list)
    _changed: trio.Event = field(default_factory=trio.Event)
    eof: bool = False

    async def pump(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for raw in complete:
                self.lines.append(raw.decode(errors="replace"))
                PROCESS_LINES.append(self.lines[-1])  # scanned for secrets after the test
            self._changed.set()
            self._changed = trio.Event()
        if buffer:
            self.lines.append(buffer.decode(errors="replace"))
        self.eof = True
        self._changed.set()

    async def wait_line(self, pattern: str, *, timeout: float = 60) -> re.Match[str]:
        regex = re.compile(pattern)
        seen = 0
        with trio.move_on_after(timeout):
            while True:
                for line in self.lines[seen:]:
                    if m := regex.search(line):
                        return m
                seen = len(self.lines)
                if self.eof:
                    raise AssertionError(
                        f"{self.name} ended without printing {pattern!r}:\n{self.output}"
                    )
                await self._changed.wait()
        raise AssertionError(
            f"{self.name} did not print {pattern!r} within {timeout:g} s:\n{self.output}"
        )

    async def wait_count(self, pattern: str, count: int, *, timeout: float = 60) -> None:
        """Until ``count`` lines match ``pattern`` (a line printed again, later)."""
        regex = re.compile(pattern)
        with trio.move_on_after(timeout):
            while sum(1 for line in self.lines if regex.search(line)) < count:
                if self.eof:
                    raise AssertionError(f"{self.name} ended before {count} x {pattern!r}")
                await self._changed.wait()
            return
        raise AssertionError(f"{self.name}: not {count} x {pattern!r} in {timeout:g} s")

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


def local_token(home: Path, data: Path | None = None) -> str:
    """The local user's token of the `tether up` whose data directory is ``data`` (default: the
    tests' ``home/data``): it keeps it there, not in the config file."""
    return ((data or home / "data") / "token").read_text().strip()


def home_env(home: Path) -> dict[str, str]:
    """The environment of a tether command living in ``home`` (its config file too: where
    `tether up` keeps the local user's token)."""
    env = {**os.environ, "TETHER_HOME": str(home), "TETHER_CONFIG": str(home / "config.toml")}
    for active in ("VIRTUAL_ENV", "CONDA_PREFIX"):  # the developer's shell's: a test says its own
        env.pop(active, None)
    return env


@asynccontextmanager
async def tether(
    *args: str,
    home: Path,
    name: str | None = None,
    cwd: Path | None = None,
    extra_env: dict[str, str] | None = None,
    prefix: list[str] | None = None,
) -> AsyncIterator[Proc]:
    """``tether ARGS`` (behind ``prefix``: ``ip netns exec NODE``, say), its output pumped."""
    env = {**home_env(home), "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    process = await trio.lowlevel.open_process(
        [*(prefix or []), TETHER, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=str(cwd or REPO),
        start_new_session=True,
    )
    proc = Proc(process, name or args[0])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(proc.pump)
        try:
            yield proc
        finally:
            with trio.CancelScope(shield=True):
                await stop(process)
                nursery.cancel_scope.cancel()


async def status_saying(home: Path, run_id: str, text: str, *, timeout: float = 30) -> str:
    """``tether status RUN``'s output once it says ``text`` (what the worker reports after a
    while, such as a pause, which no event announces to a client)."""
    with trio.fail_after(timeout):
        while True:
            async with tether("status", run_id, home=home, name="status") as status:
                await status.process.wait()
            if text in status.output:
                return status.output


async def stop(process: trio.Process, *, grace: float = 10) -> None:
    if process.returncode is None:
        try:
            os.killpg(process.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        with trio.move_on_after(grace):
            await process.wait()
    if process.returncode is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await process.wait()


async def admin_token(home: Path, redis: str) -> None:
    """The first token of a standalone relay, made in its store as an operator does
    (`tether token create --redis URL --save`), saved in ``home``'s config file."""
    async with tether(
        "token", "create", "--redis", redis, "--scope", "admin", "--scope", "runs",
        "--scope", "backend", "--save", home=home, name="token",
    ) as proc:  # fmt: skip
        await proc.wait_line(r"saved in")
        with trio.fail_after(30):
            assert await proc.process.wait() == 0, proc.output


#: ``isolated=False``: programs run as the worker's own user (``--no-isolation``), as on one
#: user's machine, where they may use what that user made (a venv under pytest's tmp_path, which
#: is root's only): tests of another feature that need that say so. Otherwise a root worker (the
#: tests run as root) gives each program a uid of its own.
def _isolation(isolated: bool) -> tuple[str, ...]:
    return () if isolated else ("--no-isolation",)


def runnable_by_anyone(program: str) -> bool:
    """Whether a uid of a program's own may run ``program`` (a bare name: found on its PATH)."""
    from worker_shim.program.identity import ProgramUser

    return os.sep not in program or ProgramUser(65534).can_run(program)


def program_python() -> str | None:
    """An interpreter a program with a uid of its own may run, for a test's script to name (the
    tests' own may live under /root, as pyenv's does); ``None`` if none is: such a test then runs
    its programs as the worker's user (``isolated=False``)."""
    from worker_shim.program.identity import ProgramUser

    anyone = ProgramUser(65534)
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if anyone.can_run(candidate):
            return candidate
    return None


@asynccontextmanager
async def relay_stack(
    home: Path, *, workers: int = 0, isolated: bool = True, flags: tuple[str, ...] = ()
) -> AsyncIterator[tuple[Proc, str]]:
    """`tether up` with the bundled server (and ``flags``: its relay's timers, say); yields
    (process, relay URL)."""
    async with tether(
        "up",
        *flags,
        "--data-dir",
        str(home / "data"),
        "--workers",
        str(workers),
        "--relay-port",
        "0",
        *_isolation(isolated),
        home=home,
    ) as up:
        m = await up.wait_line(r"tether up: ready relay=(\S+)")
        yield up, m.group(1)


@asynccontextmanager
async def worker(
    home: Path, relay: str, *, slots: int = 1, isolated: bool = True
) -> AsyncIterator[Proc]:
    async with tether(
        "worker",
        "--relay",
        relay,
        "--slots",
        str(slots),
        "--work-dir",
        str(home / "worker"),
        *_isolation(isolated),
        home=home,
    ) as proc:
        await proc.wait_line(r"tether worker: ready")
        yield proc


@asynccontextmanager
async def debug_run(
    home: Path,
    relay: str,
    workdir: Path,
    *command: str,
    extra: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
) -> AsyncIterator[tuple[Proc, str, int]]:
    """`tether debug --port 0`; yields (process, run id, adapter port)."""
    async with tether(
        "debug",
        "--relay",
        relay,
        "--port",
        "0",
        "--workdir",
        str(workdir),
        *extra,
        "--",
        *command,
        home=home,
        name="debug",
        extra_env=extra_env,
    ) as proc:
        m = await proc.wait_line(r"tether debug: run (\S+) \w+; adapter on 127\.0\.0\.1:(\d+)")
        yield proc, m.group(1), int(m.group(2))


@asynccontextmanager
async def relay_process(
    home: Path, redis: str, name: str, flags: tuple[str, ...] = (), *, verbose: bool = False
) -> AsyncIterator[tuple[Proc, int]]:
    """`tether relay` on ``redis`` with ``flags`` (its timers, say); yields (process, port)."""
    async with tether(
        *(["-v"] if verbose else []), "relay", "--redis", redis, "--port", "0", *flags,
        home=home, name=name,
    ) as proc:  # fmt: skip
        m = await proc.wait_line(r"tether relay: ready relay=ws://127\.0\.0\.1:(\d+)")
        yield proc, int(m.group(1))
