"""Several local stacks (``tether up``, one per data directory): which one a command talks to, the
records they leave, and the token a command presents (adapter/cli/stacks.py, settings.py)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from adapter.cli.settings import resolve_relay
from adapter.cli.stacks import (
    StackRecord,
    choose,
    live_stacks,
    record_stack,
    stack_at,
    unrecord_stack,
    write_token,
)

A = StackRecord("ws://127.0.0.1:1001", Path("/d/a"), 11, since=1.0)
B = StackRecord("ws://127.0.0.1:1002", Path("/d/b"), 12, since=2.0)
DEFAULT = StackRecord("ws://127.0.0.1:8765", Path("/home/me/.tether/data"), 13, since=3.0)


def test_the_stack_named_wins_and_one_not_running_is_refused_with_those_that_run() -> None:
    assert choose([A, B], Path("/d/a"), DEFAULT.data_dir) is A
    said = choose([A, B], Path("/d/c"), DEFAULT.data_dir)
    assert said == (
        "no `tether up` serves the data directory /d/c; running: "
        "/d/a (ws://127.0.0.1:1001), /d/b (ws://127.0.0.1:1002)"
    )
    assert choose([], Path("/d/c"), DEFAULT.data_dir) == (
        "no `tether up` serves the data directory /d/c"
    )


def test_the_only_one_else_the_default_directorys_else_a_refusal_listing_them() -> None:
    assert "no relay to talk to" in str(choose([], None, DEFAULT.data_dir))
    assert choose([B], None, DEFAULT.data_dir) is B  # the first one ended: the other is found
    assert choose([A, DEFAULT, B], None, DEFAULT.data_dir) is DEFAULT
    said = choose([A, B], None, DEFAULT.data_dir)
    assert isinstance(said, str) and said.startswith("2 `tether up` stacks run here: /d/a (")
    assert "/d/b (ws://127.0.0.1:1002)" in said and "--stack DATA_DIR" in said


def _ended_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_records_of_running_stacks_are_found_and_those_of_ended_ones_dropped(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    record_stack(home, "ws://127.0.0.1:1001", tmp_path / "a")
    (record,) = live_stacks(home)
    assert (record.relay, record.data_dir, record.pid) == (
        "ws://127.0.0.1:1001",
        tmp_path / "a",
        os.getpid(),
    )
    assert stat_mode(next((home / "stacks").iterdir())) == 0o600
    assert stack_at(home, "ws://localhost:1001/") == record
    # a killed stack's record (its process gone), and one whose pid another process reuses
    gone = home / "stacks" / "gone.json"
    gone.write_text(json.dumps({"relay": "ws://x:1", "data_dir": "/x", "pid": _ended_pid()}))
    reused = home / "stacks" / "reused.json"
    reused.write_text(
        json.dumps({"relay": "ws://y:1", "data_dir": "/y", "pid": os.getpid(), "started": "1"})
    )
    assert live_stacks(home) == [record]
    assert not gone.exists() and not reused.exists()
    unrecord_stack(home, tmp_path / "b")  # not ours: nothing happens
    assert live_stacks(home) == [record]
    unrecord_stack(home, tmp_path / "a")
    assert live_stacks(home) == []


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


@pytest.fixture
def two_stacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Two running stacks (records of this process) with their tokens, no config file."""
    home = tmp_path / "home"
    for var in ("TETHER_RELAY", "TETHER_TOKEN", "TETHER_STACK", "TETHER_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TETHER_HOME", str(home))
    monkeypatch.setenv("TETHER_CONFIG", str(tmp_path / "config.toml"))
    first, second = tmp_path / "first", tmp_path / "second"
    for data, port, token in ((first, 1001, "tthu_first"), (second, 1002, "tthu_second")):
        data.mkdir()
        write_token(data, token)
        record_stack(home, f"ws://127.0.0.1:{port}", data)
    return first, second


def _args(stack: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(profile=None, ca_file=None, stack=stack)


def test_a_command_talks_to_the_stack_it_names_with_that_stacks_token(
    two_stacks: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = two_stacks
    with pytest.raises(SystemExit, match="2 `tether up` stacks run here"):
        resolve_relay(None, _args())
    got = resolve_relay(None, _args(stack=str(second)))
    assert (got.url, got.token) == ("ws://127.0.0.1:1002", "tthu_second")
    monkeypatch.setenv("TETHER_STACK", str(first))
    got = resolve_relay(None, _args())
    assert (got.url, got.token) == ("ws://127.0.0.1:1001", "tthu_first")
    # --relay naming a stack's URL presents that stack's token; TETHER_TOKEN always wins
    got = resolve_relay("ws://127.0.0.1:1002", _args())
    assert (got.url, got.token) == ("ws://127.0.0.1:1002", "tthu_second")
    monkeypatch.setenv("TETHER_TOKEN", "tthu_mine")
    assert resolve_relay("ws://127.0.0.1:1002", _args()).token == "tthu_mine"


def test_a_profile_that_names_a_relay_and_a_token_is_used_as_written(
    two_stacks: tuple[Path, Path], tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    fd = os.open(config, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b'[default]\nrelay = "ws://127.0.0.1:1001"\ntoken = "tthu_written"\n')
    os.close(fd)
    got = resolve_relay(None, _args())
    assert (got.url, got.token) == ("ws://127.0.0.1:1001", "tthu_written")
    # a stack named explicitly wins over the profile's relay, with its own token
    got = resolve_relay(None, _args(stack=str(two_stacks[1])))
    assert (got.url, got.token) == ("ws://127.0.0.1:1002", "tthu_second")


def test_stopping_a_stack_says_which_runs_end_lost_or_that_none_ran() -> None:
    from adapter.cli.local_stack import stopping_text
    from protocol_specs.runs.runs import Attempt, RunRecord, RunState
    from protocol_specs.runs.spec import RunSpec

    spec = RunSpec(command=["python", "t.py"], workdir="/w")

    def run(
        id: str, state: RunState, worker: str = "", retries: int = 0, **ended: object
    ) -> RunRecord:
        attempt = Attempt(n=1, worker=worker, **ended)  # type: ignore[arg-type]
        retried = spec.model_copy(update={"max_retries": retries})
        return RunRecord(id=id, spec=retried, state=state, worker=worker, attempts=[attempt])

    assert stopping_text([], "h-pool", 100.0) == "no run was running"
    records = [
        run("r1", RunState.RUNNING, "h-pool-0"),
        run("r2", RunState.PAUSED, "h-pool-1"),
        run("r3", RunState.RUNNING, "other-host-0"),  # another worker's: goes on
        run("r4", RunState.SUCCEEDED, "h-pool-0", ended_at=150.0, outcome="succeeded"),
        run("r5", RunState.QUEUED),
        # lost before this stack started (an earlier tether up's stop): not this stop's doing
        run("r6", RunState.LOST, "h-pool-0", ended_at=50.0, outcome="lost"),
    ]
    assert stopping_text(records, "h-pool", 100.0) == (
        "runs r1, r2 end lost (`tether rerun RUN` runs one again); "
        "1 queued run starts at the next `tether up`"
    )
    # the pool already ended them (a Ctrl-C reaches its tasks first): still this stop's doing
    already = [
        run("r7", RunState.LOST, "h-pool-0", ended_at=120.0, outcome="lost"),
        run("r8", RunState.STARTING, "h-pool-1", retries=1),
    ]
    assert stopping_text(already, "h-pool", 100.0) == (
        "run r7 ends lost (`tether rerun r7` runs it again); run r8: back to the queue (a retry); "
        "1 queued run starts at the next `tether up`"
    )


def test_stopping_a_stack_says_which_runs_it_preempted() -> None:
    from adapter.cli.local_stack import stopping_text
    from protocol_specs.runs.runs import Attempt, RunRecord, RunState
    from protocol_specs.runs.spec import RunSpec

    spec = RunSpec(command=["python", "t.py"], workdir="/w")
    ended = Attempt(n=1, worker="h-pool-0", ended_at=120.0, outcome="preempted", exit_code=3)
    preempted = RunRecord(
        id="r1", spec=spec, state=RunState.QUEUED, attempt=2, attempts=[ended, Attempt(n=2)]
    )
    assert stopping_text([preempted], "h-pool", 100.0) == (
        "run r1: preempted, back to the queue (no retry used); "
        "1 queued run starts at the next `tether up`"
    )
