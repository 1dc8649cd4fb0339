"""Snapshots as Merkle trees (``protocol_specs/snapshots/trees.py``): built from a manifest, expanded back,
and every malformed or oversized tree refused."""

from __future__ import annotations

import hashlib

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol_specs.snapshots.snapshots import Manifest, ManifestEntry
from protocol_specs.snapshots.trees import (
    Expansion,
    TreeError,
    Trees,
    build_trees,
    decode_tree,
    encode_tree,
)
from relay.snapshots import trees as relay_trees


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def manifest(*paths: str, changed: str = "") -> Manifest:
    entries = [
        ManifestEntry(path=p, size=len(p), digest=digest(p + ("!" if p == changed else "")))
        for p in paths
    ]
    return Manifest(entries=sorted(entries, key=lambda e: e.path))


PATHS = ("README.md", "src/a.py", "src/b.py", "src/deep/x/y.py", "tests/t.py")


def expand_all(root: str, blobs: dict[str, bytes]) -> Manifest:
    expansion = Expansion(root)
    while expansion.needs:
        wanted = expansion.needs[0]
        expansion.feed(wanted, blobs[wanted])
    return expansion.manifest()


def expand(trees: Trees) -> Manifest:
    return expand_all(trees.root, trees.blobs)


def test_a_manifest_comes_back_whole_from_its_trees() -> None:
    m = Manifest(
        entries=[
            *manifest(*PATHS).entries[:2],
            ManifestEntry(path="link", kind="symlink", target="src/a.py"),
            *manifest(*PATHS).entries[2:],
        ]
    )
    m = Manifest(entries=sorted(m.entries, key=lambda e: e.path))
    trees = build_trees(m)
    # one tree per directory, the root last, every tree after the ones below it
    assert len(trees.blobs) == len(trees.order) == 5 and trees.order[-1] == trees.root
    got = expand(trees)
    assert got == m and got.id == m.id


def test_a_changed_file_changes_only_the_trees_above_it() -> None:
    before = build_trees(manifest(*PATHS))
    after = build_trees(manifest(*PATHS, changed="src/deep/x/y.py"))
    new = set(after.blobs) - set(before.blobs)
    assert len(new) == 4  # src/deep/x, src/deep, src, the root
    # asking top-down: the root, then its children that changed, ...: unchanged subtrees are
    # one digest each
    asked, lacking, level = [], [], [after.root]
    while level:
        asked += level
        missing = [d for d in level if d not in before.blobs and d != digest("x")]
        lacking += missing
        level = after.children(missing)
    assert set(lacking) >= new
    assert len(asked) <= 12  # of 5 files and 6 trees, the unchanged tests/ tree counts once


def test_the_same_subtree_twice_is_expanded_at_both_paths() -> None:
    m = Manifest(
        entries=[ManifestEntry(path=p, size=1, digest=digest("same")) for p in ("a/x", "b/x")]
    )
    trees = build_trees(m)
    assert len(trees.blobs) == len(trees.order) == 2  # a and b are the same tree
    assert expand(trees) == m


def row(
    name: str, kind: str = "f", mode: int = 0o644, size: int = 1, ref: str = ""
) -> list[object]:
    return [name, kind, mode, size, ref or digest(name)]


@pytest.mark.parametrize(
    ("rows", "why"),
    [
        ([row("b"), row("a")], "out of order"),
        ([row("a"), row("a")], "out of order or repeated"),
        ([row("a/b")], "bad entry name"),
        ([row("..")], "bad entry name"),
        ([row("")], "bad entry name"),
        ([row("a", kind="x")], "bad kind"),
        ([row("a", ref="nothex")], "SHA-256"),
        ([row("a", mode=-1)], "bad mode"),
        ([row("a", kind="l", ref="/etc/passwd", mode=0, size=0)], "absolute"),
        ([row("a", kind="l", ref="../../out", mode=0, size=0)], "out of the snapshot"),
        ([row("a", kind="d", mode=0o755, size=0)], "only a file"),
        ([["a", "f", 1]], "not \\[name"),
    ],
)
def test_malformed_trees_are_refused(rows: list[list[object]], why: str) -> None:
    data = msgpack.packb(rows)
    blobs = {hashlib.sha256(data).hexdigest(): data}
    with pytest.raises(TreeError, match=why):
        expand_all(next(iter(blobs)), blobs)


def test_bytes_that_are_not_the_tree_asked_for_are_refused() -> None:
    trees = build_trees(manifest(*PATHS))
    expansion = Expansion(trees.root)
    with pytest.raises(TreeError, match="do not match"):
        expansion.feed(trees.root, encode_tree([]))
    with pytest.raises(TreeError, match="not asked for"):
        expansion.feed(digest("other"), b"")


def test_a_tree_bomb_stops_at_the_limit() -> None:
    """Each level names the one below twice: 2^depth paths from a few bytes each."""
    below = encode_tree([])
    blobs = {hashlib.sha256(below).hexdigest(): below}
    for _ in range(40):
        child = hashlib.sha256(below).hexdigest()
        below = encode_tree([("a", "d", 0, 0, child), ("b", "d", 0, 0, child)])
        blobs[hashlib.sha256(below).hexdigest()] = below
    with pytest.raises(TreeError, match="more than"):
        expand_all(hashlib.sha256(below).hexdigest(), blobs)


@given(st.binary(max_size=300))
def test_any_bytes_decode_to_a_tree_or_a_tree_error(data: bytes) -> None:
    try:
        rows = decode_tree(data)
    except TreeError:
        return
    assert all(len(r) == 5 for r in rows)


@given(
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=5),
            st.sampled_from(["f", "l", "d", "?"]),
            st.integers(-1, 0o1000),
            st.integers(-1, 10),
            st.one_of(st.text(max_size=8), st.just(digest("x"))),
        ),
        max_size=6,
    )
)
def test_structured_garbage_decodes_to_a_tree_or_a_tree_error(
    rows: list[tuple[str, str, int, int, str]],
) -> None:
    try:
        decode_tree(msgpack.packb([list(r) for r in rows]))
    except TreeError:
        pass


def test_the_relays_decoded_trees_stay_within_their_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_trees, "DECODED_ROWS", 10)
    kept = relay_trees._DecodedTrees()
    rows = [("a", "f", 0o644, 1, digest("a"))] * 4
    for name in ("x", "y", "z"):
        kept.put(digest(name), rows)
    assert kept.get(digest("x")) is None and kept.rows == 8  # the oldest went
    assert kept.get(digest("y")) == rows
    kept.put(digest("w"), rows)  # y was used last: z goes
    assert kept.get(digest("z")) is None and kept.get(digest("y")) == rows
    kept.put(digest("huge"), rows * 3)  # more than it may hold at all: not kept
    assert kept.get(digest("huge")) is None and kept.rows == 8
