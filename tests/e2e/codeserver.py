"""Real VS Code for end-to-end tests: code-server (pinned in ``tests/e2e/codeserver/``), with
tether's extension installed from the ``.vsix`` the build makes, driven in Debian's Chromium by
``node/vscode_driver.mjs`` (playwright-core).

The first test that needs it installs code-server into ``.vscode-test/`` at the repository's root
(``tests/e2e/codeserver/install``: node 24 and npm 10 from npm, then code-server, whose native
modules build here; about 3 minutes, once per lock file). Without Chromium, or where that cannot be
done, the tests skip saying why; with ``TETHER_REQUIRE_VSCODE=1`` (CI) they fail.

What the extension did is read from its trace file (``tether.traceFile``): every DAP message
between VS Code and the adapter, and the extension's own events, a JSON line each.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from browser import SHOTS, chromium, keep
from stack import REPO, Proc, home_env, stop

INSTALLER = Path(__file__).resolve().parent / "codeserver" / "install"
INSTALLED = REPO / ".vscode-test"
EXTENSION = REPO / "editors" / "vscode"
DRIVER = Path(__file__).resolve().parent / "node" / "vscode_driver.mjs"
#: where `tether` lives for the extension (the tests' own venv)
TETHER_BIN = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin"


def unavailable(why: str) -> None:
    if os.environ.get("TETHER_REQUIRE_VSCODE") == "1":
        pytest.fail(why)
    pytest.skip(why)


async def install_code_server() -> Path:
    """code-server's executable, installed if it is not (once per lock file)."""
    if shutil.which("npm") is None:
        unavailable("the VS Code tests need npm (to install code-server)")
    done = await _run(["bash", str(INSTALLER), str(INSTALLED)], timeout=900)
    if done.returncode != 0:
        unavailable(f"could not install code-server: {done.stderr.decode()[-2000:]}")
    return Path(done.stdout.decode().strip().splitlines()[-1])


async def build_vsix(out: Path) -> Path:
    """The extension packaged as the build does (``./dev vsix``), into ``out``."""
    vsix = out / "tether-vscode.vsix"
    done = await _run(
        ["npm", "run", "--silent", "package", "--", "--out", str(vsix)], cwd=EXTENSION
    )
    assert done.returncode == 0, (done.stdout + done.stderr).decode()
    return vsix


async def _run(
    argv: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[bytes]:  # fmt: skip
    with trio.fail_after(timeout):
        return await trio.run_process(
            argv, cwd=cwd, env=env, capture_stdout=True, capture_stderr=True, check=False
        )


class Trace:
    """The extension's trace file, read as it grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._read = 0

    def refresh(self) -> list[dict[str, Any]]:
        if self.path.exists():
            with self.path.open("rb") as f:
                f.seek(self._read)
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]
            self._read += len(complete)
            self.events.extend(json.loads(line) for line in complete.splitlines() if line)
        return self.events

    async def wait(
        self, what: str, match: Callable[[dict[str, Any]], bool], *, timeout: float = 60
    ) -> dict[str, Any]:
        """The first event (from the start) that ``match``es. The file is written by another
        process with no way to be told; it is read again every 50 ms until the deadline."""
        with trio.move_on_after(timeout):
            while True:
                found = next((e for e in self.refresh() if match(e)), None)
                if found is not None:
                    return found
                await trio.sleep(0.05)
        tail = "\n".join(json.dumps(e)[:300] for e in self.refresh()[-40:])
        raise AssertionError(f"no {what} in the extension's trace within {timeout:g} s:\n{tail}")

    def dap(self, to: str, kind: str, name: str) -> list[dict[str, Any]]:
        """The DAP messages of one kind (``event``/``response``/``request``) and name."""
        key = "event" if kind == "event" else "command"
        return [
            e["message"]
            for e in self.refresh()
            if e.get("to") == to
            and e["message"].get("type") == kind
            and e["message"].get(key) == name
        ]


def is_dap(to: str, kind: str, name: str, **body: Any) -> Callable[[dict[str, Any]], bool]:
    key = "event" if kind == "event" else "command"

    def match(e: dict[str, Any]) -> bool:
        m = e.get("message") or {}
        if e.get("to") != to or m.get("type") != kind or m.get(key) != name:
            return False
        got = m.get("body") or {}
        return all(got.get(k) == v for k, v in body.items())

    return match


class Ide:
    """One browser on code-server, driven a command at a time (``node/vscode_driver.mjs``)."""

    def __init__(self, proc: Proc, stdin: Any, shots: Path) -> None:
        self.proc = proc
        self.stdin = stdin
        self.shots = shots
        self.answered = 0

    async def do(self, command: str, *, timeout: float = 30, **args: Any) -> Any:
        await self.stdin.send_all(json.dumps({"do": command, **args}).encode() + b"\n")
        self.answered += 1
        await self.proc.wait_count(r'^\{"ok"', self.answered + 1, timeout=timeout)
        answers = [line for line in self.proc.lines if line.startswith('{"ok"')]
        said = json.loads(answers[self.answered])
        if not said["ok"]:
            raise AssertionError(
                f"VS Code: {command} {args} failed: {said['error']} (see {self.shots})"
            )
        return said.get("value")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@asynccontextmanager
async def vscode(
    tmp: Path, home: Path, folder: Path, shots_name: str
) -> AsyncIterator[tuple[Ide, Trace]]:
    """code-server on ``folder`` with the extension from a fresh .vsix, its `tether` commands
    living in ``home``; a browser on it. Yields the driver and the extension's trace."""
    executable = chromium()  # skips (or fails in CI) without Chromium
    server = await install_code_server()
    vsix = await build_vsix(tmp)
    data, extensions = tmp / "code-data", tmp / "code-extensions"
    settings = data / "User" / "settings.json"
    settings.parent.mkdir(parents=True)
    trace = Trace(tmp / "tether-trace.jsonl")
    settings.write_text(
        json.dumps(
            {
                "tether.traceFile": str(trace.path),
                # VS Code's server takes PATH from a login shell: name the tests' own tether
                "tether.path": str(TETHER_BIN / "tether"),
                "tether.refreshSeconds": 2,
                "workbench.startupEditor": "none",
                "workbench.tips.enabled": False,
                "workbench.secondarySideBar.defaultVisibility": "hidden",
                "chat.disableAIFeatures": True,
                "security.workspace.trust.enabled": False,
                "telemetry.telemetryLevel": "off",
                "extensions.autoCheckUpdates": False,
                "debug.openDebug": "openOnDebugBreak",
                "debug.internalConsoleOptions": "neverOpen",
            }
        )
    )
    env = {
        **home_env(home),
        "PATH": f"{TETHER_BIN}:{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
    }
    installed = await _run(
        [str(server), "--extensions-dir", str(extensions), "--user-data-dir", str(data),
         "--install-extension", str(vsix)],
        env=env,
    )  # fmt: skip
    assert installed.returncode == 0, (installed.stdout + installed.stderr).decode()
    port = free_port()
    shots = SHOTS / shots_name
    shots.mkdir(parents=True, exist_ok=True)
    async with (
        _process(
            [str(server), "--auth", "none", "--bind-addr", f"127.0.0.1:{port}",
             "--disable-telemetry", "--disable-update-check", "--disable-workspace-trust",
             "--reconnection-grace-time", "30", "--extensions-dir", str(extensions),
             "--user-data-dir", str(data), str(folder)],
            env, "code-server",
        ) as code,
    ):  # fmt: skip
        await code.proc.wait_line(r"HTTP server listening on", timeout=60)
        url = f"http://127.0.0.1:{port}/?folder={folder}"
        driver_env = {**os.environ, "CHROMIUM": executable}
        async with _process(
            ["node", str(DRIVER), url, str(shots)], driver_env, "vscode driver", cwd=DRIVER.parent
        ) as driver:
            await driver.proc.wait_line(r'^\{"ok"', timeout=90)
            first = json.loads(driver.proc.lines[0]) if driver.proc.lines else {}
            assert first.get("ok"), f"VS Code did not load: {first}\n{code.proc.output[-3000:]}"
            assert driver.stdin is not None
            ide = Ide(driver.proc, driver.stdin, shots)
            try:
                yield ide, trace
            finally:
                keep(shots)


class _Running:
    def __init__(self, proc: Proc, stdin: Any) -> None:
        self.proc = proc
        self.stdin = stdin


@asynccontextmanager
async def _process(
    argv: list[str], env: dict[str, str], name: str, *, cwd: Path | None = None
) -> AsyncIterator[_Running]:
    """A process whose stdout is read line by line (stderr to ours), stopped at the end."""
    process = await trio.lowlevel.open_process(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        cwd=str(cwd or REPO),
        start_new_session=True,
    )
    proc = Proc(process, name)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(proc.pump)
        try:
            yield _Running(proc, process.stdin)
        finally:
            with trio.CancelScope(shield=True):
                await stop(process)
                nursery.cancel_scope.cancel()
