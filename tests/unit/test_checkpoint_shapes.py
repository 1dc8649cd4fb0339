"""The pure parts of checkpoints (``protocol_specs/checkpoints``): file sets as an untrusted worker
sends them, merging, retention, where a run seeds from, and the relay's book of a run's steps."""

from __future__ import annotations

import msgpack
import pytest

from protocol_specs.checkpoints.book import CheckpointBook, Part, size_text
from protocol_specs.checkpoints.checkpoints import Checkpoint, latest, parse_source, retained
from protocol_specs.checkpoints.files import CHUNK, FileSet, StoredFile, chunk_count, merge

D1, D2, D3 = "a" * 64, "b" * 64, "c" * 64


def f(path: str, size: int = 1, digest: str = D1, attempt: int = 1) -> StoredFile:
    return StoredFile(path=path, size=size, attempt=attempt, chunks=[digest] * chunk_count(size))


def test_a_file_set_round_trips_and_its_digest_is_its_bytes() -> None:
    fs = FileSet(files=[f("a/x.pt", CHUNK + 1), f("b.txt", 0)])
    assert FileSet.decode(fs.encode()) == fs
    assert fs.size == CHUNK + 1 and fs.digests == {D1} and len(fs.files[0].chunks) == 2
    assert fs.digest() == FileSet.decode(fs.encode()).digest()


@pytest.mark.parametrize(
    "rows",
    [
        [["../etc/passwd", 0o644, 0, 0.0, 0, []]],  # escapes the set
        [["/abs", 0o644, 0, 0.0, 0, []]],
        [["b", 0o644, 0, 0.0, 0, []], ["a", 0o644, 0, 0.0, 0, []]],  # not sorted
        [["a", 0o644, 0, 0.0, 0, []], ["a", 0o644, 0, 0.0, 0, []]],  # twice
        [["a", 0o644, 0, 0.0, 0, []], ["a/b", 0o644, 0, 0.0, 0, []]],  # under a file
        [["a", 0o644, 5, 0.0, 0, []]],  # 5 bytes, no chunk
        [["a", 0o644, 5, 0.0, 0, ["nothex"]]],
        [["a", 0o644, 5, 0.0, 0]],  # a field short
    ],
)
def test_a_file_set_from_a_worker_is_checked_as_strictly_as_a_manifest(rows: list[object]) -> None:
    data = msgpack.packb({"v": 1, "files": rows})
    with pytest.raises(ValueError, match="not a valid file set"):
        FileSet.decode(data)


def test_garbage_is_no_file_set() -> None:
    for data in (b"", b"\xc1", msgpack.packb([1, 2]), msgpack.packb({"v": 2, "files": []})):
        with pytest.raises(ValueError, match="not a valid file set"):
            FileSet.decode(data)


def test_merge_replaces_a_path_stored_again_and_what_lies_under_or_over_it() -> None:
    first = FileSet(files=[f("a", digest=D1), f("d/x", digest=D1), f("e", digest=D1)])
    second = FileSet(files=[f("a", digest=D2), f("d", digest=D2), f("e/y", digest=D2)])
    merged = merge([first, second])
    assert [(x.path, x.chunks[0]) for x in merged.files] == [("a", D2), ("d", D2), ("e/y", D2)]


def test_retention_keeps_the_newest_steps_and_a_step_saved_again_once() -> None:
    c = [Checkpoint(step=s, attempt=1, at=t, files=D1) for s, t in [(1, 1), (2, 2), (3, 3), (2, 4)]]
    kept, dropped = retained(c, 2)
    assert [(x.step, x.at) for x in kept] == [(2, 4), (3, 3)]
    assert sorted((x.step, x.at) for x in dropped) == [(1, 1), (2, 2)]
    assert latest(kept) == kept[-1]


@pytest.mark.parametrize(
    ("text", "want"),
    [("r1", ("r1", None)), ("r1:400", ("r1", 400)), (" my-run:0 ", ("my-run", 0))],
)
def test_a_seed_is_a_run_and_maybe_a_step(text: str, want: tuple[str, int | None]) -> None:
    assert parse_source(text) == want


@pytest.mark.parametrize("text", ["", ":5", "r1:x", "r1:-1", "r1:" + "9" * 19, "r\x01"])
def test_a_seed_that_is_not_run_or_run_step_says_the_form(text: str) -> None:
    with pytest.raises(ValueError, match="RUN or RUN:STEP"):
        parse_source(text)


def test_a_step_of_two_nodes_is_noted_per_node_then_completed_and_retained() -> None:
    book = CheckpointBook().with_part(1, 5, 1, Part(files=D1, sent=3))
    book = book.with_part(1, 5, 1, Part(files=D2, sent=4))  # put again: replaces
    assert book.parts_of(1, 5) == {1: Part(files=D2, sent=4)} and book.latest is None
    book = book.with_part(1, 5, 0, Part(files=D3)).with_part(1, 6, 0, Part(files=D3))
    assert book.set_digests == {D2, D3}
    done = Checkpoint(step=5, attempt=1, at=1.0, files=D1, size=10)
    book, dropped = book.with_complete(done, keep=1)
    assert book.kept == [done] and dropped == [] and list(book.parts) == ["1:6"]
    later = Checkpoint(step=7, attempt=2, at=2.0, files=D2, size=20)
    book, dropped = book.with_complete(later, keep=1)
    assert book.kept == [later] and dropped == [done]
    assert book.parts == {}  # attempt 1 is over: its parts can never complete
    assert book.at_step(7) == later and book.at_step(5) is None and book.size == 20


def test_sizes_read_as_people_write_them() -> None:
    assert [size_text(n) for n in (5, 3 * 1024**2, int(1.2 * 1024**3))] == [
        "5 bytes",
        "3.0 MiB",
        "1.2 GiB",
    ]


def test_status_says_what_checkpoints_and_outputs_a_run_has() -> None:
    from adapter.show.render import status_text
    from protocol_specs.runs.runs import RunRecord
    from protocol_specs.runs.spec import RunSpec

    bare = RunRecord(id="r1", spec=RunSpec(command=["python", "t.py"], workdir="/w"))
    assert "checkpoints:" not in status_text(bare, 0.0) and "outputs:" not in status_text(bare, 0.0)
    last = Checkpoint(step=400, attempt=2, files=D1)
    record = bare.model_copy(
        update={
            "checkpoint": last,
            "checkpoints": 3,
            "checkpoint_bytes": int(1.2 * 1024**3),
            "outputs": 12,
            "outputs_bytes": 30 * 1024**2,
        }
    )
    text = status_text(record, 0.0)
    assert "checkpoints: 3 kept, latest step 400 (attempt 2), 1.2 GiB" in text
    assert "outputs: 12 files, 30.0 MiB" in text
