"""Working-directory snapshots: what goes in, and that unpacking never escapes the run directory."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from adapter.snapshot import SnapshotTooLarge, list_files, make_snapshot
from worker_shim.files import extract_snapshot


def make_tree(root: Path) -> None:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('hi')\n")
    (root / "pkg" / "model.py").write_text("x = 1\n")
    (root / "checkpoints").mkdir()
    (root / "checkpoints" / "big.pt").write_bytes(b"\0" * 100)
    (root / "notes.log").write_text("log\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"pyc")
    (root / ".gitignore").write_text("checkpoints/\n*.log\n")


def test_gitignore_is_respected_outside_git(tmp_path: Path) -> None:
    make_tree(tmp_path)
    assert list_files(tmp_path) == [".gitignore", "pkg/model.py", "train.py"]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_inside_a_git_work_tree_git_decides(tmp_path: Path) -> None:
    make_tree(tmp_path)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "untracked.py").write_text("y = 2\n")
    assert list_files(tmp_path) == [".gitignore", "pkg/model.py", "train.py", "untracked.py"]


def test_round_trip(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    make_tree(src)
    data, count = make_snapshot(src)
    assert count == 3
    assert extract_snapshot(data, dest) == 3
    assert (dest / "pkg" / "model.py").read_text() == "x = 1\n"
    assert not (dest / "checkpoints").exists()


def test_limit_gives_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)) * 4096)
    with pytest.raises(SnapshotTooLarge, match=r"exceeds .*\.gitignore"):
        make_snapshot(tmp_path, limit=1024)


def _archive(name: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    return buffer.getvalue()


def test_hostile_archives_cannot_write_outside(tmp_path: Path) -> None:
    with pytest.raises(tarfile.TarError):
        extract_snapshot(_archive("../escape.py"), tmp_path / "run")
    assert not (tmp_path / "escape.py").exists()
    extract_snapshot(_archive("/etc/evil.py"), tmp_path / "run")  # made relative, stays inside
    assert (tmp_path / "run" / "etc" / "evil.py").exists()
