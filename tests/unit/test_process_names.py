"""What a debugged process is called: its command line without the debugger's machinery (never an
access token), and the program it runs. The command lines are real ones, as ``/proc`` showed them
for processes debugpy 1.8.22 and tether started."""

from __future__ import annotations

import shlex

import pytest

from protocol_specs.session.processes import MAIN, ProcessInfo
from worker_shim.program.process_names import ProcFacts, describe, program_of, user_command

TOKEN = "e8448b2f41f104a5c0598be5e3182472dcc9042352bc9289c80b28eda78317b6"
PY = "/work/main/.venv/bin/python"
PYDEVD_DIR = "/work/main/.venv/lib/python3.11/site-packages/debugpy/_vendored/pydevd"
SETTRACE = (
    f"import sys; sys.path.insert(0, r'{PYDEVD_DIR}'); import pydevd; "
    "pydevd.config('http_json', 'debugpy-dap'); pydevd.settrace(host='127.0.0.1', port=49901, "
    "suspend=False, trace_only_current_thread=False, patch_multiprocessing=True, "
    f"access_token='{TOKEN}', client_access_token=None, __setup_holder__={{'access-token': "
    f"'{TOKEN}', 'client': '127.0.0.1', 'json-dap-http': True, 'ppid': 5849, "
    "'path': 'a)b'}); "
)
SPAWN = "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)"

CASES = [
    # a multiprocessing spawn child, patched by pydevd: a worker of its parent
    (
        [PY, "-B", "-X", "frozen_modules=off", "-c", SETTRACE + SPAWN, "--multiprocessing-fork"],
        [PY, "-B", "-c", SPAWN, "--multiprocessing-fork"],
        "",
    ),
    # subprocess.run([python, "child.py"]), patched by pydevd
    (
        [
            PY,
            f"{PYDEVD_DIR}/pydevd.py",
            "--port",
            "59877",
            "--ppid",
            "5921",
            "--client",
            "127.0.0.1",
            "--access-token",
            TOKEN,
            "--debug-mode",
            "debugpy-dap",
            "--preimport",
            "/x;debugpy._vendored.force_pydevd",
            "--multiprocess",
            "--skip-notify-stdin",
            "--json-dap-http",
            "--file",
            "child.py",
            "--lr",
            "3",
        ],
        [PY, "child.py", "--lr", "3"],
        "child.py",
    ),
    # python -m pkg.train, patched by pydevd
    (
        [
            PY,
            f"{PYDEVD_DIR}/pydevd.py",
            "--port",
            "1",
            "--access-token",
            TOKEN,
            "--module",
            "--file",
            "pkg.train",
            "--epochs",
            "2",
        ],
        [PY, "-m", "pkg.train", "--epochs", "2"],
        "pkg.train",
    ),
    # the main process, as tether starts it
    (
        [
            PY,
            "-X",
            "frozen_modules=off",
            "-u",
            "/w/worker_shim/inject/_tether_debugpy_boot.py",
            "--tether-debugpy",
            "/tmp/t/debugpy-home",
            "--listen",
            "127.0.0.1:0",
            "--wait-for-client",
            "--configure-subProcess",
            "true",
            "main.py",
            "fork",
        ],
        [PY, "-u", "main.py", "fork"],
        "main.py",
    ),
    # a plain run's program, debuggable later (tether attach)
    (
        [
            PY,
            "-X",
            "frozen_modules=off",
            "/w/worker_shim/inject/_tether_debugpy_boot.py",
            "--tether-debugpy",
            "/tmp/t/debugpy-home",
            "--tether-attach",
            "/tmp/t/attach.sock",
            "--",
            "-m",
            "pkg.train",
            "--lr",
            "3",
        ],
        [PY, "-m", "pkg.train", "--lr", "3"],
        "pkg.train",
    ),
    # a non-Python command's main process: tether's launcher
    (
        [
            PY,
            "-X",
            "frozen_modules=off",
            "/w/worker_shim/inject/_tether_debugpy_boot.py",
            "--listen",
            "127.0.0.1:0",
            "--wait-for-client",
            "--configure-subProcess",
            "true",
            "/w/worker_shim/inject/_tether_launch.py",
            "/tmp/t/boot",
            "--",
            "./train.sh",
            "-x",
        ],
        ["./train.sh", "-x"],
        "train.sh",
    ),
    # stock debugpy's command line, with a -c target
    (
        [
            PY,
            "-m",
            "debugpy",
            "--listen",
            "127.0.0.1:0",
            "--adapter-access-token",
            TOKEN,
            "-c",
            "print(1)",
        ],
        [PY, "-c", "print(1)"],
        "python -c",
    ),
    # a Python process a shell script started (its sitecustomize connects it): as written
    (["python3", "-u", "train.py"], ["python3", "-u", "train.py"], "train.py"),
]


@pytest.mark.parametrize(("argv", "shown", "program"), CASES)
def test_the_command_is_the_users_and_names_the_program(
    argv: list[str], shown: list[str], program: str
) -> None:
    assert user_command(argv) == shown
    assert program_of(shown) == program
    info = describe(42, ProcFacts(cmdline=argv), parent=MAIN, nth=1, host="h")
    assert TOKEN not in info.command and info.command == shlex.join(shown)
    assert info.program == program


def test_a_future_import_before_pydevds_prefix_is_kept() -> None:
    code = "from __future__ import annotations;" + SETTRACE + "print(2)"
    assert user_command(["python", "-c", code]) == [
        "python", "-c", "from __future__ import annotations;print(2)"
    ]  # fmt: skip


def test_what_cannot_be_told_apart_never_shows_a_token() -> None:
    cut = SETTRACE[: SETTRACE.index("__setup_holder__")]  # the call never closes
    assert user_command(["python", "-c", cut + "print(3)"]) == ["python", "-c", "..."]
    odd = ["python", "tool.py", f"--access-token={TOKEN}"]
    assert user_command(odd) == ["python", "..."]


def test_a_fork_is_a_worker_of_its_parent_and_the_main_process_keeps_its_submitted_command() -> (
    None
):
    parent = ["python", "-X", "frozen_modules=off", "boot.py", "main.py"]
    fork = describe(43, ProcFacts(cmdline=parent), parent=MAIN, nth=1, host="h",
                    parent_cmdline=parent)  # fmt: skip
    assert fork.program == "" and fork.title() == "worker 1 of the main process (pid 43) on h"
    main = describe(41, ProcFacts(cmdline=parent), parent=MAIN, nth=0, host="h", key=MAIN,
                    command=["python", "main.py"])  # fmt: skip
    assert main.command == "python main.py" and main.title() == "main process (pid 41) on h"
    eval_py = ProcessInfo(key="44", pid=44, program="eval.py", nth=2, host="h")
    assert eval_py.title() == "eval.py (pid 44) on h"
    # a rank is named by its rank, whatever it runs
    rank = ProcessInfo(key="45", pid=45, program="train.py", rank=1)
    assert rank.title() == "rank 1 (pid 45)"
