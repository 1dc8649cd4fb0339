"""The attempt's checkpoint directory: restored before the program starts, stored on its request.

The program finds the directory in ``TETHER_CHECKPOINT_DIR`` (``tether.checkpoint_dir()``), and
the step restored there in ``TETHER_CHECKPOINT_STEP`` (``tether.latest_checkpoint()``; empty: none).
It is one of the attempt's own, beside its run directory (``<run>-<attempt>.checkpoints``: never in
the snapshot's directory, which is the program's working directory), the program's user's when the
worker gives programs uids of their own.

Restore (:meth:`Checkpointing.restore`): the run's latest complete checkpoint (its seed's,
``--from-checkpoint``, while it has none of its own) is downloaded by the file engine
(``relay/client/files.py``), every chunk checked against its digest. A corrupt one (a chunk that
does not match, or is gone) is skipped for the next older, and the run's logs say which and why;
none intact: the program starts from scratch, saying so. A full disk is not the checkpoint's
fault: the attempt fails to start with one line, and the stored checkpoint stays.

Save (:meth:`Checkpointing.save`, on ``tether.save_checkpoint(step)``, through the metrics socket):
the directory is uploaded (only the chunks the relay lacks), then the checkpoint recorded
(``put_checkpoint``; on a run over several nodes each node puts its own directory, the relay merges
the step once every node put it). Saves of the same step that overlap (every rank asking after a
barrier) are one save, each asker answered with its outcome; saves of different steps go one
after the other. After each stored checkpoint, :attr:`Checkpointing.after_save` hooks run (the
outputs' upload). Every control connection uses the worker's token.
"""

from __future__ import annotations

import errno
import logging
import shutil
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from protocol_specs.checkpoints.asking import answer_error, answer_stored, restore_order
from protocol_specs.checkpoints.checkpoints import Checkpoint, parse_source
from protocol_specs.runs.runs import RunRecord
from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode
from relay.client import (
    FilesError,
    HashCache,
    RelayError,
    RunLink,
    download,
    open_control,
    upload_dir,
)

from .quarters import Quarters, hand_over_tree

__all__ = ["CHECKPOINT_DIR_ENV", "CHECKPOINT_STEP_ENV", "Checkpointing", "Engine", "RestoreError",
           "attempt_checkpoints", "checkpoint_dir_of"]  # fmt: skip

log = logging.getLogger("tether.worker")

CHECKPOINT_DIR_ENV = "TETHER_CHECKPOINT_DIR"
CHECKPOINT_STEP_ENV = "TETHER_CHECKPOINT_STEP"
#: the relay's answers that mean a stored checkpoint cannot be read whole (skip it for an older)
CORRUPT = frozenset({ErrorCode.BAD_BLOB, ErrorCode.NO_SUCH_BLOB})


class RestoreError(Exception):
    """The attempt cannot start: its checkpoint cannot be restored here (one line)."""


@dataclass(frozen=True)
class Engine:
    """The file engine's calls (``relay/client/files.py``): the real one, or a fake in tests."""

    upload_dir: Callable[..., Awaitable[Any]]
    download: Callable[..., Awaitable[int]]
    cache: Any = None
    #: the engine's error (over the limit, a full disk, a corrupt chunk)
    error: type[Exception] = Exception

    @classmethod
    def real(cls, cache: Path | None = None) -> Engine:
        return cls(upload_dir, download, HashCache(cache), FilesError)


def attempt_checkpoints(
    link: RunLink,
    record: RunRecord,
    quarters: Quarters,
    *,
    node: int = 0,
    cache: Path | None = None,
) -> Checkpointing:
    """The checkpoints of the attempt ``link`` is of (its worker's token), ``quarters``' user's;
    ``cache``: where the engine keeps its file hashes."""

    def connect() -> AbstractAsyncContextManager[Any]:
        return open_control(link.endpoint, client="tether-worker")

    async def note(line: str) -> None:
        data = line.encode()
        await link.publish(wire.LogEntry(stream="stderr", data=data, attempt=record.attempt,
                                         node=node))  # fmt: skip

    directory = checkpoint_dir_of(quarters.run_dir)
    return Checkpointing(
        connect, record, directory, engine=Engine.real(cache), node=node, note=note,
        quarters=quarters,
    )  # fmt: skip


def checkpoint_dir_of(run_dir: Path) -> Path:
    """The checkpoint directory of the attempt whose run directory is ``run_dir``."""
    return run_dir.with_name(f"{run_dir.name}.checkpoints")


class Checkpointing:
    """One attempt's checkpoints: see the module's docstring."""

    def __init__(
        self,
        connect: Callable[[], AbstractAsyncContextManager[Any]],
        record: RunRecord,
        directory: Path,
        *,
        engine: Engine,
        node: int = 0,
        note: Callable[[str], Awaitable[None]] | None = None,
        quarters: Quarters | None = None,
    ) -> None:
        """``connect()``: a control connection as the worker (``open_control``); ``note(line)``:
        a line for the run's logs (a skipped checkpoint, a fresh start); ``quarters``: the
        attempt's, whose user the directory is handed to once restored."""
        self.connect = connect
        self.record = record
        self.directory = directory
        self.engine = engine
        self.node = node
        self.note = note
        self.quarters = quarters
        #: run after every stored checkpoint (part O: the outputs' upload); errors are logged
        self.after_save: list[Callable[[], Awaitable[None]]] = []
        self.step: int | None = None  #: the step restored (None: none)
        self.limit = 0  #: the relay's most bytes for one checkpoint (0: not known yet)
        self._lock = trio.Lock()
        self._saving: dict[int, _Save] = {}

    def __repr__(self) -> str:
        return f"<Checkpointing {self.record.id} {self.directory} step={self.step}>"

    def env(self) -> dict[str, str]:
        """What the program is told: the directory, the step restored in it."""
        step = "" if self.step is None else str(self.step)
        return {CHECKPOINT_DIR_ENV: str(self.directory), CHECKPOINT_STEP_ENV: step}

    # --- restore ----------------------------------------------------------------------------------

    async def restore(self) -> dict[str, str]:
        """Make the directory and restore the latest intact checkpoint into it (see the module's
        docstring); the program's variables. :class:`RestoreError` if it cannot start."""
        self.directory.mkdir(mode=0o700, exist_ok=True)
        run = self.record.id
        try:
            async with self.connect() as control:
                listing = await control.checkpoints(run)
                self.limit = listing.limit
                for one in restore_order(listing.checkpoints, self._seed_step(listing.source)):
                    if await self._restore_one(control, one, listing.source or run):
                        self.step = one.step
                        break
                else:
                    if listing.checkpoints:
                        await self._note("no stored checkpoint is intact: starting from scratch")
        except RelayError as exc:
            raise RestoreError(f"cannot read the run's checkpoints: {exc.message}") from None
        user = self.quarters.user if self.quarters is not None else None
        if user is not None:  # before the program starts: nothing of its races the walk
            await trio.to_thread.run_sync(hand_over_tree, self.directory, user)
        return self.env()

    def _seed_step(self, source: str) -> int | None:
        """The step ``--from-checkpoint RUN:STEP`` names, while the run restores its seed's."""
        if not source or source == self.record.id or not self.record.spec.from_checkpoint:
            return None
        return parse_source(self.record.spec.from_checkpoint)[1]

    async def _restore_one(self, control: Any, one: Checkpoint, source: str) -> bool:
        """Whether ``one`` was restored whole; a corrupt one is noted and cleared away."""
        of = f" of run {source}" if source != self.record.id else ""
        try:
            answer = await control.checkpoints(self.record.id, step=one.step, with_files=True)
            if answer.files is None:
                raise RelayError(ErrorCode.NO_SUCH_BLOB, "its file list is gone")
            # the worker's token reads its run's checkpoints (and its seed's) without naming one
            await self.engine.download(control, answer.files.files, self.directory)
            log.info("run %s: restored the checkpoint of step %s%s", self.record.id, one.step, of)
            return True
        except (RelayError, OSError, self.engine.error) as exc:
            await trio.to_thread.run_sync(_clear, self.directory)
            why = exc.message if isinstance(exc, RelayError) else str(exc)
            if _no_space(exc):
                raise RestoreError(
                    f"cannot restore checkpoint of step {one.step} ({_size(one.size)}){of}: {why}"
                ) from None
            if isinstance(exc, RelayError) and exc.code not in CORRUPT:
                raise
            await self._note(f"skipped the checkpoint of step {one.step}{of}: {why}")
            return False

    async def _note(self, line: str) -> None:
        log.warning("run %s: %s", self.record.id, line)
        if self.note is not None:
            with suppress(Exception):
                await self.note(f"tether: {line}\n")

    # --- save -------------------------------------------------------------------------------------

    async def save(self, step: int) -> bytes:
        """Store the directory as the checkpoint of ``step``; the answer line for the program.
        An overlapping save of the same step shares the first one's outcome."""
        saving = self._saving.get(step)
        if saving is not None:
            await saving.done.wait()
            return saving.answer
        saving = self._saving[step] = _Save()
        try:
            async with self._lock:
                saving.answer = await self._store(step)
        finally:
            del self._saving[step]
            saving.done.set()
        return saving.answer

    async def _store(self, step: int) -> bytes:
        run, attempt = self.record.id, self.record.attempt
        try:
            async with self.connect() as control:
                if not self.limit:
                    self.limit = (await control.checkpoints(run)).limit
                sent = await self.engine.upload_dir(
                    control, self.directory, cache=self.engine.cache, limit=self.limit,
                    attempt=attempt,
                )  # fmt: skip
                stored = await control.put_checkpoint(
                    run, attempt, step, sent.digest, node=self.node, sent=sent.sent
                )
        except RelayError as exc:
            return answer_error(f"cannot store the checkpoint of step {step}: {exc.message}")
        except (OSError, self.engine.error) as exc:
            return answer_error(f"cannot store the checkpoint of step {step}: {exc}")
        except Exception as exc:  # a fault of ours: the program hears of it, the attempt goes on
            log.exception("run %s: storing the checkpoint of step %s", run, step)
            return answer_error(f"cannot store the checkpoint of step {step}: {exc!r}")
        log.info("run %s: stored the checkpoint of step %s", run, step)
        return answer_stored(stored.checkpoint, stored.complete)

    async def saved(self) -> None:
        """After a stored checkpoint: the :attr:`after_save` hooks, each on its own."""
        for hook in list(self.after_save):
            try:
                await hook()
            except Exception as exc:  # one hook failing is not the checkpoint's failure
                log.warning("run %s: after a checkpoint: %s", self.record.id, exc)

    async def serve(self, step: int, answer: Callable[[bytes], None]) -> None:
        """A program's save request: store, ``answer`` it, then the hooks (once per save)."""
        first = step not in self._saving
        line = await self.save(step)
        answer(line)
        if first and line.startswith(b'{"stored"'):
            await self.saved()


class _Save:
    def __init__(self) -> None:
        self.done = trio.Event()
        self.answer = answer_error("the checkpoint was not stored: the attempt is ending")


def _no_space(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk is full (the engine's error says so in its words)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc).lower()
    return "no space" in text or "disk full" in text or "disk is full" in text


def _size(n: int) -> str:
    """``n`` bytes in words (``1.5 GiB``)."""
    size, unit = float(n), "bytes"
    for larger in ("KiB", "MiB", "GiB"):
        if size < 1024:
            break
        size, unit = size / 1024, larger
    return f"{n} bytes" if unit == "bytes" else f"{size:.1f} {unit}"


def _clear(directory: Path) -> None:
    """Everything in ``directory`` removed (a restore that failed midway), the directory kept."""
    for entry in _entries(directory):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with suppress(OSError):
                entry.unlink()


def _entries(directory: Path) -> Iterable[Path]:
    try:
        return list(directory.iterdir())
    except OSError:
        return []
