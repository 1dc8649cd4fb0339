"""A run's outputs (``RunSpec.outputs``): which files of its directory the worker sends home.

The user names them with globs relative to the run's directory, as ``.gitignore`` and rsync's
filters read them, minus the negations:

- ``*`` and ``?`` and ``[abc]`` match within one name (``*.csv``: ``preds.csv`` at the top only);
- ``**`` as a whole name matches any number of directories (``**/*.png``: a png anywhere);
- a pattern that names a directory means everything under it: ``out/`` and ``out`` both send
  ``out/a.bin`` and ``out/sub/b.bin``.

:func:`check_patterns` refuses, in one line, what cannot name a file of the run's directory: an
absolute path, a ``..`` name, a backslash, an empty pattern. :func:`matcher` answers for a
relative POSIX path whether a set of patterns selects it. Nothing here performs I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from fnmatch import fnmatchcase
from functools import lru_cache

__all__ = ["MAX_OUTPUTS", "MAX_PATTERN_CHARS", "check_patterns", "matcher"]

#: the most patterns a run's ``--outputs`` names
MAX_OUTPUTS = 64
#: the longest one pattern may be
MAX_PATTERN_CHARS = 500


def check_patterns(patterns: list[str]) -> list[str]:
    """``patterns`` if each can name files of the run's directory, else ``ValueError`` saying
    which and why (one line)."""
    if len(patterns) > MAX_OUTPUTS:
        raise ValueError(f"at most {MAX_OUTPUTS} output patterns, not {len(patterns)}")
    for pattern in patterns:
        _check(pattern)
    return patterns


def _check(pattern: str) -> None:
    shown = repr(pattern[:100])
    if not pattern.strip():
        raise ValueError("an output pattern is empty")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"output pattern {shown}... is longer than {MAX_PATTERN_CHARS} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in pattern):
        raise ValueError(f"output pattern {shown} holds a control character")
    if "\\" in pattern:
        raise ValueError(f"output pattern {shown}: write paths with / (no backslash)")
    if pattern.startswith("/") or (len(pattern) > 1 and pattern[1] == ":"):
        raise ValueError(
            f"output pattern {shown} is absolute: name files relative to the run's directory"
        )
    for name in _names(pattern):
        if name == "..":
            raise ValueError(f"output pattern {shown} leaves the run's directory (..)")
        if "**" in name and name != "**":
            raise ValueError(f"output pattern {shown}: ** stands alone between slashes (a/**/b)")


def _names(pattern: str) -> tuple[str, ...]:
    """The pattern's names, without empty ones and ``.`` (``./out//a`` is ``out/a``)."""
    return tuple(name for name in pattern.split("/") if name not in ("", "."))


def matcher(patterns: list[str]) -> Callable[[str], bool]:
    """Whether a path (relative, POSIX) is one of ``patterns``' outputs: a pattern matches the
    path, or one of the directories it lies under. ``patterns`` are checked first
    (:func:`check_patterns`); none: nothing matches."""
    compiled = [_names(p) for p in check_patterns(list(patterns))]

    def select(path: str) -> bool:
        parts = tuple(part for part in path.split("/") if part not in ("", "."))
        return bool(parts) and any(_match(names, parts) for names in compiled)

    return select


@lru_cache(maxsize=4096)
def _match(names: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    """Whether ``names`` matches ``parts`` or a leading run of them (a directory: everything
    under it). Cached on the tails, so ``**`` costs len(names) x len(parts) at worst."""
    if not names:
        return True  # matched the path, or a directory above it
    if names[0] == "**":
        if len(names) == 1:
            return bool(parts)
        return _match(names[1:], parts) or (bool(parts) and _match(names, parts[1:]))
    if not parts:
        return False
    return fnmatchcase(parts[0], names[0]) and _match(names[1:], parts[1:])
