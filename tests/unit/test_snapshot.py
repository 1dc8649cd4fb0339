"""Snapshots: what goes in, the manifest's validation, and materialising without trusting it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from adapter.snapshots.selection import list_files
from adapter.snapshots.snapshot import SnapshotError, build_snapshot
from protocol_specs.snapshots.snapshots import Manifest, ManifestEntry, digest_of
from worker_shim.program.files import SnapshotRefused, materialise


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


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_tetherignore_leaves_out_even_tracked_files(tmp_path: Path) -> None:
    make_tree(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.bin").write_bytes(b"\1" * 10)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "data/train.bin"], check=True)
    assert "data/train.bin" in list_files(tmp_path)
    (tmp_path / ".tetherignore").write_text("# datasets\ndata/\n")
    assert "data/train.bin" not in list_files(tmp_path)


def test_manifest_lists_modes_sizes_digests_and_inside_symlinks(tmp_path: Path) -> None:
    make_tree(tmp_path)
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "run.sh").chmod(0o755)
    os.symlink("pkg/model.py", tmp_path / "model_link.py")
    os.symlink("/etc", tmp_path / "outside")
    snap = build_snapshot(tmp_path)
    entries = {e.path: e for e in snap.manifest.entries}
    assert entries["run.sh"].mode == 0o755
    assert entries["train.py"].size == len("print('hi')\n")
    assert entries["train.py"].digest == digest_of(b"print('hi')\n")
    assert entries["model_link.py"].kind == "symlink"
    assert entries["model_link.py"].target == "pkg/model.py"
    assert "outside" not in entries
    assert any("outside -> /etc points outside" in w for w in snap.warnings)


def test_size_limit_gives_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)) * 4096)
    with pytest.raises(
        SnapshotError, match=r"more than .* \(reached at blob.bin\).*\.tetherignore"
    ):
        build_snapshot(tmp_path, limit=1024)


def test_unreadable_file_gives_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "secret.txt").write_text("x")
    (tmp_path / "secret.txt").chmod(0)  # enough unless root; the patch covers root (CI)

    def refuse(path: Path) -> str:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("adapter.snapshots.snapshot._hash_file", refuse)
    with pytest.raises(SnapshotError, match=r"cannot read secret.txt: permission denied"):
        build_snapshot(tmp_path)


DIGEST = "0" * 64


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ([{"path": "../escape.py", "digest": DIGEST}], "'..' component"),
        ([{"path": "/etc/passwd", "digest": DIGEST}], "is absolute"),
        ([{"path": "a//b", "digest": DIGEST}], "empty"),
        ([{"path": "a\\..\\b", "digest": DIGEST}], "backslash"),
        ([{"path": "C:/x", "digest": DIGEST}], "is absolute"),
        ([{"path": "x", "kind": "symlink", "target": "/etc"}], "points out"),
        ([{"path": "a/x", "kind": "symlink", "target": "../../etc"}], "points out"),
        ([{"path": "x", "digest": "nothex"}], "SHA-256"),
        (
            [{"path": "a", "digest": DIGEST}, {"path": "a", "digest": DIGEST}],
            "listed twice",
        ),
        (
            [
                {"path": "link", "kind": "symlink", "target": "d"},
                {"path": "link/f", "digest": DIGEST},
            ],
            "lies under",
        ),
        (
            [
                {"path": "x/f", "digest": DIGEST},
                {"path": "a/b/k", "kind": "symlink", "target": "../../x"},
                {"path": "m", "kind": "symlink", "target": "a/b/k/../.."},
            ],
            "points out",
        ),
        (
            [
                {"path": "p", "kind": "symlink", "target": "q"},
                {"path": "q", "kind": "symlink", "target": "p"},
            ],
            "too many levels",
        ),
        ([{"path": "x", "digest": DIGEST, "size": 3 * 1024**3}], "less than or equal"),
    ],
)
def test_hostile_manifests_are_refused(entries: list[dict[str, object]], why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        Manifest.model_validate({"entries": entries})


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "path": st.text(alphabet="ab./\\\x00:", max_size=12),
                "kind": st.sampled_from(["file", "symlink"]),
                "target": st.text(alphabet="ab./", max_size=12),
                "digest": st.just(DIGEST),
            }
        ),
        max_size=6,
    )
)
def test_any_manifest_that_decodes_stays_inside(entries: list[dict[str, object]]) -> None:
    """Whatever a peer sends: it is refused, or every path and link resolves inside the tree."""
    for e in entries:
        if e["kind"] == "symlink":
            e["digest"] = ""
        else:
            e["target"] = ""
    try:
        manifest = Manifest.model_validate({"entries": entries})
    except ValidationError:
        return
    root = Path("/r")
    for entry in manifest.entries:
        resolved = os.path.normpath(root / entry.path)
        assert resolved.startswith("/r/")
        if entry.kind == "symlink":
            target = os.path.normpath(Path(resolved).parent / entry.target)
            assert target.startswith("/r/")


def _fetcher(blobs: dict[str, bytes]):  # type: ignore[no-untyped-def]
    async def fetch(digest: str, offset: int) -> tuple[int, bytes]:
        data = blobs[digest]
        return len(data), data[offset : offset + 3]  # small pieces: the loop is exercised

    return fetch


def test_round_trip_through_the_cache(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_tree(src)
    os.symlink("pkg/model.py", src / "link.py")
    snap = build_snapshot(src)
    blobs = {d: (src / rel).read_bytes() for d, rel in snap.sources.items()}

    async def main() -> None:
        n = await materialise(
            snap.manifest, tmp_path / "run1", _fetcher(blobs), cache=tmp_path / "cache"
        )
        assert n == 3
        # a second run needs no download at all
        n = await materialise(
            snap.manifest, tmp_path / "run2", _fetcher({}), cache=tmp_path / "cache"
        )
        assert n == 3

    trio.run(main)
    for run in ("run1", "run2"):
        assert (tmp_path / run / "pkg" / "model.py").read_text() == "x = 1\n"
        assert os.readlink(tmp_path / run / "link.py") == "pkg/model.py"
        assert not (tmp_path / run / "checkpoints").exists()


def test_bytes_that_do_not_match_their_digest_are_refused(tmp_path: Path) -> None:
    manifest = Manifest(entries=[ManifestEntry(path="a.py", digest=digest_of(b"good"), size=4)])

    async def main() -> None:
        with pytest.raises(SnapshotRefused, match="does not match"):
            await materialise(
                manifest,
                tmp_path / "run",
                _fetcher({digest_of(b"good"): b"evil"}),
                cache=tmp_path / "cache",
            )

    trio.run(main)
    assert not (tmp_path / "run" / "a.py").exists()
    assert not list((tmp_path / "cache").rglob("*" + digest_of(b"good")[2:]))


def test_materialising_needs_a_new_directory(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    os.symlink("/tmp", tmp_path / "run" / "pkg")  # planted before the snapshot arrives
    manifest = Manifest(entries=[ManifestEntry(path="pkg/x.py", digest=digest_of(b"x"), size=1)])

    async def main() -> None:
        with pytest.raises(FileExistsError):
            await materialise(
                manifest, tmp_path / "run", _fetcher({digest_of(b"x"): b"x"}), cache=tmp_path / "c"
            )

    trio.run(main)
