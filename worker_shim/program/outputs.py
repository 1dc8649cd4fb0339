"""A run's outputs (``RunSpec.outputs``) sent home: after each attempt and each checkpoint.

The worker calls :func:`send_outputs` when the program has exited (whatever its code; also when it
was terminated or preempted: it exits then too), before it publishes the exit status, and after
every stored checkpoint (``worker_shim/program/checkpoints.py``'s ``Checkpointing.after_save``
calls :func:`outputs_hook`'s function). It uploads the run directory's files that the run's globs
select (``protocol_specs/checkpoints/outputs.py``) with the engine (``relay/client/files.py``):
only chunks the relay lacks travel, and a file unchanged since the last look is not read again
(the attempt's :class:`HashCache`, kept beside the run directory). Then ``put_outputs`` merges
the set into the run's outputs, which ``tether cp`` and ``tether outputs`` read from the relay,
also after this worker is gone.

Sending outputs never changes how the run ends: a failure (the relay unreachable, a disk error,
the relay's limit) is one line in the run's logs and in the worker's, and the attempt goes on to
publish its exit status. A cancel (the worker stopping) leaves the upload where it was: chunks
already stored stay, the set is not recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from protocol_specs.checkpoints.outputs import matcher
from protocol_specs.runs.runs import RunRecord
from protocol_specs.wire import wire
from relay.client import RelayError, RunLink, open_control

__all__ = ["OUTPUTS_TIMEOUT", "hashes_path", "outputs_hook", "send_outputs"]

log = logging.getLogger(__name__)

#: the longest one upload of outputs may take before the attempt goes on without it
OUTPUTS_TIMEOUT = 900.0


def hashes_path(run_dir: Path) -> Path:
    """Where the attempt's hash cache of its outputs lives: beside its directory, not in it (the
    program cannot write it, and it is not an output)."""
    return run_dir.with_name(f"{run_dir.name}.outputs-hashes")


async def send_outputs(
    link: RunLink,
    record: RunRecord,
    run_dir: Path,
    *,
    node: int = 0,
    why: str = "exit",
    timeout: float = OUTPUTS_TIMEOUT,
) -> int | None:
    """Upload the outputs of ``run_dir`` and record them; the bytes sent, or None if the run
    names no outputs or it failed (said in the run's logs, one line)."""
    if not record.spec.outputs:
        return None
    from relay.client import FilesError, HashCache, upload_dir

    problem = ""
    with trio.move_on_after(timeout) as scope:
        try:
            async with open_control(link.endpoint, client="tether-worker") as control:
                sent = await upload_dir(
                    control, run_dir, select=matcher(record.spec.outputs),
                    cache=HashCache(hashes_path(run_dir)), attempt=record.attempt,
                )  # fmt: skip
                stored = await control.put_outputs(
                    record.id, record.attempt, sent.digest, node=node
                )
        except (FilesError, RelayError, OSError) as exc:
            problem = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    if scope.cancelled_caught:
        problem = f"not done within {timeout:.0f} s"
    if problem:
        text = f"-- tether: outputs not sent ({why}): {problem}"
        log.warning("run %s: %s", record.id, text)
        await link.publish(
            wire.LogEntry(stream="stderr", data=(text[:2000] + "\n").encode(),
                          attempt=record.attempt, node=node)
        )  # fmt: skip
        return None
    log.info(
        "run %s attempt %d: outputs (%s): %d files, %d bytes, %d sent",
        record.id, record.attempt, why, stored.count, stored.size, sent.sent,
    )  # fmt: skip
    return int(sent.sent)


def outputs_hook(
    link: RunLink, record: RunRecord, run_dir: Path, *, node: int = 0
) -> Callable[[], Awaitable[None]]:
    """What ``Checkpointing.after_save`` runs after each stored checkpoint: the outputs sent."""

    async def after_checkpoint() -> None:
        await send_outputs(link, record, run_dir, node=node, why="checkpoint")

    return after_checkpoint
