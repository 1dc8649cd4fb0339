"""What a program and its worker say about a checkpoint, and which stored one a new attempt tries.

``tether.save_checkpoint(step)`` sends ``{"checkpoint": step}`` as one JSON line on a connection of
its own to the worker's metrics socket (``worker_shim/program/metrics.py``), and waits for one line
back: ``{"stored": {...}}`` (the :class:`~protocol_specs.checkpoints.checkpoints.Checkpoint`, and
whether every node put the step) or ``{"error": "one line"}``. A restore tries the latest checkpoint
first, then each older one (:func:`restore_order`): a corrupt one is skipped, saying so. Nothing
here performs I/O.
"""

from __future__ import annotations

import json
from typing import Any

from .checkpoints import Checkpoint

__all__ = ["answer_error", "answer_stored", "decode_save", "restore_order", "stored_summary"]

#: a save request is at most this long (a step is an int)
MAX_REQUEST = 200


def decode_save(line: bytes) -> int | None:
    """The step of a program's save request ``{"checkpoint": step}``; ``None`` if malformed."""
    if len(line) > MAX_REQUEST:
        return None
    try:
        raw = json.loads(line)
    except ValueError:
        return None
    step = raw.get("checkpoint") if isinstance(raw, dict) else None
    if type(step) is not int or not 0 <= step < 2**62:
        return None
    return step


def answer_stored(checkpoint: Checkpoint, complete: bool = True) -> bytes:
    """The answer line to a save that stored ``checkpoint`` (``complete``: every node put it)."""
    stored = {**checkpoint.model_dump(), "complete": complete}
    return json.dumps({"stored": stored}).encode() + b"\n"


def answer_error(detail: str) -> bytes:
    """The answer line to a save that failed: one line, what ``tether.CheckpointError`` says."""
    line = " ".join(detail.split())[:1000] or "the checkpoint could not be stored"
    return json.dumps({"error": line}).encode() + b"\n"


def restore_order(checkpoints: list[Checkpoint], step: int | None = None) -> list[Checkpoint]:
    """The checkpoints a restore tries, in order: ``step``'s (None: the latest) first, then every
    older one, newest first (a corrupt one is skipped for the next)."""
    ordered = sorted(checkpoints, key=lambda c: (c.step, c.at), reverse=True)
    if step is not None:
        ordered = [c for c in ordered if c.step <= step]
    seen: set[int] = set()
    tried: list[Checkpoint] = []
    for one in ordered:
        if one.step not in seen:
            seen.add(one.step)
            tried.append(one)
    return tried


def stored_summary(answer: dict[str, Any]) -> str:
    """A saved checkpoint in words, for the worker's log."""
    return (
        f"checkpoint of step {answer.get('step')}: {answer.get('count')} files, "
        f"{answer.get('size')} bytes, {answer.get('sent')} sent"
    )
