"""The snapshot digest cache: unchanged files are not read again; changed ones always are."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from adapter import snapshot
from adapter.snapshot import HashCache, build_snapshot


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
