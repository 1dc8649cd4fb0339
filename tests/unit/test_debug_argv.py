"""How a user's command becomes a debugpy launch that holds the program before user code."""

from __future__ import annotations

import pytest

from worker_shim.debuggee import BOOT, build_debug_argv

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
            ["python3.11", "-X", "dev", "-c", "print(1)"],
            [*HEAD, "-X", "dev", *DEBUGPY, "-c", "print(1)"],
        ),
        (["train.py", "a"], [*HEAD, *DEBUGPY, "train.py", "a"]),
        (["/usr/bin/python3", "-W", "ignore", "t.py"], [*HEAD, "-W", "ignore", *DEBUGPY, "t.py"]),
    ],
)
def test_python_commands(user: list[str], expected: list[str]) -> None:
    assert build_debug_argv(user, python=PY, fast=False) == expected


def test_the_fast_launch_only_swaps_the_launcher() -> None:
    plain = build_debug_argv(["python", "-u", "t.py"], python=PY, fast=False)
    fast = build_debug_argv(["python", "-u", "t.py"], python=PY)
    assert fast == [str(BOOT) if part == "-m" else part for part in plain if part != "debugpy"]


@pytest.mark.parametrize(
    ("user", "needle"),
    [
        (["torchrun", "train.py"], "needs a Python command"),
        (["python"], "names no script"),
        (["python", "-m"], "needs an argument"),
        (["python", "--weird", "t.py"], "unsupported python option"),
        ([], "empty"),
    ],
)
def test_other_commands_are_refused_clearly(user: list[str], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        build_debug_argv(user, python=PY)
