"""Every command with bad input: one clear line, a non-zero exit, never a traceback (real
processes: `tether up` and the CLI)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import trio
from stack import TETHER, home_env, relay_stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


async def tether_cli(
    home: Path, *args: str, cwd: Path, stdout: int | None = None
) -> tuple[int, str]:
    """(exit code, stderr and stdout) of one CLI command. Bad input is refused at once: a
    command still running after 60 s took the input (``tether debug`` serving a run it accepted)
    and fails the test, killed (trio kills it when the scope is cancelled), not left behind."""
    where: dict[str, object] = (
        {"stdout": stdout} if stdout is not None else {"capture_stdout": True}
    )
    with trio.fail_after(60):
        done = await trio.run_process(
            [TETHER, *args], env=home_env(home), cwd=cwd, capture_stderr=True, check=False, **where
        )
    out = done.stdout.decode(errors="replace") if stdout is None and done.stdout else ""
    return done.returncode, done.stderr.decode(errors="replace") + out


async def test_bad_input_gets_a_clear_line_and_never_a_traceback(tmp_path: Path) -> None:
    home = tmp_path / "home"
    project = tmp_path / "project"
    project.mkdir()
    (project / "app.py").write_text("print('hi')\n")
    (project / "launch.sh").write_text("#!/bin/bash\npython app.py\n")  # a shell launcher
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        async with relay_stack(home, workers=0):
            cases: list[tuple[tuple[str, ...], str]] = [
                (("ls", "-n", "0"), "not between 1 and 1000"),
                (("ls", "--relay", "http://127.0.0.1:1"), "use ws://127.0.0.1:1, not http://"),
                (("ls", "--relay", "127.0.0.1:1"), "cannot reach the relay at ws://127.0.0.1:1"),
                (("status", "nosuchrun"), "no run 'nosuchrun'"),
                (("cancel", "nosuchrun"), "no run 'nosuchrun'"),
                (("logs", "nosuchrun"), "no run 'nosuchrun'"),
                (("audit", "nosuchrun"), "no run 'nosuchrun'"),
                (("rerun", "nosuchrun"), "no run 'nosuchrun'"),
                (
                    ("debug", "--port", port, "--", "python", "app.py"),
                    f"127.0.0.1:{port} is in use",
                ),
                (("attach", "nosuchrun", "--port", port), f"127.0.0.1:{port} is in use"),
                (
                    ("debug", "--processes", "main", "--", "./launch.sh"),
                    "--processes main debugs none of them",
                ),
                (("debug", "--", "./gone.sh"), "no program './gone.sh'"),
                (("debug", "--", "python", "-V"), "python -V runs no program"),
                (("run", "--gpu", "2", "--", "python", "app.py"), "unrecognized arguments"),
                (("run", "--backend", "k8s", "--", "python", "app.py"), "invalid choice: 'k8s'"),
                (("run", "--workdir", str(tmp_path / "no"), "--", "python", "app.py"), "no such"),
                (("up", "--data-dir", str(home / "data"), "--relay-port", "0"), "already run by"),
                (("token", "revoke", "nosuchtoken"), "no token 'nosuchtoken'"),
                (("relay", "--redis", "memory://", "--port", port), "another relay?"),
                (("relay", "--redis", "http://x", "--port", "0"), "--redis: unsupported store URL"),
                (("relay", "--redis", "redis://a:b,c:1", "--port", "0"), "--redis: bad port"),
                (("token", "create", "--redis", "redis://127.0.0.1:1"), "--redis: cannot connect"),
                (("metrics", "nosuchrun"), "no run 'nosuchrun'"),
                (("run", "--metric", "loss", "--", "python", "app.py"), "names no metric"),
                (("run", "--metric", "(?P<x", "--", "python", "app.py"), "not a regular expr"),
                (("sweep", "status", "nosuchsweep"), "no sweep 'nosuchsweep'"),
                (("sweep", "cancel"), "name one sweep"),
                (("sweep", "--param", "lr", "--", "python", "app.py"), "give NAME=SPACE"),
                (
                    ("sweep", "--param", "lr=1,2", "--", "python", "app.py", "{bs}"),
                    "names {bs}, which is no --param",
                ),
                (
                    ("sweep", "--param", "lr=0.1:1", "--search", "grid", "--", "python", "app.py"),
                    "a grid needs a list of values for lr",
                ),
                (
                    ("sweep", "--param", "lr=1,2", "--early-stop", "asha", "--", "python", "a.py"),
                    "needs an --objective",
                ),
                (
                    ("sweep", "--param", "x=int:0:1e300", "--", "python", "app.py", "{x}"),
                    "invalid sweep: x: an int range's bounds are within ±9007199254740992",
                ),
                (
                    ("sweep", "--param", "x=-1.7e308:1.7e308", "--", "python", "app.py", "{x}"),
                    "invalid sweep: x: a range's bounds are within ±1e300",
                ),
                (("sweep", "--file", str(tmp_path / "none.yaml")), "No such file"),
                (("sweep", "--file", str(project / "app.py")), "a mapping of settings"),
                (("eval", "nosuchrun", "loss"), "no run 'nosuchrun'"),
                (("eval", "nosuchrun", "loss", "--ranks", "3-1"), "'3-1': a range goes up"),
                (("eval", "nosuchrun", " "), "eval needs an expression"),
            ]
            wrong = []
            for args, said in cases:
                code, text = await tether_cli(home, *args, cwd=project)
                if code == 0 or "Traceback" in text or said not in text:
                    wrong.append(f"tether {' '.join(args)}: exit {code}:\n{text}")
            code, run = await tether_cli(home, "run", "--", "python", "app.py", cwd=project)
            code, text = await tether_cli(
                home, "eval", run.strip().splitlines()[-1], "x", cwd=project
            )
            if code == 0 or "Traceback" in text or "is not a debug run" not in text:
                wrong.append(f"tether eval of a plain run: exit {code}:\n{text}")
            read, write = os.pipe()
            os.close(read)  # `tether ls | head -0`: nobody reads what it prints
            try:
                code, text = await tether_cli(home, "ls", cwd=project, stdout=write)
            finally:
                os.close(write)
            if "Traceback" in text or code not in (0, 141):
                wrong.append(f"tether ls into a closed pipe: exit {code}:\n{text}")
    assert not wrong, "\n\n".join(wrong)
    runs = await tether_cli(home, "ls", "--relay", "127.0.0.1:1", cwd=project)
    assert "Traceback" not in runs[1]
