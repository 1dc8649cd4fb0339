"""The snapshot digest cache: unchanged files are not read again; changed ones always are."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from adapter.snapshots import snapshot
from adapter.snapshots.hash_cache import HashCache
from adapter.snapshots.snapshot import build_snapshot


def _age(path: Path, seconds: float = 3600) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_an_unchanged_file_is_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("a.py", "b.py"):
        (tree / name).write_text(f"print({name!r})\n")
        _age(tree / name)
    cache_dir = tmp_path / "cache"
    first = build_snapshot(tree, cache=HashCache.for_tree(cache_dir, tree))

    read: list[Path] = []
    real = snapshot._hash_file
    monkeypatch.setattr(snapshot, "_hash_file", lambda p: read.append(Path(p)) or real(p))
    again = build_snapshot(tree, cache=HashCache.for_tree(cache_dir, tree))
    assert read == [] and again.manifest == first.manifest

    (tree / "b.py").write_text("print('changed')\n")  # same size? no matter: the stat changed
    changed = build_snapshot(tree, cache=HashCache.for_tree(cache_dir, tree))
    assert read == [tree / "b.py"]
    assert changed.manifest != first.manifest
    assert {e.path: e.digest for e in changed.manifest.entries}["a.py"] == {
        e.path: e.digest for e in first.manifest.entries
    }["a.py"]


def test_a_file_changed_within_the_racy_window_is_never_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    target = tree / "fresh.py"
    target.write_text("x = 1\n")  # just written: its digest is not kept
    cache_dir = tmp_path / "cache"
    build_snapshot(tree, cache=HashCache.for_tree(cache_dir, tree))
    st = target.stat()
    target.write_text("x = 2\n")  # same size, and it may well keep the same mtime tick
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    read: list[Path] = []
    real = snapshot._hash_file
    monkeypatch.setattr(snapshot, "_hash_file", lambda p: read.append(Path(p)) or real(p))
    again = build_snapshot(tree, cache=HashCache.for_tree(cache_dir, tree))
    assert read == [target]
    assert again.manifest.entries[0].digest == real(target)


def test_a_broken_cache_file_only_costs_a_rehash(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.py").write_text("a = 1\n")
    _age(tree / "a.py")
    cache = HashCache.for_tree(tmp_path / "cache", tree)
    cache.path.parent.mkdir(parents=True)
    cache.path.write_text("{not json")
    assert build_snapshot(tree, cache=HashCache.for_tree(tmp_path / "cache", tree)).manifest == (
        build_snapshot(tree).manifest
    )


def _tree(root: Path) -> None:
    for d in ("pkg", "pkg/sub", "data"):
        for n in range(3):
            path = root / d / f"f{n}.py"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{d} {n}\n")
            _age(path)
    (root / "train.py").write_text("print('train')\n")
    _age(root / "train.py")


def _built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many trees each snapshot encodes from rows (a directory not rebuilt encodes none)."""
    built: list[int] = []
    real = snapshot.encode_tree

    def counted(rows: list[snapshot.Row]) -> bytes:
        built.append(len(rows))
        return real(rows)

    monkeypatch.setattr(snapshot, "encode_tree", counted)
    return built


def test_a_directory_where_nothing_changed_is_not_built_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree, cache_dir = tmp_path / "tree", tmp_path / "cache"
    _tree(tree)
    first = build_snapshot(tree, cache=HashCache.for_tree(cache_dir, tree))
    built = _built(monkeypatch)
    again = build_snapshot(tree, cache=HashCache.for_tree(cache_dir, tree))
    assert built == [] and again.trees.root == first.trees.root
    assert (
        (again.files, again.size) == (first.files, first.size) == (10, first.manifest.total_bytes)
    )
    (tree / "pkg" / "sub" / "f1.py").write_text("changed\n")
    _age(tree / "pkg" / "sub" / "f1.py")
    changed = build_snapshot(tree, cache=HashCache.for_tree(cache_dir, tree))
    assert len(built) == 3  # pkg/sub, pkg and the root; data's record still good
    assert changed.trees.root == build_snapshot(tree).trees.root  # as built from nothing


def test_whatever_changes_the_trees_are_those_built_from_nothing(tmp_path: Path) -> None:
    tree, cache_dir = tmp_path / "tree", tmp_path / "cache"
    _tree(tree)
    changes = [
        lambda: (tree / "data" / "f0.py").unlink(),
        lambda: (tree / "new" / "deep").mkdir(parents=True),
        lambda: (tree / "new" / "deep" / "x.py").write_text("x\n"),
        lambda: os.symlink("../pkg/f0.py", tree / "data" / "link.py"),
        lambda: (tree / "pkg" / "f2.py").chmod(0o755),
        lambda: os.rename(tree / "pkg" / "sub", tree / "moved"),
        lambda: os.symlink("/etc", tree / "pkg" / "outside"),
    ]
    for change in changes:
        change()
        cached = build_snapshot(tree, cache=HashCache.for_tree(cache_dir, tree))
        fresh = build_snapshot(tree)
        assert cached.trees.root == fresh.trees.root and cached.manifest == fresh.manifest
        assert cached.warnings == fresh.warnings
    assert any("outside -> /etc" in w for w in cached.warnings)


def test_a_damaged_directory_record_is_not_used(tmp_path: Path) -> None:
    import msgpack

    tree, cache_dir = tmp_path / "tree", tmp_path / "cache"
    _tree(tree)
    cache = HashCache.for_tree(cache_dir, tree)
    first = build_snapshot(tree, cache=cache)
    saved = msgpack.unpackb(cache.path.read_bytes())
    saved["dirs"]["pkg"][3] = b"not the tree"  # the digest no longer matches
    cache.path.write_bytes(msgpack.packb(saved))
    again = build_snapshot(tree, cache=HashCache.for_tree(cache_dir, tree))
    assert again.trees.root == first.trees.root
    assert again.trees.blobs[again.trees.root] == first.trees.blobs[first.trees.root]


def test_progress_counts_the_bytes_read_against_those_to_read(tmp_path: Path) -> None:
    tree, cache_dir = tmp_path / "tree", tmp_path / "cache"
    _tree(tree)
    seen: list[tuple[int, int]] = []

    def build() -> None:
        seen.clear()
        cache = HashCache.for_tree(cache_dir, tree)
        build_snapshot(tree, cache=cache, progress=lambda done, total: seen.append((done, total)))

    build()
    whole = sum(p.stat().st_size for p in tree.rglob("*") if p.is_file())
    assert len(seen) == 10 and seen[-1] == (whole, whole)  # every file, the total known at once
    assert all(done <= total == whole for done, total in seen)
    build()
    assert seen == []  # nothing to read
    (tree / "data" / "f2.py").write_text("a change\n")
    _age(tree / "data" / "f2.py")
    build()
    assert seen == [(len("a change\n"), len("a change\n"))]
