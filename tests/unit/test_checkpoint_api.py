"""The program's checkpoint API (``tether.py``) and the worker's side of it
(``worker_shim/program/checkpoints.py``) with a fake file engine and a fake control client: what a
restore picks, skips and refuses, what a save sends and answers, and ``tether.save_checkpoint``
over the real metrics socket."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio
from test_program_output import FakeLink

import tether
from protocol_specs.checkpoints.asking import decode_save, restore_order
from protocol_specs.checkpoints.checkpoints import Checkpoint
from protocol_specs.runs.runs import Attempt, RunRecord
from protocol_specs.runs.spec import RunSpec
from relay.client import RunLink
from worker_shim.program.checkpoints import Checkpointing, Engine, RestoreError
from worker_shim.program.metrics import SOCKET_NAME, open_program_metrics


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def checkpoint(step: int, size: int = 10) -> Checkpoint:
    return Checkpoint(step=step, attempt=1, at=float(step), files=digest(f"set{step}"), size=size)


class FilesError(Exception):
    pass


class FakeControl:
    """The relay's answers about one run's checkpoints, and what it was asked to record."""

    def __init__(self, kept: list[Checkpoint], *, source: str = "", limit: int = 1000) -> None:
        self.kept = kept
        self.source = source
        self.limit = limit
        self.put: list[tuple[Any, ...]] = []

    async def checkpoints(
        self, run: str, *, step: int | None = None, with_files: bool = False
    ) -> Any:
        files = None
        if with_files:
            files = SimpleNamespace(files=[f"state-{step}"])
        return SimpleNamespace(
            checkpoints=self.kept, source=self.source or run, limit=self.limit, files=files
        )

    async def put_checkpoint(
        self, run: str, attempt: int, step: int, files: str, *, node: int = 0, sent: int = 0
    ) -> Any:
        self.put.append((run, attempt, step, files, node, sent))
        stored = Checkpoint(step=step, attempt=attempt, files=files, count=1, size=5, sent=sent)
        return SimpleNamespace(checkpoint=stored, complete=True)


class FakeEngine:
    """Downloads write ``state`` with the step; ``broken``: steps whose chunks are corrupt."""

    def __init__(self, *, broken: set[int] | None = None, no_space: bool = False) -> None:
        self.broken = broken or set()
        self.no_space = no_space
        self.uploads: list[Path] = []
        self.gate: trio.Event | None = None
        self.over: str = ""

    async def upload_dir(self, control: Any, root: Path, **options: Any) -> Any:
        self.uploads.append(root)
        if self.gate is not None:
            await self.gate.wait()
        if self.over:
            raise FilesError(self.over)
        assert options["limit"] == control.limit and options["attempt"] == 2
        return SimpleNamespace(digest=digest("new set"), sent=123)

    async def download(self, control: Any, files: Any, dest: Path, *, run: str = "") -> int:
        step = int(files[0].split("-")[1])
        (dest / "partial").write_text("half")
        if self.no_space:
            raise FilesError("no space left on device: needs 10 bytes, 3 free")
        if step in self.broken:
            raise FilesError(f"chunk {digest('x')[:12]} of state does not match its digest")
        (dest / "state").write_text(str(step))
        return 4

    def engine(self) -> Engine:
        return Engine(self.upload_dir, self.download, None, FilesError)


def attempt_of(spec: dict[str, Any] | None = None) -> RunRecord:
    spec_ = RunSpec(command=["python", "t.py"], workdir="/w", **(spec or {}))
    return RunRecord(id="r1", spec=spec_, attempt=2, attempts=[Attempt(n=1), Attempt(n=2)])


def checkpointing(
    tmp_path: Path, control: FakeControl, engine: FakeEngine, record: RunRecord | None = None
) -> tuple[Checkpointing, list[str]]:
    notes: list[str] = []

    @asynccontextmanager
    async def connect() -> AsyncIterator[FakeControl]:
        yield control

    async def note(line: str) -> None:
        notes.append(line)

    made = Checkpointing(
        connect, record or attempt_of(), tmp_path / "ck", engine=engine.engine(), note=note
    )
    return made, notes


# --- the program's side outside tether ------------------------------------------------------------


def test_outside_tether_the_api_does_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("TETHER_METRICS_SOCKET", "TETHER_CHECKPOINT_DIR", "TETHER_CHECKPOINT_STEP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tether, "_saved", {})
    assert tether.checkpoint_dir() == Path("checkpoints")
    assert (tmp_path / "checkpoints").is_dir()
    assert tether.save_checkpoint(3) == {}
    assert tether.latest_checkpoint() is None
    monkeypatch.setenv("TETHER_CHECKPOINT_DIR", str(tmp_path / "mine"))
    assert tether.checkpoint_dir() == tmp_path / "mine"
    assert (tmp_path / "mine").is_dir()
    assert tether.save_checkpoint(3) == {}  # no worker to ask
    with pytest.raises(ValueError, match="step must be an int"):
        tether.save_checkpoint(-1)


# --- the sans-I/O parts ------------------------------------------------------------------------------


def test_save_requests_and_the_order_a_restore_tries() -> None:
    assert decode_save(b'{"checkpoint": 7}') == 7
    for bad in (b'{"checkpoint": -1}', b'{"checkpoint": "7"}', b'{"checkpoint": true}', b"[7]",
                b"{" * 300):  # fmt: skip
        assert decode_save(bad) is None
    kept = [checkpoint(10), checkpoint(30), checkpoint(20)]
    assert [c.step for c in restore_order(kept)] == [30, 20, 10]
    assert [c.step for c in restore_order(kept, 20)] == [20, 10]


# --- restore -----------------------------------------------------------------------------------------


async def test_a_restore_brings_the_latest_checkpoint(tmp_path: Path) -> None:
    made, notes = checkpointing(tmp_path, FakeControl([checkpoint(1), checkpoint(2)]), FakeEngine())
    env = await made.restore()
    assert env == {"TETHER_CHECKPOINT_DIR": str(tmp_path / "ck"), "TETHER_CHECKPOINT_STEP": "2"}
    assert (tmp_path / "ck" / "state").read_text() == "2"
    assert notes == []


async def test_a_run_without_checkpoints_starts_with_an_empty_directory(tmp_path: Path) -> None:
    made, notes = checkpointing(tmp_path, FakeControl([]), FakeEngine())
    assert (await made.restore())["TETHER_CHECKPOINT_STEP"] == ""
    assert list((tmp_path / "ck").iterdir()) == [] and notes == []


async def test_a_corrupt_checkpoint_is_skipped_for_the_next_older(tmp_path: Path) -> None:
    kept = [checkpoint(1), checkpoint(2), checkpoint(3)]
    made, notes = checkpointing(tmp_path, FakeControl(kept), FakeEngine(broken={3}))
    assert (await made.restore())["TETHER_CHECKPOINT_STEP"] == "2"
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["partial", "state"]
    assert (tmp_path / "ck" / "state").read_text() == "2"
    assert len(notes) == 1
    assert notes[0].startswith("tether: skipped the checkpoint of step 3: chunk ")
    assert "does not match its digest" in notes[0]


async def test_none_intact_starts_from_scratch_saying_so(tmp_path: Path) -> None:
    made, notes = checkpointing(tmp_path, FakeControl([checkpoint(1)]), FakeEngine(broken={1}))
    assert (await made.restore())["TETHER_CHECKPOINT_STEP"] == ""
    assert list((tmp_path / "ck").iterdir()) == []  # what the broken one left is gone
    assert notes[-1] == "tether: no stored checkpoint is intact: starting from scratch\n"


async def test_a_full_disk_fails_the_start_and_leaves_the_checkpoint_stored(
    tmp_path: Path,
) -> None:
    control = FakeControl([checkpoint(4, size=3 * 1024**3)])
    made, notes = checkpointing(tmp_path, control, FakeEngine(no_space=True))
    with pytest.raises(RestoreError) as caught:
        await made.restore()
    assert str(caught.value) == (
        "cannot restore checkpoint of step 4 (3.0 GiB): no space left on device: "
        "needs 10 bytes, 3 free"
    )
    assert control.kept == [checkpoint(4, size=3 * 1024**3)] and notes == []
    assert list((tmp_path / "ck").iterdir()) == []


async def test_a_seeded_run_restores_the_step_it_names(tmp_path: Path) -> None:
    record = attempt_of({"from_checkpoint": "r0:20"})
    control = FakeControl([checkpoint(10), checkpoint(20), checkpoint(30)], source="r0")
    made, _notes = checkpointing(tmp_path, control, FakeEngine(), record)
    assert (await made.restore())["TETHER_CHECKPOINT_STEP"] == "20"


# --- save --------------------------------------------------------------------------------------------


async def test_a_save_uploads_records_answers_then_runs_the_hooks(tmp_path: Path) -> None:
    control, engine = FakeControl([]), FakeEngine()
    made, _notes = checkpointing(tmp_path, control, engine)
    await made.restore()
    said: list[bytes] = []
    made.after_save.append(lambda: _record(said, b"hook"))
    await made.serve(5, said.append)
    assert control.put == [("r1", 2, 5, digest("new set"), 0, 123)]
    assert json.loads(said[0])["stored"]["step"] == 5
    assert said[1] == b"hook"  # after the program's answer


async def _record(said: list[bytes], what: bytes) -> None:
    said.append(what)


async def test_saves_of_one_step_that_overlap_are_one_save(tmp_path: Path) -> None:
    control, engine = FakeControl([]), FakeEngine()
    engine.gate = trio.Event()
    made, _notes = checkpointing(tmp_path, control, engine)
    said: list[bytes] = []
    hooks: list[bytes] = []
    made.after_save.append(lambda: _record(hooks, b"hook"))
    async with trio.open_nursery() as nursery:
        for _rank in range(4):
            nursery.start_soon(made.serve, 8, said.append)
        await trio.testing.wait_all_tasks_blocked()
        engine.gate.set()
    assert len(engine.uploads) == 1 and len(control.put) == 1
    assert len(said) == 4 and len(set(said)) == 1
    assert hooks == [b"hook"]


async def test_a_checkpoint_over_the_limit_is_refused_with_its_sizes(tmp_path: Path) -> None:
    control, engine = FakeControl([checkpoint(1)]), FakeEngine()
    engine.over = "the checkpoint holds 30 bytes, more than the 20 bytes this relay allows"
    made, _notes = checkpointing(tmp_path, control, engine)
    hooks: list[bytes] = []
    made.after_save.append(lambda: _record(hooks, b"hook"))
    said: list[bytes] = []
    await made.serve(2, said.append)
    assert json.loads(said[0]) == {
        "error": "cannot store the checkpoint of step 2: the checkpoint holds 30 bytes, more "
        "than the 20 bytes this relay allows"
    }
    assert control.put == [] and control.kept == [checkpoint(1)] and hooks == []


# --- tether.save_checkpoint over the metrics socket ------------------------------------------------


async def test_save_checkpoint_asks_the_worker_and_returns_or_raises_its_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control, engine = FakeControl([]), FakeEngine()
    made, _notes = checkpointing(tmp_path, control, engine)
    monkeypatch.setenv("TETHER_METRICS_SOCKET", str(tmp_path / SOCKET_NAME))
    monkeypatch.setenv("TETHER_CHECKPOINT_DIR", str(tmp_path / "ck"))
    monkeypatch.setenv("TETHER_CHECKPOINT_STEP", "")
    monkeypatch.setattr(tether, "_saved", {})
    async with open_program_metrics(
        cast(RunLink, FakeLink()), tmp_path, patterns=[], attempt=2, save=made.serve
    ):
        with trio.fail_after(10):
            stored = await trio.to_thread.run_sync(tether.save_checkpoint, 9)
            assert stored["step"] == 9 and stored["sent"] == 123 and stored["complete"]
            assert tether.latest_checkpoint() == 9
            engine.over = "the checkpoint holds 30 bytes, more than the 20 bytes allowed"
            with pytest.raises(tether.CheckpointError) as caught:
                await trio.to_thread.run_sync(tether.save_checkpoint, 10)
    assert str(caught.value) == (
        "cannot store the checkpoint of step 10: the checkpoint holds 30 bytes, more than the "
        "20 bytes allowed"
    )
    assert tether.latest_checkpoint() == 9


# --- the flags -----------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "debug", "sweep"])
def test_the_checkpoint_flags_reach_the_spec(
    tmp_path: Path, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adapter.cli.parser import build_parser
    from adapter.cli.submission import build_spec

    monkeypatch.setenv("TETHER_CONFIG", str(tmp_path / "none.toml"))
    (tmp_path / "t.py").write_text("")

    def spec(*flags: str) -> RunSpec:
        argv = [command, "--workdir", str(tmp_path), *flags, "--", "python", "t.py"]
        return build_spec(build_parser().parse_args(argv), debug=command == "debug")

    given = spec("--keep-checkpoints", "5", "--from-checkpoint", "r1:300")
    assert (given.keep_checkpoints, given.from_checkpoint) == (5, "r1:300")
    plain = spec()
    assert (plain.keep_checkpoints, plain.from_checkpoint) == (3, "")
    with pytest.raises(
        SystemExit, match=r"^tether: --from-checkpoint: 'r1:x' is not RUN or RUN:STEP"
    ):
        spec("--from-checkpoint", "r1:x")
    with pytest.raises(SystemExit, match="--keep-checkpoints"):
        spec("--keep-checkpoints", "0")
