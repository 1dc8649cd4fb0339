"""The config file's profiles, duration and memory parsing, and the worker's credentials file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from adapter.cli.settings import parse_duration, parse_memory, parse_ranks, read_credentials
from adapter.cli.submission import build_spec
from adapter.config import ConfigError, load_profile
from protocol_specs.runs.spec import RunSpec

CONFIG = """
[default]
relay = "ws://127.0.0.1:8765"
max_retries = 1
[default.env]
A = "1"

[profiles.cluster]
relay = "ws://relay:8765"
backend = "slurm"
gpus = 2
memory = "32G"
time = "4h"
[profiles.cluster.env]
B = "2"
"""


def test_a_profile_is_laid_over_the_default(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(CONFIG)
    default = load_profile("default", path)
    assert (default.relay, default.max_retries, default.backend) == ("ws://127.0.0.1:8765", 1, "")
    cluster = load_profile("cluster", path)
    assert (cluster.relay, cluster.backend, cluster.gpus, cluster.max_retries) == (
        "ws://relay:8765",
        "slurm",
        2,
        1,
    )
    assert cluster.env == {"A": "1", "B": "2"}


def test_unknown_profiles_and_keys_are_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(CONFIG)
    with pytest.raises(ConfigError, match="no profile 'gpu' \\(profiles: cluster\\)"):
        load_profile("gpu", path)
    path.write_text("[default]\nrealy = 'x'\n")
    with pytest.raises(ConfigError, match="realy"):
        load_profile(None, path)
    assert load_profile(None, tmp_path / "absent.toml").relay == ""


def test_options_win_over_the_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "config.toml"
    path.write_text(CONFIG)
    monkeypatch.setenv("TETHER_CONFIG", str(path))
    args = argparse.Namespace(
        command=["--", "python", "t.py"],
        profile="cluster",
        gpus=1,
        cpus=None,
        mem=None,
        time=None,
        partition=None,
        backend=None,
        max_retries=None,
        retry_backoff=None,
        env=["C=3"],
        mount=None,
        tag=None,
        name=None,
        workdir=str(tmp_path),
    )
    spec = build_spec(args, debug=False)
    assert (spec.resources.gpus, spec.resources.memory_mb, spec.resources.time_limit) == (
        1,
        32 * 1024,
        4 * 3600,
    )
    assert (spec.backend, spec.max_retries, spec.env) == (
        "slurm",
        1,
        {"A": "1", "B": "2", "C": "3"},
    )


def test_durations_and_memory() -> None:
    assert [parse_duration(t) for t in ("90", "90s", "30m", "2h", "1d")] == [
        90,
        90,
        1800,
        7200,
        86400,
    ]
    assert [parse_memory(t) for t in ("512M", "16G", "16GiB", "2048", "1T")] == [
        512,
        16384,
        16384,
        2048,
        1024 * 1024,
    ]
    with pytest.raises(argparse.ArgumentTypeError, match="not an amount of memory"):
        parse_memory("lots")


def test_credentials_must_be_private(tmp_path: Path) -> None:
    path = tmp_path / "creds.json"
    path.write_text(json.dumps({"relay": "ws://r:1", "run": "abc", "attempt": 2}))
    path.chmod(0o644)
    with pytest.raises(SystemExit, match=r"readable by others .*must be 0600"):
        read_credentials(str(path))
    path.chmod(0o600)
    assert read_credentials(str(path))["attempt"] == 2


def test_the_per_user_caps_are_relay_options() -> None:
    from adapter.cli.parser import build_parser as _parser
    from adapter.cli.settings import relay_config

    config = relay_config(
        _parser().parse_args(["relay", "--max-connections", "5", "--max-runs", "7"])
    )
    assert (config.max_connections, config.max_active_runs) == (5, 7)
    defaults = relay_config(_parser().parse_args(["up"]))
    assert (defaults.max_connections, defaults.max_active_runs) == (64, 1000)


def _debug_args(tmp_path: Path, *command: str, **overrides: object) -> argparse.Namespace:
    from adapter.cli.parser import build_parser as _parser

    args = _parser().parse_args(["debug", "--workdir", str(tmp_path), "--", *command])
    for name, value in overrides.items():
        setattr(args, name, value)
    return args


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["python", "-V"], "python -V runs no program"),
        (["python", "-m"], "python -m needs an argument"),
        (["python"], "names no script, -m module or -c code"),
    ],
)
def test_debug_mode_refuses_what_the_worker_would_refuse_at_submit_time(
    tmp_path: Path, command: list[str], said: str
) -> None:
    with pytest.raises(SystemExit, match=said):
        build_spec(_debug_args(tmp_path, *command), debug=True)
    assert build_spec(_debug_args(tmp_path, *command), debug=False).command == command


def test_a_missing_workdir_and_an_unknown_backend_are_refused_at_submit_time(
    tmp_path: Path,
) -> None:
    with pytest.raises(SystemExit, match="no such directory"):
        build_spec(
            _debug_args(tmp_path, "python", "t.py", workdir=str(tmp_path / "no")), debug=True
        )
    with pytest.raises(SystemExit, match="unknown backend 'k8s': use local, slurm or ray"):
        build_spec(_debug_args(tmp_path, "python", "t.py", backend="k8s"), debug=True)


def test_custom_resources_go_to_ray_only_and_are_numbers(tmp_path: Path) -> None:
    resource = ["accelerator_type:A100=1", "tether_slot=0.5"]
    spec = build_spec(
        _debug_args(tmp_path, "python", "t.py", backend="ray", resource=resource), debug=True
    )
    assert spec.resources.custom == {"accelerator_type:A100": 1.0, "tether_slot": 0.5}
    with pytest.raises(SystemExit, match=r"tether: custom resources \(tether_slot\) are a Ray"):
        build_spec(_debug_args(tmp_path, "python", "t.py", resource=["tether_slot=1"]), debug=True)
    with pytest.raises(SystemExit, match="--resource x=lots: the amount is a number"):
        build_spec(
            _debug_args(tmp_path, "python", "t.py", backend="ray", resource=["x=lots"]), debug=True
        )


def test_options_are_never_abbreviated(capsys: pytest.CaptureFixture[str]) -> None:
    from adapter.cli.parser import build_parser as _parser

    with pytest.raises(SystemExit):
        _parser().parse_args(["run", "--gpu", "2", "--", "python", "t.py"])
    assert "unrecognized arguments: --gpu" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parser().parse_args(["run", "--backend", "k8s", "--", "python", "t.py"])
    assert "invalid choice: 'k8s'" in capsys.readouterr().err


def test_every_option_and_argument_has_help() -> None:
    from adapter.cli.parser import build_parser as _parser

    missing: list[str] = []

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*prefix, name])
            elif action.help is None:
                missing.append(f"tether {' '.join(prefix)} {action.option_strings or action.dest}")

    walk(_parser(), [])
    assert missing == []


def test_processes_and_ranks_reach_the_spec(tmp_path: Path) -> None:
    from adapter.cli.parser import build_parser as _parser

    argv = ["debug", "--workdir", str(tmp_path), "--ranks", "0,2-3,2", "--", "python", "t.py"]
    spec = build_spec(_parser().parse_args(argv), debug=True)
    assert spec.ranks == [0, 2, 3] and spec.processes == "stopped"
    argv = ["debug", "--workdir", str(tmp_path), "--processes", "main", "--", "python", "t.py"]
    assert build_spec(_parser().parse_args(argv), debug=True).processes == "main"


@pytest.mark.parametrize("command", ["debug", "run"])
def test_stop_reaches_the_spec_all_by_default(tmp_path: Path, command: str) -> None:
    from adapter.cli.parser import build_parser as _parser

    argv = [command, "--workdir", str(tmp_path), "--", "python", "t.py"]
    assert build_spec(_parser().parse_args(argv), debug=command == "debug").stop == "all"
    argv = [command, "--workdir", str(tmp_path), "--stop", "one", "--", "python", "t.py"]
    assert build_spec(_parser().parse_args(argv), debug=command == "debug").stop == "one"


@pytest.mark.parametrize("text", ["", "a", "1-", "3-1", "-2", "0-5000", "0-4095,4096"])
def test_bad_ranks_are_refused_by_the_parser(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_ranks(text)


@pytest.mark.parametrize(
    "argv",
    [
        ["eval", "RUN", "x", "--ranks", "0-4095,4096-8191"],
        ["attach", "RUN", "--ranks", "0-4095,4096-8191"],
        ["debug", "--ranks", "0-4095,4096-8191", "--", "python", "t.py"],
    ],
    ids=["eval", "attach", "debug"],
)
def test_ranks_past_a_specs_limit_are_one_clear_line_not_an_internal_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--ranks 0-4095,4096-8191``: the TunnelSpec (``eval``), the focus (``attach``: the
    worker would refuse what the adapter holds) and the run's spec take 4096 ranks at most."""
    from adapter.cli.parser import build_parser as _parser
    from protocol_specs.session.focus import MAX_FOCUS

    with pytest.raises(SystemExit):
        _parser().parse_args(argv)
    [line] = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line.endswith(f"--ranks: {MAX_FOCUS} ranks at most in all")
    assert len(parse_ranks(f"0-{MAX_FOCUS - 1}")) == MAX_FOCUS


def test_a_launcher_is_left_to_the_worker_at_submit_time(tmp_path: Path) -> None:
    """torchrun on the laptop's PATH or not, only the worker's PATH says what it is."""
    command = ["torchrun", "--nproc-per-node", "2", "train.py"]
    assert build_spec(_debug_args(tmp_path, *command), debug=True).command == command


def test_a_shell_script_in_the_workdir_is_debugged_through_its_python_processes(
    tmp_path: Path,
) -> None:
    (tmp_path / "launch.sh").write_text("#!/bin/bash\ntorchrun train.py\n")
    spec = build_spec(_debug_args(tmp_path, "./launch.sh"), debug=True)
    assert spec.command == ["./launch.sh"] and spec.processes == "stopped"
    # with --processes main, nothing of it would be debugged: said at submit
    from adapter.cli.parser import build_parser as _parser

    argv = ["debug", "--workdir", str(tmp_path), "--processes", "main", "--", "./launch.sh"]
    with pytest.raises(SystemExit, match=r"launch.sh is not a Python program: .*--processes main"):
        build_spec(_parser().parse_args(argv), debug=True)
    # a console script in the snapshot is a Python command
    (tmp_path / "launch").write_text("#!/usr/bin/env python3\nimport runpy\n")
    assert build_spec(_debug_args(tmp_path, "./launch", "2"), debug=True).command == [
        "./launch",
        "2",
    ]
    # a launcher that is not there is said at submit
    with pytest.raises(SystemExit, match=r"no program './gone.sh'"):
        build_spec(_debug_args(tmp_path, "./gone.sh"), debug=True)


def test_post_mortem_and_the_unattended_policy_reach_the_spec_of_both_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain run nobody attends goes on after the timeout (continue); a debug run on the
    local pool ends (terminate), one on a scheduler's backend waits; the timeout is 5 minutes
    on the local pool, 30 elsewhere. A zero timeout is a timeout, not "the default"; the profile
    may turn post-mortem off."""
    from adapter.cli.parser import build_parser as _parser

    monkeypatch.setenv("TETHER_CONFIG", str(tmp_path / "none.toml"))

    def spec(*argv: str) -> RunSpec:
        args = _parser().parse_args([argv[0], "--workdir", str(tmp_path), *argv[1:], "--",
                                     "python", "t.py"])  # fmt: skip
        return build_spec(args, debug=argv[0] == "debug")

    run, debug = spec("run"), spec("debug")
    assert (run.post_mortem, run.on_unattended_stop, run.unattended_timeout) == (
        True,
        "continue",
        300.0,
    )
    assert (debug.post_mortem, debug.on_unattended_stop, debug.unattended_timeout) == (
        True,
        "terminate",
        300.0,
    )
    slurm = spec("debug", "--backend", "slurm")
    assert (slurm.on_unattended_stop, slurm.unattended_timeout) == ("wait", 1800.0)
    assert spec("run", "--backend", "slurm").unattended_timeout == 1800.0
    quick = spec("run", "--no-post-mortem", "--unattended-timeout", "0", "--webhook", "http://h/x")
    assert (quick.post_mortem, quick.unattended_timeout, quick.webhook) == (
        False,
        0.0,
        "http://h/x",
    )
    assert spec("run", "--on-unattended-stop", "wait").on_unattended_stop == "wait"
    (tmp_path / "none.toml").write_text("[default]\npost_mortem = false\n")
    assert spec("debug").post_mortem is False
    assert spec("debug", "--post-mortem").post_mortem is True


def test_workers_and_the_slurm_backend_can_refuse_tunnels() -> None:
    from adapter.cli.parser import build_parser as _parser

    for argv in (["worker"], ["up"], ["backend", "slurm"]):
        assert _parser().parse_args([*argv, "--no-shell"]).no_shell is True
        assert _parser().parse_args(argv).no_shell is False


@pytest.mark.parametrize(
    "garbage", [b"\x89PNG\r\n\x1a\n\x00\xff binary", b"relay = [not toml\n"], ids=["binary", "text"]
)
def test_a_config_that_is_not_toml_is_named_and_never_written_into(
    tmp_path: Path, garbage: bytes
) -> None:
    from adapter.config import check_config, profile_token, save_token

    path = tmp_path / "config.toml"
    path.write_bytes(garbage)
    with pytest.raises(ConfigError) as refused:
        load_profile(None, path)
    assert str(refused.value).startswith(f"{path}: ") and "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match=f"^{path}: "):
        check_config(path)
    with pytest.raises(ConfigError, match=f"^{path}: "):
        save_token("tthu_x", path=path)
    assert path.read_bytes() == garbage and profile_token(path=path) == ""
    assert check_config(tmp_path / "absent.toml") == tmp_path / "absent.toml"
