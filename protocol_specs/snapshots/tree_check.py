"""Checking a submitted root tree without expanding it: a second submit costs what changed.

Theory of operation
-------------------
A submit names a root tree (``trees.py``). Before it records the run the relay must know that
every tree and file below the root is present and the submitter's, and that the whole keeps a
snapshot's limits (files, bytes, path length, depth, symlinks inside). Expanding the root into a
manifest does that in time proportional to the tree: for 20,000 files and one changed, most of a
second submit. :class:`TreeCheck` instead takes a :class:`Summary` of each subtree this user had
checked lately (the relay keeps them, ``relay/snapshots/trees.py``): a subtree with a summary is not
read and its files are not asked about; only the trees that changed are. Each tree it does read gets
a summary of its own (:meth:`TreeCheck.summaries`), for the next submit.

A subtree holding a symlink is never taken from a summary: a link's target is checked against the
whole snapshot's links (``snapshots._resolve_inside``), so every link's path must be known, and
such a subtree is read every time. The run is recorded by its root tree; the manifest is expanded
(:class:`~protocol_specs.snapshots.trees.Expansion`, checked in full once more) when a worker claims it.

A summary is the truth about a tree's bytes, whoever submits it, but "present and yours" is only
as true as it was when checked: the relay forgets summaries before its blob collection could have
deleted what they vouch for. Nothing here performs I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .snapshots import (
    MAX_FILES,
    MAX_PATH_CHARS,
    MAX_TOTAL_BYTES,
    Manifest,
    ManifestEntry,
    check_digest,
)
from .trees import MAX_DEPTH, Paths, Row, TreeError

__all__ = ["Summary", "TreeCheck"]


@dataclass(frozen=True)
class Summary:
    """What a snapshot's limits need to know of a subtree, its paths relative to its own root."""

    files: int = 0  #: files and symlinks
    bytes: int = 0
    paths: int = 0  #: files, symlinks and directories
    longest: int = 0  #: characters of the longest path
    depth: int = 0  #: directories nested (a tree of files only: 0)
    links: bool = False  #: a symlink anywhere below


def _summarise(rows: list[Row], below: Callable[[str], Summary]) -> Summary:
    files = size = paths = longest = depth = 0
    links = False
    for name, kind, _mode, row_size, ref in rows:
        paths += 1
        longest = max(longest, len(name))
        if kind == "d":
            sub = below(ref)
            files, size, paths = files + sub.files, size + sub.bytes, paths + sub.paths
            if sub.longest:
                longest = max(longest, len(name) + 1 + sub.longest)
            depth = max(depth, 1 + sub.depth)
            links = links or sub.links
        else:
            files += 1
            size += row_size
            links = links or kind == "l"
    return Summary(files, size, paths, longest, depth, links)


@dataclass
class TreeCheck:
    """One submit's root tree, checked reading only the trees ``known`` has no summary of.

    Loop: ask the store whether :attr:`needs` are present (and the submitter's), read each and
    :meth:`feed_rows` its decoded rows; once ``needs`` is empty, ask about :attr:`files` and take
    :meth:`result`. :class:`TreeError` at any step that breaks the format or the limits.
    """

    root: str
    known: Callable[[str], Summary | None]
    needs: list[str] = field(default_factory=list)
    #: the distinct file digests the trees read name (to ask about once the trees are read)
    files: list[str] = field(default_factory=list)
    _rows: dict[str, list[Row]] = field(default_factory=dict)  #: every tree read
    _taken: dict[str, Summary] = field(default_factory=dict)  #: subtrees ``known`` vouched for
    _where: dict[str, list[str]] = field(default_factory=dict)  #: tree to read -> its paths
    _links: dict[str, str] = field(default_factory=dict)  #: every symlink's path -> its target
    _seen_files: set[str] = field(default_factory=set)
    _paths: Paths = field(default_factory=Paths)  #: paths met, read or vouched for
    #: once :meth:`result` passed: the summary of every tree read
    checked: dict[str, Summary] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_digest(self.root)
        self.needs = [self.root]
        self._where = {self.root: [""]}

    def feed_rows(self, digest: str, rows: list[Row]) -> None:
        """Take ``digest``'s rows (decoded and checked by ``trees.decode_tree``, its bytes
        matching the digest), one of :attr:`needs`."""
        if digest not in self._where or digest not in self.needs:
            raise TreeError(f"tree {digest[:12]} was not asked for")
        self.needs.remove(digest)
        self._rows[digest] = rows
        if len(self._rows) > MAX_FILES:
            raise TreeError(f"more than {MAX_FILES} directories")
        for path, (_name, kind, _mode, _size, ref) in self._paths.place(
            rows, self._where.pop(digest)
        ):
            if kind == "d":
                self._subtree(ref, path)
            elif kind == "f":
                if ref not in self._seen_files:
                    self._seen_files.add(ref)
                    self.files.append(ref)
            else:
                self._links[path] = ref

    def _subtree(self, ref: str, path: str) -> None:
        if ref in self._where:  # met already, still to read
            self._where[ref].append(path)
            return
        if ref in self._rows or ref in self._taken:
            # read or vouched for already: its paths met again (a shared subtree)
            summary = self._taken.get(ref)
            if summary is None:
                self._where[ref] = [path]
                self._rows.pop(ref)  # read it again at this path (links, limits)
                self.needs.append(ref)
            else:
                self._fits(summary, path)
            return
        summary = self.known(ref)
        if summary is not None and not summary.links:
            self._fits(summary, path)
            self._taken[ref] = summary
            return
        self._where[ref] = [path]
        self.needs.append(ref)

    def _fits(self, summary: Summary, path: str) -> None:
        if summary.longest and len(path) + 1 + summary.longest > MAX_PATH_CHARS:
            raise TreeError(
                f"a path under {path[:200]!r} is longer than {MAX_PATH_CHARS} characters"
            )
        if path.count("/") + 1 + summary.depth > MAX_DEPTH:
            raise TreeError(f"directories nest deeper than {MAX_DEPTH} levels")
        self._paths.take(summary.paths)  # the directory itself was counted where it was named

    def summaries(self) -> dict[str, Summary]:
        """A summary of every tree read (each after the trees below it), once :attr:`needs` is
        empty: what the relay keeps once the files are known to be present."""
        if self.needs:
            raise TreeError(f"{len(self.needs)} trees not read yet")
        done: dict[str, Summary] = dict(self._taken)
        for top in self._rows:
            stack = [top]
            while stack:  # depth first, without recursion (trees nest MAX_DEPTH deep)
                digest = stack[-1]
                if digest in done:
                    stack.pop()
                    continue
                pending = [r[4] for r in self._rows[digest] if r[1] == "d" and r[4] not in done]
                if pending:
                    stack.extend(pending)
                    continue
                done[digest] = _summarise(self._rows[digest], done.__getitem__)
                stack.pop()
        return {d: s for d, s in done.items() if d in self._rows}

    def result(self) -> Summary:
        """The whole snapshot's summary, its limits checked: :class:`TreeError` if broken. Then
        :attr:`checked` holds the summary of every tree read."""
        self.checked = self.summaries()
        whole = self.checked[self.root]
        if whole.files > MAX_FILES:
            raise TreeError(f"more than {MAX_FILES} files")
        if whole.bytes > MAX_TOTAL_BYTES:
            raise TreeError(f"the snapshot holds {whole.bytes} bytes, over the limit")
        if self._links:
            try:
                links = [
                    ManifestEntry(path=p, kind="symlink", target=t) for p, t in self._links.items()
                ]
                Manifest(entries=sorted(links, key=lambda e: e.path))  # each link resolved inside
            except ValueError as exc:
                raise TreeError(str(exc)) from None
        return whole
