"""A run's book of checkpoints, as the relay keeps it: the complete ones it retains, and the parts
of steps not every node has put yet.

Theory of operation
-------------------
A worker records a checkpoint of its attempt with ``put_checkpoint`` (a step and the digest of the
:class:`~protocol_specs.checkpoints.files.FileSet` it uploaded). On one node that checkpoint is
complete at once. A run that spans N nodes (``RunSpec.resources.nodes``) saves each step on every
node: each node's part is noted under ``(attempt, step)`` (:meth:`CheckpointBook.with_part`), and
once all N are there the relay merges their sets in node order (``files.merge``), stores the
merged set as a blob and records it complete (:meth:`CheckpointBook.with_complete`). Retention
(``RunSpec.keep_checkpoints``) keeps the newest complete ones (:func:`retained`); parts of an
earlier attempt are dropped when a later attempt completes a step (their attempt is over and can
put nothing more). The book is one JSON value written compare-and-set; every method here is pure.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from .checkpoints import Checkpoint, latest, retained

__all__ = ["CheckpointBook", "Part", "size_text"]


def size_text(n: float) -> str:
    """``n`` bytes in words: ``512 bytes``, ``1.2 GiB``."""
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


class Part(BaseModel):
    """One node's file set of a step not yet complete."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    files: str
    sent: int = 0


def part_key(attempt: int, step: int) -> str:
    return f"{attempt}:{step}"


class CheckpointBook(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    #: the complete checkpoints kept, oldest first
    kept: list[Checkpoint] = Field(default_factory=list)
    #: ``"attempt:step"`` -> node -> its part, for steps some node has not put yet
    parts: dict[str, dict[int, Part]] = Field(default_factory=dict)

    def with_part(self, attempt: int, step: int, node: int, part: Part) -> CheckpointBook:
        """The book with ``node``'s part of ``step`` noted (a second put replaces the first)."""
        key = part_key(attempt, step)
        parts = dict(self.parts)
        parts[key] = {**parts.get(key, {}), node: part}
        return self.model_copy(update={"parts": parts})

    def parts_of(self, attempt: int, step: int) -> dict[int, Part]:
        return dict(self.parts.get(part_key(attempt, step), {}))

    def with_complete(
        self, checkpoint: Checkpoint, keep: int
    ) -> tuple[CheckpointBook, list[Checkpoint]]:
        """The book with ``checkpoint`` complete, the newest ``keep`` retained, and its parts (and
        any of an earlier attempt) gone; and the checkpoints retention dropped."""
        kept, dropped = retained([*self.kept, checkpoint], keep)
        parts = {
            key: nodes
            for key, nodes in self.parts.items()
            if key != part_key(checkpoint.attempt, checkpoint.step)
            and int(key.split(":")[0]) >= checkpoint.attempt
        }
        return CheckpointBook(kept=kept, parts=parts), dropped

    @property
    def latest(self) -> Checkpoint | None:
        return latest(self.kept)

    @property
    def size(self) -> int:
        """The bytes of the kept checkpoints' files together (each counted whole)."""
        return sum(c.size for c in self.kept)

    def at_step(self, step: int | None) -> Checkpoint | None:
        """The kept checkpoint of ``step`` (None: the latest)."""
        if step is None:
            return self.latest
        return next((c for c in reversed(self.kept) if c.step == step), None)

    @property
    def set_digests(self) -> set[str]:
        """The file set blobs it names: the kept checkpoints' and the parts'."""
        named = {c.files for c in self.kept}
        named.update(p.files for nodes in self.parts.values() for p in nodes.values())
        return named
