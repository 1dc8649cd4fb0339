"""Every ``tether`` command's ``--help`` prints its own help (the sweep actions, which are words
after ``tether sweep``, included), and a command given no program says how to give one for that
command."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from adapter.cli import main
from adapter.cli.parser import build_parser
from adapter.cli.sweeps import SWEEP_ACTIONS


def _commands(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> list[tuple[str, ...]]:
    found = [prefix] if prefix else []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, (*prefix, name))
    return found


COMMANDS = [*_commands(build_parser()), *(("sweep", word) for word in SWEEP_ACTIONS)]


def test_the_walk_finds_every_command() -> None:
    assert {("run",), ("debug",), ("token", "create"), ("sweep", "status")} <= set(COMMANDS)
    assert len(COMMANDS) >= 25


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_prints_its_help(
    command: tuple[str, ...],
    flag: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("TETHER_HOME", str(tmp_path))  # no relay, no config: help needs neither
    monkeypatch.setenv("TETHER_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.delenv("TETHER_RELAY", raising=False)
    with pytest.raises(SystemExit) as ended:
        main([*command, flag])
    out, err = capsys.readouterr()
    assert ended.value.code == 0, err
    assert out.startswith(f"usage: tether {' '.join(command)} "), out
    assert "show this help message and exit" in out and err == ""


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["run"], "e.g. tether run -- python train.py"),
        (["run", "--gpus", "1", "--"], "e.g. tether run -- python train.py"),
        (["debug"], "e.g. tether debug -- python train.py"),
        (["sweep", "--param", "lr=0:1"], "e.g. tether sweep --param lr=log:1e-5:1e-2 -- python"),
    ],
)
def test_a_command_with_no_program_says_how_to_give_one_before_asking_for_a_relay(
    argv: list[str],
    said: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv(
        "TETHER_HOME", str(tmp_path)
    )  # no relay anywhere: the command is wrong first
    monkeypatch.setenv("TETHER_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.delenv("TETHER_RELAY", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ended:
        main(argv)
    message = str(ended.value.code)
    assert message.startswith("tether: give the command to run after --") and said in message
    if argv[0] != "debug":
        assert "tether debug" not in message
    assert capsys.readouterr().out == ""
