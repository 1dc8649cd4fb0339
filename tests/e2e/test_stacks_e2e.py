"""Two `tether up` side by side, each with its own data directory (as several Jupyter servers or
docker contexts coexist): neither takes the other's token or address, the user's config file is
left as they wrote it, a command finds the stack it is pointed at (or the one running), and when
one stack ends the commands fall back to the other (real processes)."""

from __future__ import annotations

import re
import stat
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
import trio
from stack import TETHER, Proc, home_env, tether

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

USERS_CONFIG = "# mine\n[default]\nmax_retries = 0\n"


async def cli(home: Path, *args: str, cwd: Path, **env: str) -> tuple[int, str, str]:
    with trio.fail_after(90):
        done = await trio.run_process(
            [TETHER, *args], env={**home_env(home), **env}, cwd=cwd, capture_stdout=True,
            capture_stderr=True, check=False,
        )  # fmt: skip
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def up(home: Path, data: Path, workers: int) -> AbstractAsyncContextManager[Proc]:
    return tether(
        "up", "--data-dir", str(data), "--workers", str(workers), "--relay-port", "0",
        home=home, name=f"up {data.name}",
    )  # fmt: skip


async def test_two_stacks_with_their_own_data_dirs_coexist_and_outlive_each_other(
    tmp_path: Path,
) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    (project / "app.py").write_text("print('hello from the run')\n")
    config = home / "config.toml"
    config.write_text(USERS_CONFIG)
    first, second = tmp_path / "first", tmp_path / "second"
    async with up(home, first, 1) as up_first:
        relay_first = (await up_first.wait_line(r"tether up: ready relay=(\S+)")).group(1)
        code, out, err = await cli(home, "run", "-f", "--", "python", "app.py", cwd=project)
        assert code == 0 and "hello from the run" in out, err  # the only stack: found
        ran_first = re.search(r"tether run: run (\w+) queued", err).group(1)  # type: ignore[union-attr]
        async with up(home, second, 0) as up_second:
            relay_second = (await up_second.wait_line(r"tether up: ready relay=(\S+)")).group(1)
            # the first still answers with the token it gave out: the second took nothing
            code, out, err = await cli(home, "ls", "--relay", relay_first, cwd=project)
            assert code == 0 and ran_first in out, err
            await up_second.wait_line(rf"another tether up runs: {first} \({relay_first}\)")
            # two run: a command that names neither is told which to choose
            code, out, err = await cli(home, "ls", cwd=project)
            assert code == 1 and "2 `tether up` stacks run here" in err, (out, err)
            assert str(first) in err and str(second) in err and "--stack DATA_DIR" in err
            assert "Traceback" not in err
            # used one after the other, by data directory
            code, out, err = await cli(
                home, "run", "--stack", str(second), "--", "python", "app.py", cwd=project
            )
            assert code == 0, err
            queued_second = out.strip()
            code, out, err = await cli(home, "ls", cwd=project, TETHER_STACK=str(second))
            assert code == 0 and queued_second in out and ran_first not in out, err
            code, out, err = await cli(home, "ls", "--stack", str(first), cwd=project)
            assert code == 0 and ran_first in out and queued_second not in out, err
        # the second ended: the first is what runs, and every command finds it again
        code, out, err = await cli(home, "ls", cwd=project)
        assert code == 0 and ran_first in out and queued_second not in out, err
        code, out, err = await cli(home, "run", "-f", "--", "python", "app.py", cwd=project)
        assert code == 0 and "hello from the run" in out, err
        code, out, err = await cli(home, "ls", cwd=project, TETHER_STACK=str(second))
        assert code == 1 and f"no `tether up` serves the data directory {second}" in err, err
        assert relay_second not in err and str(first) in err
    assert config.read_text() == USERS_CONFIG  # the user's file, as they wrote it
    for data in (first, second):
        assert stat.S_IMODE((data / "token").stat().st_mode) == 0o600
    # ended: nothing is recorded as running any more
    code, _, err = await cli(home, "ls", cwd=project)
    assert code == 1 and "no relay to talk to" in err, err


async def test_tether_up_never_writes_into_a_config_it_cannot_parse(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    config = home / "config.toml"
    for garbage in (b"this is = not [toml\n", b"\x89PNG\r\n\x1a\n\x00\xff\xfe binary"):
        config.write_bytes(garbage)
        code, out, err = await cli(
            home, "up", "--data-dir", str(tmp_path / "data"), "--relay-port", "0", cwd=tmp_path
        )
        assert code == 1 and err.startswith(f"tether up: {config}: "), (out, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert config.read_bytes() == garbage
        code, out, err = await cli(home, "ls", cwd=tmp_path)  # and every other command
        assert code == 1 and err.startswith(f"tether: {config}: "), (out, err)
        assert len(err.strip().splitlines()) == 1
