"""A shared worker keeps its users apart, with real processes and a second OS user: `tether up`
as root runs each program as a uid of its own; another OS user (``nobody``) racing the worker to a
run's debugger is refused in every way a program comes under the debugger (a debug run, its child
processes, an attach to a plain run, a post-mortem), 20 tries each; and a program of user B can
read nothing of the worker's (environment, memory, configuration, store socket) nor of user A's
run (its directory, its program's environment), nor signal them."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from stack import Proc, local_token, tether

from adapter.cli.submission import submit_run
from adapter.scripted_ide.dap_client import open_dap_client
from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import RunSpec
from relay.client import Endpoint, open_control
from worker_shim.program.identity import ProgramUser

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or os.geteuid() != 0,
        reason="programs get uids of their own only from a root worker, on Linux",
    ),
]

NOBODY = ProgramUser(65534)
UIDS = (61000, 61099)  #: the stack's own range: the racer watches these
TRIES = 20
RACER = Path(__file__).with_name("racer.py")


def nobodys_python() -> str:
    """An interpreter ``nobody`` may run (the tests' own may be under /root)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", sys.executable):
        if NOBODY.can_run(candidate):
            return candidate
    pytest.fail("no Python interpreter that another OS user may run")


@asynccontextmanager
async def shared_worker(home: Path, *extra: str) -> AsyncIterator[tuple[Proc, Endpoint]]:
    """`tether up` as root with 4 slots, programs under uids of the test's range; the relay with
    the local user's token."""
    async with tether(
        "up", "--data-dir", str(home / "data"), "--workers", "4", "--relay-port", "0",
        "--run-uids", f"{UIDS[0]}-{UIDS[1]}", *extra, home=home,
    ) as up:  # fmt: skip
        relay = (await up.wait_line(r"tether up: ready relay=(\S+)")).group(1)
        await up.wait_line(r"runs as a uid of its own")
        token = local_token(home)
        yield up, Endpoint(relay, token=token)


class Racer:
    """``racer.py`` as ``nobody``: every attempt it made, read off its output."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.lines: list[dict[str, object]] = []
        self._buffer = b""

    async def read(self) -> None:
        assert self.process.stdout is not None
        async for chunk in self.process.stdout:
            self._buffer += chunk
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                self.lines.append(json.loads(line))

    def attempts(self, since: int) -> list[dict[str, object]]:
        return [a for a in self.lines[since:] if "answered" in a]


@asynccontextmanager
async def racer() -> AsyncIterator[Racer]:
    argv = [nobodys_python(), "-I", "-S", str(RACER), str(UIDS[0]), str(UIDS[1])]
    process = await trio.lowlevel.open_process(
        argv, stdin=-1, stdout=-1, user=65534, group=65534, extra_groups=[], cwd="/"
    )
    found = Racer(process)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(found.read)
        with trio.fail_after(30):
            while not found.lines:  # noqa: ASYNC110 (another process's output)
                await trio.sleep(0.01)
        assert found.lines[0] == {"ready": True, "uid": 65534}
        try:
            yield found
        finally:
            assert process.stdin is not None
            await process.stdin.aclose()
            with trio.move_on_after(10):
                await process.wait()
            process.kill()
            nursery.cancel_scope.cancel()


async def submit_all(relay: Endpoint, specs: list[RunSpec]) -> list[RunRecord]:
    return [await submit_run(relay, spec, lambda _text: None) for spec in specs]


async def ended(relay: Endpoint, runs: list[RunRecord], timeout: float = 180) -> list[RunRecord]:
    """The runs once each has ended (asked every 0.2 s)."""
    async with open_control(relay, client="test") as control:
        with trio.fail_after(timeout):
            while True:
                records = [await control.get_run(r.id) for r in runs]
                if all(r.finished for r in records):
                    return records
                await trio.sleep(0.2)


def uid_of_output(logs: str) -> int:
    return int(logs.split("uid=", 1)[1].split()[0])


async def logs_of(home: Path, relay: Endpoint, run_id: str) -> str:
    from stack import TETHER, home_env

    done = await trio.run_process(
        [TETHER, "logs", run_id, "--relay", relay.url], capture_stdout=True, capture_stderr=True,
        env=home_env(home),
    )  # fmt: skip
    return (done.stdout + done.stderr).decode(errors="replace")  # the program's stderr: ours


async def test_another_os_user_racing_the_worker_never_gets_a_debugger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("TETHER_HOME", str(home))
    project = tmp_path / "project"
    project.mkdir()
    (project / "ok.py").write_text("import os\nprint('uid=%d' % os.getuid())\n")
    (project / "children.py").write_text(
        "import multiprocessing as mp, os\n"
        "def child(i):\n    return os.getuid()\n"
        "if __name__ == '__main__':\n"
        "    ctx = mp.get_context('spawn')\n"
        f"    for i in range({TRIES}):\n"
        "        with ctx.Pool(1) as pool:\n            assert pool.map(child, [i]) == [os.getuid()]\n"
        f"    print('uid=%d children={TRIES}' % os.getuid())\n"
    )
    (project / "crash.py").write_text("import os\nprint('uid=%d' % os.getuid())\n1 / 0\n")
    (project / "waits.py").write_text(
        "import os, time\nprint('uid=%d' % os.getuid(), flush=True)\n"
        "while not os.path.exists('go'):\n    time.sleep(0.02)\n"
    )
    base = RunSpec(command=["python", "ok.py"], workdir=str(project))
    async with shared_worker(home) as (up, relay), racer() as race:
        counts: dict[str, int] = {}
        said: list[str] = []

        # a debug run, held before user code while the worker configures it
        mark = len(race.lines)
        debug = base.model_copy(update={"debug": True, "wait_for_ide": False})
        runs = await ended(relay, await submit_all(relay, [debug] * TRIES))
        assert {r.state.value for r in runs} == {"succeeded"}, runs
        counts["debug run"] = len(race.attempts(mark))
        said.append(await logs_of(home, relay, runs[0].id))

        # its children: each connects to the adapter, and the worker opens a session for it
        mark = len(race.lines)
        children = debug.model_copy(update={"command": ["python", "children.py"]})
        (run,) = await ended(relay, await submit_all(relay, [children]))
        assert run.state.value == "succeeded", run
        counts["child"] = len(race.attempts(mark))

        # post-mortem: an uncaught exception starts debugpy in a plain run, no IDE
        mark = len(race.lines)
        crash = base.model_copy(
            update={"debug": False, "command": ["python", "crash.py"],
                    "on_unattended_stop": "continue", "unattended_timeout": 0.0}
        )  # fmt: skip
        runs = await ended(relay, await submit_all(relay, [crash] * TRIES))
        assert {r.state.value for r in runs} == {"failed"}, runs
        counts["post-mortem"] = len(race.attempts(mark))
        logs = await logs_of(home, relay, runs[0].id)
        assert "ZeroDivisionError" in logs
        said.append(logs)

        # an attach to a plain run: an IDE's presence makes the program start debugpy
        mark = len(race.lines)
        waits = base.model_copy(update={"debug": False, "command": ["python", "waits.py"]})
        runs = await submit_all(relay, [waits] * TRIES)
        for batch in range(0, TRIES, 4):
            async with trio.open_nursery() as nursery:
                for record in runs[batch : batch + 4]:
                    nursery.start_soon(attach_once, home, relay, record, up)
        runs = await ended(relay, runs)
        assert {r.state.value for r in runs} == {"succeeded"}, runs
        counts["attach"] = len(race.attempts(mark))
        said.append(await logs_of(home, relay, runs[0].id))

    answered = [a for a in race.attempts(0) if a["answered"]]
    assert answered == [], answered  # not one byte of a debugger for another OS user
    assert all(count >= TRIES for count in counts.values()), counts
    for logs in said:  # every program ran as a uid of the range, and said whom it refused
        assert UIDS[0] <= uid_of_output(logs) <= UIDS[1], logs
        assert "refused a connection to the debugger from uid 65534" in logs, logs
    print(f"refused attempts by nobody, per way: {counts}")


async def attach_once(home: Path, relay: Endpoint, record: RunRecord, up: Proc) -> None:
    """`tether attach` the waiting run, an IDE's handshake through it (debugpy starts in the
    program, the worker connects), then let the program end."""
    async with tether(
        "attach", record.id, "--relay", relay.url, "--port", "0", home=home, name=f"attach {record.id}"
    ) as attach:  # fmt: skip
        port = int((await attach.wait_line(r"adapter on 127\.0\.0\.1:(\d+)")).group(1))
        async with open_dap_client("127.0.0.1", port) as ide:
            await ide.request("initialize", {"adapterID": "x", "pathFormat": "path"})
            attach = ide.send_request_nowait("attach", {"connect": {"port": port}})
            await ide.wait_event("initialized", timeout=60)
            await ide.request("configurationDone", {})
            await ide.response(attach, timeout=60)  # answered once configured (as debugpy)
            await up.wait_line(rf"run {record.id}: an IDE attached", timeout=120)
            await ide.request("disconnect", {})
    run_dir = await run_dir_of(relay, record.id)
    (run_dir / "go").write_text("")  # root may: the program ends


async def run_dir_of(relay: Endpoint, run_id: str) -> Path:
    async with open_control(relay, client="test") as control:
        with trio.fail_after(60):
            while True:
                record = await control.get_run(run_id)
                for attempt in record.attempts:
                    if attempt.run_dir:
                        return Path(attempt.run_dir)
                await trio.sleep(0.1)


SECRET_VALUE = "a-secret-of-alices"
HOLDS = """\
import os, time
open("secret.txt", "w").write(os.environ["SECRET"])
print("pid=%d" % os.getpid(), flush=True)
while not os.path.exists("go"):
    time.sleep(0.02)
"""
PROBE = """\
import json, os, socket, sys
worker, token, store, theirs, their_pid = sys.argv[1:6]
tried = {}


def attempt(name, act):
    try:
        act()
        tried[name] = "READ"
    except OSError as exc:
        tried[name] = type(exc).__name__


attempt("the worker's environment", lambda: open(f"/proc/{worker}/environ", "rb").read())
attempt("the worker's memory", lambda: open(f"/proc/{worker}/mem", "rb").close())
attempt("the local user's token", lambda: open(token).read())
attempt("the store's socket", lambda: socket.socket(socket.AF_UNIX).connect(store))
attempt("signalling the worker", lambda: os.kill(int(worker), 0))
attempt("A's run directory", lambda: os.listdir(theirs))
attempt("A's file", lambda: open(os.path.join(theirs, "secret.txt")).read())
attempt("A's program's environment", lambda: open(f"/proc/{their_pid}/environ", "rb").read())
attempt("A's program's memory", lambda: open(f"/proc/{their_pid}/mem", "rb").close())
attempt("signalling A's program", lambda: os.kill(int(their_pid), 0))
attempt("listing the runs", lambda: os.listdir(os.path.dirname(theirs)))
tokens = sorted(k for k, v in os.environ.items() if "tth" in v or k.startswith("TETHER_TOKEN"))
print(json.dumps({"uid": os.getuid(), "tried": tried, "tokens": tokens}), flush=True)
"""


async def test_a_program_of_another_user_reaches_nothing_of_the_worker_or_of_other_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("TETHER_HOME", str(home))
    alices, bobs = tmp_path / "alice", tmp_path / "bob"
    alices.mkdir()
    bobs.mkdir()
    (alices / "holds.py").write_text(HOLDS)
    (bobs / "probe.py").write_text(PROBE)
    async with shared_worker(home) as (up, alice):
        from stack import TETHER, home_env

        made = await trio.run_process(
            [TETHER, "token", "create", "--user", "bob", "--relay", alice.url],
            capture_stdout=True, env=home_env(home),
        )  # fmt: skip
        bob = Endpoint(alice.url, token=made.stdout.decode().strip())
        spec = RunSpec(
            command=["python", "holds.py"], workdir=str(alices), debug=False,
            env={"SECRET": SECRET_VALUE},
        )  # fmt: skip
        (held,) = await submit_all(alice, [spec])
        their_dir = await run_dir_of(alice, held.id)
        with trio.fail_after(60):
            while "pid=" not in (said := await logs_of(home, alice, held.id)):  # noqa: ASYNC110
                await trio.sleep(0.05)
        their_pid = said.split("pid=", 1)[1].split()[0]
        probe = RunSpec(
            command=[
                "python", "probe.py", str(up.process.pid), str(home / "data" / "token"),
                str(home / "data" / "redis" / "redis.sock"), str(their_dir), their_pid,
            ],
            workdir=str(bobs), debug=False,
        )  # fmt: skip
        (probed,) = await ended(bob, await submit_all(bob, [probe]))
        assert probed.state.value == "succeeded", probed
        said = await logs_of(home, alice, probed.id)  # alice is an admin: she may read it
        found = json.loads(next(line for line in said.splitlines() if line.startswith("{")))
        (their_dir / "go").write_text("")
        (held,) = await ended(alice, [held])
        assert held.state.value == "succeeded", held
    assert len(found["tried"]) == 11, found
    assert found["tried"] == {name: "PermissionError" for name in found["tried"]}, found
    assert found["tokens"] == []
    assert UIDS[0] <= found["uid"] <= UIDS[1]
    assert Path(their_dir).stat().st_uid != found["uid"]


async def test_a_worker_whose_programs_run_as_itself_runs_only_its_own_users_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a worker that is not root (here: a root one told --no-isolation): it says so at start,
    runs its own user's runs, and refuses another user's at once, saying why."""
    from stack import TETHER, home_env

    home = tmp_path / "home"
    monkeypatch.setenv("TETHER_HOME", str(home))
    project = tmp_path / "project"
    project.mkdir()
    (project / "ok.py").write_text("print('ran')\n")
    async with tether(
        "up", "--data-dir", str(home / "data"), "--workers", "1", "--relay-port", "0",
        "--no-isolation", home=home,
    ) as up:  # fmt: skip
        relay_url = (await up.wait_line(r"tether up: ready relay=(\S+)")).group(1)
        said = await up.wait_line(r"programs run as this worker's own user .*")
        mine = Endpoint(relay_url, token=local_token(home))
        made = await trio.run_process(
            [TETHER, "token", "create", "--user", "bob", "--relay", relay_url],
            capture_stdout=True, env=home_env(home),
        )  # fmt: skip
        bob = Endpoint(relay_url, token=made.stdout.decode().strip())
        spec = RunSpec(command=["python", "ok.py"], workdir=str(project), debug=False)
        (own,) = await ended(mine, await submit_all(mine, [spec]))
        (theirs,) = await ended(bob, await submit_all(bob, [spec]))
    assert f"it runs only {own.owner}'s runs" in said.group(0), said
    assert own.state.value == "succeeded", own
    assert theirs.state.value == "failed" and theirs.exit_code is None, theirs
    assert f"runs only {own.owner}'s runs" in theirs.detail and "--any-user" in theirs.detail
