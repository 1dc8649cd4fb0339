"""Merging pydevd's one-event-per-write output: same text, same order, nothing else touched."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from protocol_specs.dap.models import MAX_MERGED_OUTPUT, coalesce_output, plain_output


def output(text: str, category: str = "stdout", seq: int = 1, **extra: object) -> bytes:
    body = {"output": text, "category": category, **extra}
    return orjson.dumps({"seq": seq, "type": "event", "event": "output", "body": body})


STOPPED = orjson.dumps({"seq": 9, "type": "event", "event": "stopped", "body": {"threadId": 1}})


def texts(messages: list[bytes]) -> list[tuple[str, str]]:
    out = []
    for raw in messages:
        plain = plain_output(raw)
        out.append(plain if plain is not None else ("other", raw.decode()))
    return out


def test_a_print_becomes_one_event() -> None:
    # print("line", 1) under pydevd: four events; debugpy adds an empty source
    parts = [output(t, seq=i, source={}) for i, t in enumerate(["line", " ", "1", "\n"], 1)]
    merged = coalesce_output(parts)
    assert len(merged) == 1
    msg = orjson.loads(merged[0])
    assert msg["seq"] == 1 and msg["event"] == "output"
    assert msg["body"] == {"category": "stdout", "output": "line 1\n"}


def test_other_messages_and_categories_keep_their_place() -> None:
    messages = [
        output("a"),
        output("b"),
        output("err", "stderr"),
        STOPPED,
        output("c"),
        output("with a source", source={"path": "/x.py"}, line=3),
        output("d"),
        output("t", "telemetry"),
    ]
    merged = coalesce_output(messages)
    assert texts(merged) == [
        ("stdout", "ab"),
        ("stderr", "err"),
        ("other", STOPPED.decode()),
        ("stdout", "c"),
        ("other", messages[5].decode()),  # a source location is not merged away
        ("stdout", "d"),
        ("other", messages[7].decode()),  # telemetry is never output
    ]
    assert merged[3] == messages[4]  # a lone event is passed on byte for byte


def test_merged_events_stay_bounded() -> None:
    chunk = "x" * 1000
    merged = coalesce_output([output(chunk, seq=i) for i in range(200)])
    sizes = [len(orjson.loads(m)["body"]["output"]) for m in merged]
    assert sum(sizes) == 200 * 1000 and max(sizes) <= MAX_MERGED_OUTPUT and len(merged) > 1
    big = output("y" * (MAX_MERGED_OUTPUT + 5))
    assert coalesce_output([big]) == [big]


@given(
    st.lists(
        st.one_of(
            st.tuples(st.sampled_from(["stdout", "stderr", "console"]), st.text(max_size=20)),
            st.just(("other", "")),
        ),
        max_size=40,
    )
)
def test_the_text_of_every_category_is_kept_in_order(items: list[tuple[str, str]]) -> None:
    messages = [STOPPED if c == "other" else output(t, c) for c, t in items]
    merged = coalesce_output(messages)

    def stream(msgs: list[bytes]) -> list[tuple[str, str]]:
        flat: list[tuple[str, str]] = []  # consecutive same-category text joined
        for category, text in texts(msgs):
            if flat and flat[-1][0] == category != "other":
                flat[-1] = (category, flat[-1][1] + text)
            else:
                flat.append((category, text))
        return flat

    assert stream(merged) == stream(messages)
    assert len(merged) <= len(messages)
