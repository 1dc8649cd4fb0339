"""The ``sitecustomize`` a non-Python command's Python processes import (``_tether_sitecustomize``):
it never stops a program, leaves processes debugpy patched to debugpy, and imports the
``sitecustomize`` it shadows. Real interpreters; connecting to debugpy is the integration tests'
(``tests/integration/test_worker_processes.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from worker_shim.program.python_command import boot_dir


def _run(tmp_path: Path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    other = tmp_path / "other"
    other.mkdir(exist_ok=True)
    (other / "sitecustomize.py").write_text(
        "import sys\nsys.stderr.write('OTHER SITECUSTOMIZE\\n')\n"
    )
    path = f"{boot_dir(tmp_path)}:{other}"
    return subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": path, "PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_without_a_debugger_to_join_it_only_chains_to_the_shadowed_one(tmp_path: Path) -> None:
    done = _run(
        tmp_path, "import sys, sitecustomize; print(sitecustomize.__file__); print(sys.path)"
    )
    assert done.returncode == 0 and done.stderr == "OTHER SITECUSTOMIZE\n"
    first, path = done.stdout.splitlines()
    assert first == str(tmp_path / "other" / "sitecustomize.py")
    assert str(tmp_path / "boot") not in path  # its own directory left sys.path


def test_a_debugger_it_cannot_join_is_said_once_and_the_program_runs(tmp_path: Path) -> None:
    config = {"pydevd": str(tmp_path / "nowhere"), "setup": {}}
    done = _run(tmp_path, "print('RAN')", TETHER_DEBUGPY_CHILD=json.dumps(config))
    assert done.returncode == 0 and done.stdout == "RAN\n"
    said = done.stderr.splitlines()
    assert (
        said[0].startswith("tether: ")
        and "runs without the debugger: ModuleNotFoundError" in said[0]
    )
    assert said[1:] == ["OTHER SITECUSTOMIZE"]


def test_a_process_debugpy_patched_is_left_to_debugpy(tmp_path: Path) -> None:
    config = {"pydevd": str(tmp_path / "nowhere"), "setup": {}}
    code = "# import pydevd; pydevd.settrace(...) came first\nprint('RAN')"
    done = _run(tmp_path, code, TETHER_DEBUGPY_CHILD=json.dumps(config))
    assert done.returncode == 0 and done.stdout == "RAN\n"
    assert done.stderr == "OTHER SITECUSTOMIZE\n"  # not even tried


def test_a_debugger_it_cannot_reach_leaves_the_program_and_its_children_as_they_were(
    tmp_path: Path,
) -> None:
    """A process on another host than the worker (``srun`` across nodes) cannot reach the
    debugger: it says so once, runs, and its own Python children start as written (pydevd's
    patching is not left behind) and do not try again."""
    import socket

    import debugpy

    pydevd = Path(debugpy.__file__).parent / "_vendored" / "pydevd"
    with socket.socket() as closed:  # bound, not listening: a connect is refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        config = {
            "pydevd": str(pydevd),
            "protocol": "http_json",
            "debug_mode": "debugpy-dap",
            "host": "127.0.0.1",
            "port": port,
            "setup": {"access-token": "x", "client": "127.0.0.1", "port": port, "ppid": 1},
        }
        code = (
            "import subprocess, sys\n"
            "child = [sys.executable, '-c', 'import sys; print(sys.orig_argv[1:])']\n"
            "sys.exit(subprocess.run(child).returncode)\n"
        )
        done = _run(
            tmp_path,
            code,
            TETHER_DEBUGPY_CHILD=json.dumps(config),
            PYDEVD_DISABLE_FILE_VALIDATION="1",
        )
    assert done.returncode == 0
    assert done.stdout == "['-c', 'import sys; print(sys.orig_argv[1:])']\n"
    notices = [line for line in done.stderr.splitlines() if line.startswith("tether: ")]
    assert len(notices) == 1
    assert f"cannot reach the run's debugger at 127.0.0.1:{port}" in notices[0]
