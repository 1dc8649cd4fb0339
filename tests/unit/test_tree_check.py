"""Checking a root tree reading only what changed (``protocol_specs/snapshots/tree_check.py``): the same
verdict and totals as expanding it whole, the limits kept across subtrees taken on trust."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest

from protocol_specs.snapshots import snapshots
from protocol_specs.snapshots.snapshots import Manifest, ManifestEntry
from protocol_specs.snapshots.tree_check import Summary, TreeCheck
from protocol_specs.snapshots.trees import (
    MAX_DEPTH,
    TreeError,
    Trees,
    build_trees,
    decode_tree,
    encode_tree,
)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def manifest(paths: dict[str, str], links: dict[str, str] | None = None) -> Manifest:
    entries = [ManifestEntry(path=p, size=len(c), digest=digest(c)) for p, c in paths.items()]
    entries += [ManifestEntry(path=p, kind="symlink", target=t) for p, t in (links or {}).items()]
    return Manifest(entries=sorted(entries, key=lambda e: e.path))


TREE = {f"pkg{d}/sub/f{f}.py": f"{d}.{f}" for d in range(4) for f in range(5)} | {"train.py": "t"}


def check(
    trees: Trees, known: Callable[[str], Summary | None] = lambda _d: None
) -> tuple[TreeCheck, list[str]]:
    """The check run to its end on ``trees``; the trees it read."""
    run = TreeCheck(trees.root, known)
    read = []
    while run.needs:
        for wanted in list(run.needs):
            read.append(wanted)
            run.feed_rows(wanted, decode_tree(trees.blobs[wanted]))
    run.result()
    return run, read


def test_with_nothing_known_every_tree_is_read_and_the_totals_are_the_manifests() -> None:
    m = manifest(TREE, {"latest": "pkg1/sub/f2.py"})
    trees = build_trees(m)
    run, read = check(trees)
    assert sorted(read) == sorted(trees.blobs)
    whole = run.checked[trees.root]
    assert (whole.files, whole.bytes) == (len(m.entries), m.total_bytes)
    assert (whole.depth, whole.longest, whole.links) == (2, len("pkg0/sub/f0.py"), True)
    assert sorted(run.files) == sorted(m.digests)


def test_a_second_check_reads_only_the_trees_that_changed() -> None:
    first, _ = check(build_trees(manifest(TREE)))
    changed = build_trees(manifest(TREE | {"pkg2/sub/f3.py": "new"}))
    run, read = check(changed, first.checked.get)
    assert len(read) == 3  # the root, pkg2, pkg2/sub
    assert sorted(run.files) == sorted(
        {digest(c) for p, c in TREE.items() if "pkg2" in p or p == "train.py"} - {digest("2.3")}
        | {digest("new")}
    )
    # the same summaries as a check that trusts nothing
    fresh, _ = check(changed)
    assert run.checked == {d: s for d, s in fresh.checked.items() if d in run.checked}
    assert run.checked[changed.root] == fresh.checked[changed.root]


def test_a_subtree_holding_a_symlink_is_read_every_time() -> None:
    links = {"pkg0/sub/up": "../../pkg1"}
    first, _ = check(build_trees(manifest(TREE, links)))
    changed = build_trees(manifest(TREE | {"pkg3/sub/f0.py": "x"}, links))
    _, read = check(changed, first.checked.get)
    assert len(read) == 5  # root, pkg3 and its sub, pkg0 and its sub (a link below)


def test_a_link_that_leaves_the_snapshot_is_refused() -> None:
    # pkg0's tree, whose link points at ../pkg1, submitted as a snapshot of its own
    trees = build_trees(manifest(TREE, {"pkg0/out": "../pkg1"}))
    pkg0 = next(r[4] for r in decode_tree(trees.blobs[trees.root]) if r[0] == "pkg0")
    with pytest.raises(TreeError, match="points out of the snapshot"):
        check(Trees(root=pkg0, blobs=trees.blobs))


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def known_subtree(summary: Summary) -> tuple[str, Callable[[str], Summary | None]]:
    sub = digest("a subtree")
    return sub, {sub: summary}.get


def root_naming(sub: str, names: list[str]) -> Trees:
    data = encode_tree(sorted((n, "d", 0, 0, sub) for n in names))
    return Trees(root=digest_of(data), blobs={digest_of(data): data})


def test_a_trusted_subtree_still_counts_against_the_limits() -> None:
    # many directories naming one known subtree of many files: over the file limit
    sub, known = known_subtree(Summary(files=150_000, bytes=1, paths=150_001, longest=10))
    with pytest.raises(TreeError, match="more than"):
        check(root_naming(sub, ["a", "b"]), known)
    # a path of the subtree too long where it is placed
    sub, known = known_subtree(Summary(files=1, paths=1, longest=snapshots.MAX_PATH_CHARS - 1))
    with pytest.raises(TreeError, match="longer than"):
        check(root_naming(sub, ["ab"]), known)
    # nested too deep
    sub, known = known_subtree(Summary(files=1, paths=1, longest=2, depth=MAX_DEPTH))
    with pytest.raises(TreeError, match="deeper"):
        check(root_naming(sub, ["a"]), known)
    # within every limit: taken unread
    sub, known = known_subtree(Summary(files=3, bytes=9, paths=4, longest=5, depth=1))
    run, read = check(root_naming(sub, ["a", "b"]), known)
    assert len(read) == 1 and run.checked[run.root] == Summary(6, 18, 10, 7, 2, False)


def test_a_tree_not_asked_for_is_refused() -> None:
    trees = build_trees(manifest(TREE))
    run = TreeCheck(trees.root, lambda _d: None)
    with pytest.raises(TreeError, match="not asked for"):
        run.feed_rows(digest("other"), [])
