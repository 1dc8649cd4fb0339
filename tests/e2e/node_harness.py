"""Drive a DAP server with Microsoft's DebugClient (node), following VS Code's attach sequence.

``node/vscode_scenario.mjs`` runs a scenario (format: ``node/SCENARIO.md``); this module installs its
pinned npm dependencies, runs it and returns ``(result, messages)``: the runner's result object and
every message it received from the adapter, in order, exactly as received.

- ``run_vscode_session(scenario, timeout=...)``: blocking; for sync tests or ``trio.to_thread``.
- ``open_vscode_session(scenario, timeout=...)``: async context manager for trio tests whose scenario
  has ``mark`` steps (the test does something at a known point of the session, then releases it).
- ``vscode_initialize()`` / ``vscode_attach(...)`` / ``scenario(...)``: VS Code's own arguments.
- ``normalise(...)``: strip what legitimately differs between two adapters (seq, ids, timings).
- ``session_messages(...)`` / ``sessions_by_kind(...)``: one session's share of a multi-process run
  (the runner opens a child session for every ``startDebugging`` request, as VS Code does).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from protocol_specs.dap.capabilities import VSCODE_INITIALIZE

__all__ = [
    "NODE_DIR",
    "RUNNER",
    "NodeHarnessError",
    "VscodeSession",
    "ensure_node_modules",
    "normalise",
    "open_vscode_session",
    "run_vscode_session",
    "scenario",
    "session_messages",
    "sessions_by_kind",
    "vscode_attach",
    "vscode_initialize",
]

NODE_DIR = Path(__file__).resolve().parent / "node"
RUNNER = NODE_DIR / "vscode_scenario.mjs"
TESTSUPPORT = "@vscode/debugadapter-testsupport"
TESTSUPPORT_VERSION = "1.68.0"

Result = dict[str, Any]
Messages = list[dict[str, Any]]


class NodeHarnessError(RuntimeError):
    """The scenario could not run, or a step failed. ``result``/``messages``/``stderr`` say why."""

    def __init__(
        self,
        message: str,
        *,
        result: Result | None = None,
        messages: Messages | None = None,
        stderr: str = "",
    ) -> None:
        self.result = result
        self.messages = messages or []
        self.stderr = stderr
        details = [message]
        if self.messages:
            tail = "\n".join(json.dumps(m)[:300] for m in self.messages[-8:])
            details.append(f"last messages from the adapter:\n{tail}")
        if stderr:
            details.append("runner stderr (tail):\n" + "\n".join(stderr.splitlines()[-25:]))
        super().__init__("\n".join(details))


# --- VS Code's own arguments (research/dap.md §2.2, §2.3) -------------------------------------------


def vscode_initialize(**overrides: Any) -> dict[str, Any]:
    """VS Code's ``initialize`` arguments, ``supportsStartDebuggingRequest: true`` included: the
    runner answers ``startDebugging`` and opens the child session as VS Code does. Pass
    ``supportsStartDebuggingRequest=False`` for a client that gets debugpy's ``debugpyAttach``
    events instead (the runner opens the child session for those too)."""
    args: dict[str, Any] = {**VSCODE_INITIALIZE, "supportsStartDebuggingRequest": True}
    args.update(overrides)
    return args


def vscode_attach(
    port: int,
    workspace: str | Path,
    *,
    remote_root: str | None = ".",
    **overrides: Any,
) -> dict[str, Any]:
    """The ``attach`` arguments VS Code sends for a "Remote Attach" configuration (``connect`` form)
    after the Python extension filled in its defaults. ``remote_root=None`` omits ``pathMappings``."""
    workspace = str(workspace)
    args: dict[str, Any] = {
        "name": "Python Debugger: Remote Attach",
        "type": "debugpy",
        "request": "attach",
        "connect": {"host": "127.0.0.1", "port": port},
        "justMyCode": True,
        "debugOptions": ["RedirectOutput", "ShowReturnValue"],
        "showReturnValue": True,
        "workspaceFolder": workspace,
        "clientOS": "unix",
        "__configurationTarget": 6,
        "__sessionId": str(uuid.uuid4()),
    }
    if remote_root is not None:
        args["pathMappings"] = [{"localRoot": workspace, "remoteRoot": remote_root}]
    args.update(overrides)
    return args


def scenario(
    port: int,
    workspace: str | Path,
    steps: list[dict[str, Any]],
    *,
    breakpoints: dict[str, list[Any]] | None = None,
    function_breakpoints: list[dict[str, Any]] | None = None,
    exception_filters: Iterable[str] = ("uncaught",),
    timeout_ms: int = 30_000,
    attach: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A scenario dict. ``breakpoints`` maps a file name relative to ``workspace`` (or an absolute
    path) to its breakpoints: line numbers or ``{"line", "condition", "hitCondition", "logMessage"}``."""
    ws = Path(workspace)
    return {
        "port": port,
        "timeoutMs": timeout_ms,
        "initialize": vscode_initialize(),
        "attach": attach if attach is not None else vscode_attach(port, ws),
        "breakpoints": [
            {"path": str(ws / name), "breakpoints": list(bps)}
            for name, bps in (breakpoints or {}).items()
        ],
        "functionBreakpoints": list(function_breakpoints or []),
        "exceptionFilters": list(exception_filters),
        "steps": steps,
        **extra,
    }


# --- running it -------------------------------------------------------------------------------------


def ensure_node_modules() -> None:
    """Install the pinned DebugClient (``npm ci``, from package-lock.json) unless it is there."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise NodeHarnessError(
            "the DebugClient end-to-end tests need node (>= 20) and npm on the PATH; "
            f"node={node!r} npm={npm!r}"
        )
    installed = NODE_DIR / "node_modules" / TESTSUPPORT / "package.json"
    if (
        installed.is_file()
        and json.loads(installed.read_text()).get("version") == TESTSUPPORT_VERSION
    ):
        return
    proc = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise NodeHarnessError(
            f"`npm ci` in {NODE_DIR} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )


def _prepare(spec: dict[str, Any], workdir: Path) -> tuple[Path, Path]:
    spec = dict(spec)
    spec.setdefault("record", str(workdir / "messages.jsonl"))
    path = workdir / "scenario.json"
    path.write_text(json.dumps(spec, indent=1))
    return path, Path(spec["record"])


def _read_messages(record: Path) -> Messages:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


def _parse_result(stdout: str) -> Result | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            result: Result = json.loads(line)
            return result
    return None


def _finish(
    stdout: str, stderr: str, returncode: int | None, record: Path, *, check: bool
) -> tuple[Result, Messages]:
    messages = _read_messages(record)
    result = _parse_result(stdout)
    if result is None:
        raise NodeHarnessError(
            f"the runner printed no result (exit status {returncode}); stdout:\n{stdout}",
            messages=messages,
            stderr=stderr,
        )
    if check and not result.get("ok"):
        raise NodeHarnessError(
            f"scenario failed: {result.get('error')}",
            result=result,
            messages=messages,
            stderr=stderr,
        )
    return result, messages


def run_vscode_session(
    spec: dict[str, Any], *, timeout: float, check: bool = True
) -> tuple[Result, Messages]:
    """Run one scenario to the end. Raises NodeHarnessError when a step fails (``check``), when the
    runner cannot start, or after ``timeout`` seconds (the runner is killed). ``mark`` steps print
    and go on; a ``mark`` with ``wait: true`` fails here (stdin is closed): use open_vscode_session."""
    ensure_node_modules()
    with tempfile.TemporaryDirectory(prefix="vscode-scenario-") as tmp:
        path, record = _prepare(spec, Path(tmp))
        try:
            proc = subprocess.run(
                ["node", str(RUNNER), str(path)],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise NodeHarnessError(
                f"the scenario did not finish within {timeout} s; stdout:\n{_text(exc.stdout)}",
                messages=_read_messages(record),
                stderr=_text(exc.stderr),
            ) from None
        return _finish(proc.stdout, proc.stderr, proc.returncode, record, check=check)


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


class VscodeSession:
    """A running scenario (see open_vscode_session)."""

    def __init__(self, process: trio.Process, record: Path) -> None:
        self._process = process
        self._record = record
        self.stdout_lines: list[str] = []
        self.stderr_lines: list[str] = []
        self._changed = trio.Event()
        self._eof = False

    async def _pump(self, stream: trio.abc.ReceiveStream, lines: list[str], notify: bool) -> None:
        buffer = b""
        async for chunk in stream:
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            lines.extend(raw.decode(errors="replace") for raw in complete)
            if notify:
                self._changed.set()
                self._changed = trio.Event()
        if buffer:
            lines.append(buffer.decode(errors="replace"))
        if notify:
            self._eof = True
            self._changed.set()

    async def wait_mark(self, name: str, *, timeout: float = 60) -> Any:
        """Wait until the runner reaches ``{"op": "mark", "name": name}``; returns its ``data``."""
        prefix = f"MARK {name} "
        seen = 0
        with trio.fail_after(timeout):
            while True:
                for line in self.stdout_lines[seen:]:
                    if line.startswith(prefix):
                        return json.loads(line[len(prefix) :])
                seen = len(self.stdout_lines)
                if self._eof:
                    raise NodeHarnessError(
                        f"the runner ended before mark {name!r}; stdout:\n"
                        + "\n".join(self.stdout_lines),
                        messages=_read_messages(self._record),
                        stderr="\n".join(self.stderr_lines),
                    )
                await self._changed.wait()

    async def release(self, name: str) -> None:
        """Let a ``mark`` step with ``wait: true`` go on."""
        assert self._process.stdin is not None
        await self._process.stdin.send_all(f"go {name}\n".encode())

    async def result(self, *, check: bool = True) -> tuple[Result, Messages]:
        """Wait for the runner to end and return ``(result, messages)``."""
        returncode = await self._process.wait()
        with trio.fail_after(10):
            while not self._eof:
                await self._changed.wait()
        return _finish(
            "\n".join(self.stdout_lines),
            "\n".join(self.stderr_lines),
            returncode,
            self._record,
            check=check,
        )


@asynccontextmanager
async def open_vscode_session(
    spec: dict[str, Any], *, timeout: float
) -> AsyncIterator[VscodeSession]:
    """Start the runner; the body may ``wait_mark``/``release`` and must end with ``await
    session.result()``. The whole body runs under ``trio.fail_after(timeout)``; on exit the runner is
    killed if it is still running."""
    ensure_node_modules()
    with tempfile.TemporaryDirectory(prefix="vscode-scenario-") as tmp:
        path, record = _prepare(spec, Path(tmp))
        process = await trio.lowlevel.open_process(
            ["node", str(RUNNER), str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ},
        )
        session = VscodeSession(process, record)
        try:
            with trio.fail_after(timeout):
                async with trio.open_nursery() as nursery:
                    assert process.stdout is not None and process.stderr is not None
                    nursery.start_soon(session._pump, process.stdout, session.stdout_lines, True)
                    nursery.start_soon(session._pump, process.stderr, session.stderr_lines, False)
                    yield session
                    await process.wait()
        finally:
            with trio.CancelScope(shield=True):
                if process.returncode is None:
                    process.kill()
                await process.wait()
                for stream in (process.stdin, process.stdout, process.stderr):
                    if stream is not None:
                        await stream.aclose()


# --- several sessions (startDebugging) --------------------------------------------------------------


def session_messages(result: Result, messages: Messages, session: int) -> Messages:
    """The messages session ``session`` (an index into ``result["sessions"]``) received, in order
    (``result["messageSessions"]`` says whose each recorded message is)."""
    owners: list[int] = result["messageSessions"]
    return [m for m, owner in zip(messages, owners, strict=True) if owner == session]


def sessions_by_kind(result: Result, kind: str) -> list[dict[str, Any]]:
    """The session summaries of one kind: ``"main"`` (connect/reconnect) or ``"child"``
    (``startDebugging`` / ``debugpyAttach``, in opening order)."""
    return [s for s in result["sessions"] if s["kind"] == kind]


# --- comparing two adapters ---------------------------------------------------------------------------

#: keys whose values are per-connection or per-process numbers, not behaviour
VOLATILE = frozenset(
    {
        "seq",
        "request_seq",
        "id",
        "threadId",
        "frameId",
        "hitBreakpointIds",
        "systemProcessId",
        "__sessionId",
        "ms",
        "durationMs",
        "t",
    }
)


def normalise(
    value: Any,
    *,
    volatile: frozenset[str] = VOLATILE,
    drop: frozenset[str] = frozenset(),
    paths: dict[str, str] | None = None,
) -> Any:
    """A copy of ``value`` (a result, a step, a message) fit for ``==`` across adapters: keys in
    ``drop`` removed; values under ``volatile`` keys replaced by ``"<key>"`` (lists element-wise);
    ``variablesReference``/``sourceReference`` reduced to 0 or ``"<ref>"`` (whether there are children
    / a source to fetch is behaviour, the number is not); string prefixes in ``paths`` replaced (for
    example ``{str(workspace): "<ws>"}``). Keys are matched wherever they occur, so a program
    variable called ``id`` or ``t`` in a ``values`` dict is masked too: name yours differently.
    Pass ``drop=frozenset({"raw"})`` to compare only the runner's summaries."""
    replacements = sorted((paths or {}).items(), key=lambda kv: -len(kv[0]))

    def walk(v: Any, key: str | None) -> Any:
        if key in volatile:
            if isinstance(v, list):
                return [f"<{key}>" for _ in v]
            return None if v is None else f"<{key}>"
        if key in ("variablesReference", "sourceReference") and isinstance(v, int):
            return "<ref>" if v > 0 else 0
        if isinstance(v, dict):
            return {k: walk(x, k) for k, x in v.items() if k not in drop}
        if isinstance(v, list):
            return [walk(x, None) for x in v]
        if isinstance(v, str):
            for prefix, marker in replacements:
                v = v.replace(prefix, marker)
            return v
        return v

    return walk(value, None)
