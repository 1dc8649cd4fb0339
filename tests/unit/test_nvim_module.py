"""The nvim-dap module (``editors/nvim/lua/tether``) under plain Lua 5.4: its configurations'
meaning (``launch.lua``: the `tether` command line, what is refused, the ready line), and that
``init.lua`` at least parses (it runs in real Neovim with nvim-dap in
``tests/e2e/test_nvim_e2e.py``). Skipped without Lua;
``.ci/run`` installs Debian's lua5.4 and luajit."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

NVIM = Path(__file__).resolve().parents[2] / "editors" / "nvim"


def lua(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (apt install lua5.4 luajit)")
    return found


@pytest.mark.parametrize("interpreter", ["lua5.4", "luajit"])  # Neovim's is LuaJIT (5.1)
def test_the_configurations_meaning_under_plain_lua(interpreter: str) -> None:
    done = subprocess.run(
        [lua(interpreter), str(NVIM / "test" / "launch_spec.lua")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr


def test_the_nvim_dap_glue_parses() -> None:
    for source in sorted((NVIM / "lua" / "tether").glob("*.lua")):
        done = subprocess.run(
            [lua("luac5.4"), "-p", str(source)], capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
