"""What a newcomer's fresh clone does with the README's first commands, with the real tools:
``./dev vsix`` packages the VS Code extension (npm, vsce), and installing the project (``pip install
-e .``, as ``./dev`` does, or a wheel) says nothing but that it installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
import trio
from stack import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def fresh_clone(tmp_path: Path) -> Path:
    """The files a ``git clone`` of this work tree gives, as they are now (tracked, and untracked
    but not ignored): no ``build/``, no ``node_modules``, no ``.venv``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout  # fmt: skip
    clone = tmp_path / "clone"
    for name in sorted({n for n in listed.decode().split("\0") if n}):
        source, target = REPO / name, clone / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the work tree
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
    return clone


async def _run(argv: list[str], cwd: Path, timeout: float) -> tuple[int, str]:
    with trio.fail_after(timeout):
        done = await trio.run_process(
            argv, cwd=cwd, capture_stdout=True, stderr=subprocess.STDOUT, check=False
        )
    return done.returncode, done.stdout.decode(errors="replace")


async def test_dev_vsix_packages_the_extension_in_a_fresh_clone(tmp_path: Path) -> None:
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("./dev vsix needs node and npm")
    clone = fresh_clone(tmp_path)
    assert not (clone / "build").exists() and not (clone / "editors/vscode/node_modules").exists()
    code, said = await _run(["./dev", "vsix"], clone, timeout=400)
    assert code == 0, said
    vsix = clone / "build" / "tether-vscode.vsix"
    assert "built build/tether-vscode.vsix" in said and vsix.exists(), said
    with zipfile.ZipFile(vsix) as packaged:
        names = set(packaged.namelist())
    assert {"extension/package.json", "extension/extension.js", "extension/src/debug.js"} <= names
    assert not (clone / ".venv").exists(), "packaging the extension needs node only"


def _setuptools_warnings(output: str) -> list[str]:
    """Python warnings from the build (``BuildBackendWarning: ...``, ``SetuptoolsWarning: ...``);
    pip's own notices (``WARNING: ...``, about this machine's index) are not the project's."""
    return [line.strip() for line in output.splitlines() if "Warning:" in line]


async def test_installing_a_fresh_clone_is_quiet_and_ships_the_web_views_files(
    tmp_path: Path,
) -> None:
    clone = fresh_clone(tmp_path)
    # as ./dev installs it (editable), into a venv of its own: the tests' venv is left alone
    # (pip's --prefix would uninstall the tests' tether first)
    venv.EnvBuilder(with_pip=False).create(tmp_path / "venv")
    target = tmp_path / "venv" / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", str(target)]
    code, said = await _run([*pip, "install", "--no-deps", "-e", str(clone)], clone, timeout=300)
    assert code == 0, said
    assert _setuptools_warnings(said) == [], said
    code, listed = await _run(
        [str(target), "-c", "import relay.web.assets as a; print(sorted(a.FILES))"], tmp_path, 60
    )
    assert code == 0 and listed.strip() == "['app.css', 'app.js']", listed
    # a real install: the web view's stylesheet and script are in the wheel
    code, said = await _run(
        [*pip, "wheel", "--no-deps", "-w", str(tmp_path), str(clone)], clone, 300
    )
    assert code == 0, said
    assert _setuptools_warnings(said) == [], said
    (wheel,) = tmp_path.glob("tether-*.whl")
    with zipfile.ZipFile(wheel) as built:
        names = set(built.namelist())
    assert {"relay/web/static/app.css", "relay/web/static/app.js"} <= names
    assert "protocol_specs/dap/vendored/debugAdapterProtocol.json" in names
