"""Two streams, one terminal: whole lines, never one stream's line inside the other's."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from protocol_specs.runs.lines import HOLD_LIMIT, LineJoiner


def shown(pieces: list[tuple[str, bytes]]) -> bytes:
    return b"".join(data for _, data in pieces)


def test_a_line_of_stderr_waits_for_the_open_line_of_stdout() -> None:
    j = LineJoiner()
    out = j.feed("stdout", b"loss=0.42")
    assert out == [("stdout", b"loss=0.42")]  # nobody else waits: shown at once
    assert j.feed("stderr", b"warn: epoch 16 done\n") == []  # inside a line of stdout: held
    out = j.feed("stdout", b"152\n")
    assert out == [("stdout", b"152\n"), ("stderr", b"warn: epoch 16 done\n")]


def test_a_progress_bar_redrawn_with_carriage_returns_shows_as_it_goes() -> None:
    j = LineJoiner()
    assert shown(j.feed("stderr", b" 10%|#  |\r")) == b" 10%|#  |\r"
    assert shown(j.feed("stdout", b"step 1\n")) == b"step 1\n"
    assert shown(j.feed("stderr", b" 20%|## |\r")) == b" 20%|## |\r"


def test_a_line_left_open_too_long_is_ended_for_the_other_stream() -> None:
    j = LineJoiner()
    j.feed("stdout", b"waiting for input: ")
    out = j.feed("stderr", b"x" * HOLD_LIMIT + b"y\n")
    assert out[0] == ("stdout", b"\n") and shown(out[1:]).endswith(b"y\n")


def test_flush_gives_everything_held_open_line_first() -> None:
    j = LineJoiner()
    j.feed("stdout", b"partial")
    j.feed("stderr", b"held\n")
    assert j.flush() == [("stderr", b"held\n")]
    assert j.flush() == []


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["stdout", "stderr"]),
            st.binary(max_size=40).map(lambda b: b.replace(b"\r", b"")),
        ),
        max_size=30,
    )
)
def test_nothing_is_lost_reordered_within_a_stream_or_cut_into_the_others_line(
    chunks: list[tuple[str, bytes]],
) -> None:
    j = LineJoiner()
    out: list[tuple[str, bytes]] = []
    for stream, data in chunks:
        out += j.feed(stream, data)
    # while output comes, a switch of stream happens only where the last one's line ended
    written = {"stdout": b"", "stderr": b""}
    last = None
    for stream, data in out:
        if last is not None and stream != last and written[last]:
            assert written[last].endswith(b"\n"), out
        written[stream] += data
        last = stream
    out += j.flush()
    for name in ("stdout", "stderr"):
        assert shown([p for p in out if p[0] == name]) == b"".join(
            d for s, d in chunks if s == name
        )


def test_more_of_the_open_line_shows_at_once() -> None:
    j = LineJoiner()
    assert j.feed("stdout", b"epoch 1: ") == [("stdout", b"epoch 1: ")]
    assert j.feed("stdout", b"....") == [("stdout", b"....")]
    assert j.feed("stderr", b"warn\n") == []
    assert j.feed("stdout", b" done\n") == [("stdout", b" done\n"), ("stderr", b"warn\n")]
