"""The VS Code extension's decisions (``editors/vscode/src/launch.js``, ``runs_model.js``), by
node's own test runner: what a configuration means, which are refused, how a run reads in the
runs view. Real VS Code runs the whole extension in ``tests/e2e/test_vscode_e2e.py``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

EXTENSION = Path(__file__).resolve().parents[2] / "editors" / "vscode"


def test_the_extensions_own_unit_tests_pass() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    done = subprocess.run(
        [node, "--test", "test/"], cwd=EXTENSION, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "# fail 0" in done.stdout and "# pass 0" not in done.stdout, done.stdout[-1000:]
