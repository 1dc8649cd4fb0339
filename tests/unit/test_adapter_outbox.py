"""An IDE connection's outbox, stepped message by message: what is merged, dropped, kept, and in
which order (no sockets; the writer task that drains it is tested in test_adapter_server.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from adapter.dap.outbox import Outbox
from protocol_specs.dap.framing import DapFramer, encode_message
from protocol_specs.dap.schema import validate_message

KIB = 1024


def output(seq: int, text: str, category: str = "stdout", **extra: Any) -> dict[str, Any]:
    body = {"category": category, "output": text, **extra}
    return {"seq": seq, "type": "event", "event": "output", "body": body}


def response(seq: int, request_seq: int, size: int = 0) -> dict[str, Any]:
    msg: dict[str, Any] = {
        "seq": seq,
        "type": "response",
        "request_seq": request_seq,
        "success": True,
        "command": "evaluate",
        "body": {"result": "r" * size, "variablesReference": 0},
    }
    return msg


def stopped(seq: int) -> dict[str, Any]:
    body = {"reason": "breakpoint", "threadId": 1, "allThreadsStopped": True}
    return {"seq": seq, "type": "event", "event": "stopped", "body": body}


def drain(box: Outbox, limit: int = 256 * KIB) -> list[dict[str, Any]]:
    framer = DapFramer()
    out = []
    while (data := box.take(limit)) is not None:
        framer.receive_data(data)
        while (msg := framer.next_message()) is not None:
            validate_message(msg)
            out.append(msg)
    assert box.bytes == 0 and box.hard_bytes == 0 and len(box) == 0
    return out


def test_consecutive_output_of_one_category_is_merged_up_to_the_limit() -> None:
    box = Outbox("r1", merge_limit=10)
    for seq, text in enumerate(["ab", "cd", "efgh"], start=1):
        box.push(output(seq, text))
    box.push(output(4, "ij", "stderr"))
    box.push(output(5, "klmnop"))  # a new run: the category changed
    box.push(output(6, "qrstu"))  # 6 + 5 > 10: a new event
    box.push(output(7, "v", group="start"))  # not plain text: kept as it is
    box.push(output(8, "w"))
    got = [(m["seq"], m["body"]["category"], m["body"]["output"]) for m in drain(box)]
    assert got == [
        (1, "stdout", "abcdefgh"),
        (4, "stderr", "ij"),
        (5, "stdout", "klmnop"),
        (6, "stdout", "qrstu"),
        (7, "stdout", "v"),
        (8, "stdout", "w"),
    ]


def test_over_the_output_limit_output_is_dropped_with_one_notice_saying_how_much() -> None:
    box = Outbox("r1", output_limit=100 * KIB, merge_limit=16 * KIB)
    chunk = "x" * 1000 + "é"  # 1,002 bytes of UTF-8
    for seq in range(1, 201):
        box.push(output(seq, chunk))
    assert 100 * KIB < box.bytes < 120 * KIB
    assert box.skipped_bytes % 1002 == 0  # whole events were dropped, counted in UTF-8 bytes
    kept_events = 200 - box.skipped_bytes // 1002
    assert 100 <= kept_events <= 103  # until the queue held over 100 KiB (text plus envelopes)
    box.push(response(201, 7))  # never dropped, and after the notice
    box.push(output(202, "more", category="important"))  # tether's own notices are kept
    messages = drain(box)
    texts = [m["body"]["output"] for m in messages if m.get("event") == "output"]
    assert "".join(texts[:-2]) == chunk * kept_events
    notice = messages[-3]
    assert notice["body"]["category"] == "important"
    assert f"skipped {box.skipped_bytes:,} bytes of program output" in notice["body"]["output"]
    assert "tether logs r1" in notice["body"]["output"]
    assert notice["seq"] == kept_events + 1  # the place of the first event it replaces
    assert [m["seq"] for m in messages[-2:]] == [201, 202]
    # the IDE caught up: output flows again
    box.push(output(203, "back"))
    assert [m["body"]["output"] for m in drain(box)] == ["back"]


def test_drops_between_other_messages_get_a_notice_each_in_place() -> None:
    box = Outbox("r1", output_limit=10)
    box.push(output(1, "a" * 20))
    box.push(output(2, "dropped"))
    box.push(stopped(3))
    box.push(output(4, "dropped too"))
    box.push(output(5, "and this"))
    messages = drain(box)
    assert [m["seq"] for m in messages] == [1, 2, 3, 4]
    assert "skipped 7 bytes" in messages[1]["body"]["output"]
    assert "skipped 19 bytes" in messages[3]["body"]["output"]
    assert "(2 output events)" in messages[3]["body"]["output"]


def test_responses_and_events_are_never_dropped_but_a_stuck_ide_is_given_up() -> None:
    box = Outbox("r1", output_limit=KIB, hard_limit=64 * KIB)
    seq = 0
    while not box.stuck:
        seq += 1
        assert box.push(response(seq, seq, size=1000)) or box.stuck
    size = len(encode_message(response(1, 1, size=1000)))
    assert seq == 64 * KIB // size + 1  # every one was kept until they were over 64 KiB
    assert not box.push(stopped(seq + 1)) and box.done
    assert box.take() is None  # the connection is to be closed, not written


def test_close_writes_what_is_queued_then_is_done() -> None:
    box = Outbox("r1")
    box.push(response(1, 1))
    box.close()
    assert not box.push(response(2, 2)) and not box.done
    assert [m["seq"] for m in drain(box)] == [1]
    assert box.done


def test_take_hands_out_whole_messages_about_the_limit_at_a_time() -> None:
    box = Outbox("r1")
    for seq in range(1, 11):
        box.push(response(seq, seq, size=100))
    first = box.take(limit=300)
    assert first is not None
    framer = DapFramer()
    framer.receive_data(first)
    seqs = []
    while (msg := framer.next_message()) is not None:
        seqs.append(msg["seq"])
    size = len(encode_message(response(1, 1, size=100)))
    assert size < 300 < 2 * size and seqs == [1, 2]  # taken until over the limit
    assert framer.trailing == b""  # whole messages only
    big = Outbox("r1")
    big.push(response(1, 1, size=10_000))
    assert len(big.take(limit=10) or b"") > 10_000  # one message always fits


def test_what_cannot_be_encoded_is_dropped_not_raised() -> None:
    deep: Any = []
    for _ in range(300):
        deep = [deep]
    box = Outbox("r1")
    assert not box.push({"seq": 1, "type": "event", "event": "x", "body": {"d": deep}})
    assert not box.push(output(2, "y", data=deep))
    assert box.push(stopped(3))
    assert [m["seq"] for m in drain(box)] == [3]


MESSAGES = st.one_of(
    st.builds(
        lambda text, cat: ("output", text, cat),
        st.text(max_size=300),
        st.sampled_from(["stdout", "stderr", "console"]),
    ),
    st.builds(lambda size: ("response", size, ""), st.integers(0, 500)),
    st.just(("stopped", 0, "")),
)


@given(
    st.lists(MESSAGES, max_size=60),
    st.integers(50, 5000),
    st.integers(1, 2000),
    st.lists(st.integers(0, 60), max_size=5),
)
def test_order_and_accounting_hold_whatever_is_queued_and_taken(
    script: list[tuple[str, Any, str]], output_limit: int, take_limit: int, takes_at: list[int]
) -> None:
    """Non-output messages all arrive, in order; seq only grows; output text arrives in order,
    except for what a notice accounts for; byte counts return to zero."""
    box = Outbox("r1", output_limit=output_limit, merge_limit=700)
    framer = DapFramer()
    received: list[dict[str, Any]] = []

    def take() -> None:
        if (data := box.take(take_limit)) is not None:
            framer.receive_data(data)
            while (msg := framer.next_message()) is not None:
                received.append(msg)

    sent_text: dict[str, int] = {}
    for seq, (kind, value, category) in enumerate(script, start=1):
        if kind == "output":
            box.push(output(seq, value, category))
            sent_text[category] = sent_text.get(category, 0) + len(value.encode(errors="replace"))
        elif kind == "response":
            assert box.push(response(seq, seq, size=value))
        else:
            assert box.push(stopped(seq))
        if seq in takes_at:
            take()
    while box.bytes:
        take()
    assert box.take() is None and box.hard_bytes == 0
    seqs = [m["seq"] for m in received]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    others = [m["seq"] for m in received if m.get("event") != "output"]
    assert others == [s for s, (k, _, _) in enumerate(script, start=1) if k != "output"]
    got = sum(
        len(m["body"]["output"].encode(errors="replace"))
        for m in received
        if m.get("event") == "output" and m["body"]["category"] != "important"
    )
    assert got + box.skipped_bytes == sum(sent_text.values())
    if box.skipped_bytes:
        assert any("skipped" in m["body"]["output"] for m in received if m.get("event") == "output")
