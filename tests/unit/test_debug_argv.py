"""How a user's command becomes a debugpy launch that holds the program before user code."""

from __future__ import annotations

import pytest

from worker_shim.program.python_command import BOOT, build_debug_argv

PY = "/venv/bin/python"
HEAD = [PY, "-X", "frozen_modules=off"]
DEBUGPY = [
    "-m",
    "debugpy",
    "--listen",
    "127.0.0.1:0",
    "--wait-for-client",
    "--configure-subProcess",
    "false",
]


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        (["python", "train.py", "--lr", "3"], [*HEAD, *DEBUGPY, "train.py", "--lr", "3"]),
        (
            ["python3", "-u", "-m", "pkg.train", "x"],
            [*HEAD, "-u", *DEBUGPY, "-m", "pkg.train", "x"],
        ),
        (
            ["python3.11", "-X", "dev", "-c", "print(1)", "a"],
            [*HEAD, "-X", "dev", *DEBUGPY, "-c", "print(1)", "a"],
        ),
        (["train.py", "a"], [*HEAD, *DEBUGPY, "train.py", "a"]),
        (["./scripts/train.py"], [*HEAD, *DEBUGPY, "./scripts/train.py"]),
        (["/usr/bin/python3", "-W", "ignore", "t.py"], [*HEAD, "-W", "ignore", *DEBUGPY, "t.py"]),
        (["/opt/conda/envs/x/bin/python3.10", "t.py"], [*HEAD, *DEBUGPY, "t.py"]),
        # short options clustered and glued to their values, the way CPython parses them
        (["python", "-uOO", "t.py"], [*HEAD, "-u", "-O", "-O", *DEBUGPY, "t.py"]),
        (
            ["python", "-Xdev", "-Wignore", "t.py"],
            [*HEAD, "-X", "dev", "-W", "ignore", *DEBUGPY, "t.py"],
        ),
        (["python", "-um", "pkg", "--x"], [*HEAD, "-u", *DEBUGPY, "-m", "pkg", "--x"]),
        (["python", "-mpkg.mod"], [*HEAD, *DEBUGPY, "-m", "pkg.mod"]),
        (["python", "-Bc", "pass"], [*HEAD, "-B", *DEBUGPY, "-c", "pass"]),
        (["python", "-I", "-P", "t.py"], [*HEAD, "-I", "-P", *DEBUGPY, "t.py"]),
        (
            ["python", "--check-hash-based-pycs", "never", "t.py"],
            [*HEAD, "--check-hash-based-pycs", "never", *DEBUGPY, "t.py"],
        ),
        (["python", "-u", "--", "t.py", "-u"], [*HEAD, "-u", *DEBUGPY, "t.py", "-u"]),
        # the program's own options are the program's, not Python's
        (["python", "t.py", "-m", "x", "-S"], [*HEAD, *DEBUGPY, "t.py", "-m", "x", "-S"]),
    ],
)
def test_python_commands(user: list[str], expected: list[str]) -> None:
    assert build_debug_argv(user, python=PY, fast=False) == expected


def test_the_fast_launch_only_swaps_the_launcher() -> None:
    plain = build_debug_argv(["python", "-u", "t.py"], python=PY, fast=False)
    fast = build_debug_argv(["python", "-u", "t.py"], python=PY)
    assert fast == [*HEAD, "-u", str(BOOT), *DEBUGPY[2:], "t.py"]
    assert fast == [str(BOOT) if part == "-m" else part for part in plain if part != "debugpy"]
    assert BOOT.is_file()


def test_the_resolved_interpreter_runs_the_program_with_subprocess_debugging_off() -> None:
    argv = build_debug_argv(["python3.12", "t.py"], python="/env/bin/python3.12", home="/h")
    assert argv[0] == "/env/bin/python3.12"
    assert argv[argv.index(str(BOOT)) + 1 : argv.index(str(BOOT)) + 3] == ["--tether-debugpy", "/h"]
    assert argv[argv.index("--configure-subProcess") + 1] == "false"
    assert argv[argv.index("--listen") + 1] == "127.0.0.1:0"
    assert "--wait-for-client" in argv


@pytest.mark.parametrize(
    ("user", "needle"),
    [
        (["torchrun", "train.py"], "needs a Python command.*got 'torchrun'"),
        (["bash", "-c", "python t.py"], "needs a Python command"),
        (["python3-config", "t.py"], "needs a Python command"),
        (["python2", "t.py"], "needs a Python command"),
        ([], "got an empty command"),
        (["python"], "names no script"),
        (["python", "-u"], "names no script"),
        (["python", "--"], "names no script"),
        (["python", "-m"], "-m needs an argument"),
        (["python", "-X"], "-X needs an argument"),
        (["python", "--check-hash-based-pycs"], "needs an argument"),
        (["python", "--weird", "t.py"], "unsupported python option '--weird'"),
        (["python", "-", "x"], "unsupported python option '-'"),
        (["python", "-uZ", "t.py"], "unsupported python option -Z"),
        (["python", "-S", "t.py"], "site-packages"),
        (["python", "-x", "t.py"], "-x cannot be debugged"),
        (["python", "-V"], "runs no program"),
        (["python", "-m", "debugpy", "--listen", "5678", "t.py"], "already runs debugpy"),
    ],
)
def test_other_commands_are_refused_clearly(user: list[str], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        build_debug_argv(user, python=PY)


def test_subprocess_debugging_is_asked_for_by_the_caller() -> None:
    on = build_debug_argv(["python", "t.py"], python=PY, fast=False, subprocesses=True)
    assert on == [*HEAD, *DEBUGPY[:-1], "true", "t.py"]
    off = build_debug_argv(["python", "t.py"], python=PY, fast=False)
    assert off == [*HEAD, *DEBUGPY, "t.py"]
