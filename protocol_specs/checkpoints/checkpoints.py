"""A run's checkpoints: which it keeps, which is the latest, where a new run seeds from.

A :class:`Checkpoint` is one ``tether.save_checkpoint(step)`` of the program: its step, the attempt
that saved it, and the digest of the :class:`~protocol_specs.checkpoints.files.FileSet` of its
directory. The relay keeps the last ``RunSpec.keep_checkpoints`` of a run (:func:`retained`); the
next attempt, on any worker, starts with the latest one restored. Nothing here performs I/O.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..snapshots.snapshots import check_digest

__all__ = ["Checkpoint", "latest", "parse_source", "retained"]


class Checkpoint(BaseModel):
    """One saved checkpoint of a run."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    step: int = Field(ge=0)
    attempt: int = Field(ge=1)
    #: when the relay recorded it (wall-clock seconds)
    at: float = 0.0
    #: the digest of its file set's blob
    files: str
    count: int = 0  #: files
    size: int = 0  #: bytes of its files
    #: bytes uploaded for it (what earlier checkpoints had not stored already)
    sent: int = 0

    @field_validator("files")
    @classmethod
    def _files(cls, value: str) -> str:
        return check_digest(value)


def latest(checkpoints: list[Checkpoint]) -> Checkpoint | None:
    """The checkpoint a new attempt resumes from: the highest step, the newest of equal steps."""
    return max(checkpoints, key=lambda c: (c.step, c.at), default=None)


def retained(checkpoints: list[Checkpoint], keep: int) -> tuple[list[Checkpoint], list[Checkpoint]]:
    """``(kept, dropped)``: the ``keep`` newest by step (then time), oldest first, and the rest.
    A second save of a step replaces the first."""
    by_step: dict[int, Checkpoint] = {}
    for one in sorted(checkpoints, key=lambda c: (c.step, c.at)):
        if one.step in by_step:
            by_step.pop(one.step)
        by_step[one.step] = one
    ordered = sorted(by_step.values(), key=lambda c: (c.step, c.at))
    kept = ordered[-keep:] if keep > 0 else []
    dropped = [c for c in checkpoints if c not in kept]
    return kept, dropped


def parse_source(text: str) -> tuple[str, int | None]:
    """``RUN`` or ``RUN:STEP`` (``tether run --from-checkpoint``) as ``(run, step or None)``;
    ``ValueError`` with the form for anything else."""
    text = text.strip()
    run, colon, step = text.rpartition(":")
    if not colon:
        run, step = text, ""
    elif not step.isdigit() or len(step) > 18:
        raise ValueError(f"{text[:100]!r} is not RUN or RUN:STEP (a run, then a step number)")
    if not run or len(run) > 200 or any(ord(c) < 32 for c in run):
        raise ValueError(f"{text[:100]!r} is not RUN or RUN:STEP (a run, then a step number)")
    return run, int(step) if step else None
