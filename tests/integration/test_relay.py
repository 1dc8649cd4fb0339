"""The relay against a real Redis-compatible server, over real WebSockets on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgpack
import orjson
import pytest
import trio
from credentials import user_endpoint, worker_endpoint
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import connect

from protocol_specs.runs.runs import RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.session.session import StatusEvent
from protocol_specs.snapshots.snapshots import Manifest, ManifestEntry, digest_of
from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode, IdeLink, Role, StreamName, WorkerLink
from relay.client import Endpoint, RelayError, open_control, open_run_link
from relay.server import serve_relay, server_port
from relay.store import Store, keys

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

SPEC = RunSpec(command=["python", "app.py"], workdir="/home/me/project")
#: an IDE's link in a hand-made hello
IDE = {"kind": "ide"}


@pytest.fixture
async def relay_url(redis_store: Store, nursery: trio.Nursery) -> AsyncIterator[Endpoint]:
    """The relay, with a token of the user ``me`` (every scope)."""
    server = await nursery.start(
        lambda task_status: serve_relay(redis_store, port=0, task_status=task_status)
    )
    return await user_endpoint(redis_store, f"ws://127.0.0.1:{server_port(server)}")


async def raw_exchange(url: Endpoint, *messages: bytes | str) -> list[Any]:
    """Send messages on a fresh connection; return the decoded frames received until it closes or idles."""
    replies: list[Any] = []
    async with connect(url.url, compression=None) as ws:
        # the hello, then its answer: before the welcome the relay takes no message over 64 KiB
        await ws.send(messages[0])
        with trio.fail_after(10):
            replies.append(msgpack.unpackb(await ws.recv(), raw=False))
        for message in messages[1:]:
            await ws.send(message)
        with trio.move_on_after(2):
            try:
                while True:
                    replies.append(msgpack.unpackb(await ws.recv(), raw=False))
                    if replies[-1].get("fatal"):
                        break
            except ConnectionClosed:
                pass
    return replies


async def exchange(url: Endpoint, *messages: bytes, replies: int) -> list[Any]:
    """Send messages on a fresh connection and read exactly ``replies`` frames."""
    got: list[Any] = []
    async with connect(url.url, compression=None) as ws:
        for message in messages:
            await ws.send(message)
        with trio.fail_after(10):
            while len(got) < replies:
                got.append(msgpack.unpackb(await ws.recv(), raw=False))
    return got


def dap(body: dict[str, Any], **fields: Any) -> bytes:
    return wire.encode_entry(wire.DapEntry(body=orjson.dumps(body), **fields))


MANIFEST = Manifest(
    entries=[ManifestEntry(path="train.py", digest=digest_of(b"print(1)\n"), size=9)]
)


async def test_submit_claim_publish_deliver_and_finish(
    relay_url: Endpoint, redis_store: Store
) -> None:
    async with open_control(relay_url) as control:
        with pytest.raises(RelayError, match="lacks 1 of the snapshot's blobs"):
            await control.submit(SPEC, MANIFEST)
        assert await control.missing_blobs(MANIFEST.digests) == MANIFEST.digests
        await control.put_blob(MANIFEST.digests[0], b"print(1)\n")
        assert await control.missing_blobs(MANIFEST.digests) == []
        record = await control.submit(SPEC, MANIFEST)
        assert record.state is RunState.QUEUED
        assert (record.snapshot, record.files, record.size) == (MANIFEST.id, 1, 9)
        assigned = await control.claim("w-0")
        claimed, manifest = assigned.run, assigned.manifest
        assert assigned.token.startswith("tthw_")
        assert (claimed.id, claimed.state, claimed.worker, manifest) == (
            record.id,
            RunState.STARTING,
            "w-0",
            MANIFEST,
        )
        assert await control.get_blob(MANIFEST.digests[0]) == b"print(1)\n"
    async with (
        open_run_link(relay_url, link=IdeLink(), run=record.id) as ide,
        open_run_link(
            relay_url.with_token(assigned.token), link=WorkerLink(), run=record.id
        ) as worker,
    ):
        # ide -> worker: acknowledged only once stored, delivered from the stream
        await ide.publish(
            wire.DapEntry(origin="a", body=b'{"seq":1,"type":"request","command":"threads"}')
        )
        with trio.fail_after(5):
            delivered = await worker.deliveries.receive()
        assert delivered.stream is StreamName.TO_WORKER
        stored = await redis_store.read_after(keys.stream(record.id, "to_worker"), "0")
        assert stored == [(delivered.cursor, delivered.entry)]
        # worker -> ide, after the relay's own queued/claimed status entries
        await worker.publish(wire.StatusEntry(event=StatusEvent.STARTED))
        await worker.publish(wire.StatusEntry(event=StatusEvent.EXITED, exit_code=0))
        events = []
        with trio.fail_after(5):
            while len(events) < 4:
                entry = wire.decode_entry((await ide.deliveries.receive()).entry)
                assert isinstance(entry, wire.StatusEntry)
                events.append(entry.event)
        assert events == ["queued", "claimed", "started", "exited"]
    async with open_control(relay_url) as control:
        assert (await control.get_run(record.id)).state is RunState.SUCCEEDED


async def test_a_reconnecting_peer_resumes_after_its_cursor(
    relay_url: Endpoint, redis_store: Store
) -> None:
    async with open_control(relay_url) as control:
        run = (await control.submit(SPEC)).id
    as_worker = await worker_endpoint(redis_store, relay_url, run)
    async with open_run_link(as_worker, link=WorkerLink(), run=run) as worker:
        for n in range(3):
            await worker.publish(
                wire.DapEntry(body=orjson.dumps({"seq": n + 1, "type": "event", "event": "output"}))
            )
    async with open_run_link(relay_url, link=IdeLink(), run=run) as ide:
        with trio.fail_after(5):
            first = [await ide.deliveries.receive() for _ in range(3)]  # queued + 2 outputs
    async with open_run_link(relay_url, link=IdeLink(), run=run, cursor=first[-1].cursor) as ide:
        with trio.fail_after(5):
            rest = await ide.deliveries.receive()
        assert orjson.loads(wire.decode_entry(rest.entry).body)["seq"] == 3  # type: ignore[union-attr]
        assert ide.welcome.tails["to_ide"] == rest.cursor


async def test_a_live_entry_reaches_an_early_peer_before_it_is_stored_then_its_commit(
    relay_url: Endpoint, redis_store: Store
) -> None:
    """On the wire: a peer that asked for ``early`` entries gets a live publish without a cursor,
    naming its producer and number, and later the commit with the cursor Redis gave it (which
    the stream keeps with the producer and number)."""
    async with open_control(relay_url) as control:
        run = (await control.submit(SPEC)).id
    as_worker = await worker_endpoint(redis_store, relay_url, run)
    hello = wire.Hello(role=Role.IDE, link=wire.IdeLink(early=True), run=run, token=relay_url.token)
    async with connect(relay_url.url, compression=None) as ide:
        await ide.send(wire.encode_frame(hello))

        async def frame() -> wire.AnyFrame:
            with trio.fail_after(10):
                return wire.decode_frame(await ide.recv())

        welcome = await frame()
        assert isinstance(welcome, wire.Welcome)
        queued = await frame()  # the relay's own status entry: stored, no publish named
        assert isinstance(queued, wire.Deliver) and queued.cursor and not queued.producer
        output = dap({"seq": 1, "type": "event", "event": "output"})
        async with open_run_link(as_worker, link=WorkerLink(), run=run, producer="w1") as worker:
            await worker.publish(wire.decode_entry(output))
            early = await frame()
            assert isinstance(early, wire.Deliver)
            assert (early.cursor, early.producer, early.n, early.entry) == ("", "w1", 1, output)
            commit = await frame()
            (stored,) = await redis_store.read_numbered(keys.stream(run, "to_ide"), queued.cursor)
            assert commit == wire.Commit(
                stream=StreamName.TO_IDE, cursor=stored.id, producer="w1", n=1
            )
            assert (stored.payload, stored.producer, stored.n) == (output, "w1", 1)


async def test_cancel_reaches_the_worker_and_wins_over_a_late_exit(relay_url: Endpoint) -> None:
    async with open_control(relay_url) as control:
        run = (await control.submit(SPEC)).id
        token = (await control.claim("w-0")).token
        cancelled = await control.cancel(run)
        assert cancelled.state is RunState.CANCELLED
    async with open_run_link(relay_url.with_token(token), link=WorkerLink(), run=run) as worker:
        with trio.fail_after(5):
            entry = wire.decode_entry((await worker.deliveries.receive()).entry)
        assert isinstance(entry, wire.ControlEntry) and entry.action == "terminate"
        await worker.publish(wire.StatusEntry(event=StatusEvent.EXITED, exit_code=-15))
    async with open_control(relay_url) as control:
        assert (await control.get_run(run)).state is RunState.CANCELLED


async def test_a_cancelled_queued_run_is_never_claimed(relay_url: Endpoint) -> None:
    async with open_control(relay_url) as control:
        first = (await control.submit(SPEC)).id
        second = (await control.submit(SPEC)).id
        await control.cancel(first)
        assert (await control.claim("w-0")).run.id == second


@pytest.mark.parametrize(
    ("messages", "code"),
    [
        (["hello as text"], ErrorCode.BAD_FRAME),
        ([b"\xc1\xc1"], ErrorCode.BAD_FRAME),
        ([msgpack.packb({"t": "publish", "n": 1, "entry": b""})], ErrorCode.HANDSHAKE_REQUIRED),
        (
            [msgpack.packb({"t": "hello", "v": 99, "role": "ide", "run": "x"})],
            ErrorCode.UNSUPPORTED_VERSION,
        ),
        (  # an older client's: its link as four fields
            [msgpack.packb({"t": "hello", "v": 1, "role": "ide", "run": "x", "history": True})],
            ErrorCode.UNSUPPORTED_VERSION,
        ),
        (
            [msgpack.packb({"t": "hello", "v": 2, "role": "ide", "run": "nope", "link": IDE})],
            ErrorCode.UNAUTHORIZED,
        ),
        (
            [
                msgpack.packb(
                    {
                        "t": "hello",
                        "v": 2,
                        "role": "ide",
                        "run": "nope",
                        "token": "TOKEN",
                        "link": IDE,
                    }
                )
            ],
            ErrorCode.NO_SUCH_RUN,
        ),
        (
            [msgpack.packb({"t": "hello", "v": 2, "role": "ide", "token": "TOKEN", "link": IDE})],
            ErrorCode.BAD_FRAME,
        ),
        ([msgpack.packb({"t": "hello", "v": 2, "role": "spy"})], ErrorCode.BAD_FRAME),
    ],
)
async def test_bad_handshakes_get_a_fatal_error_and_a_close(
    relay_url: Endpoint, messages: list[bytes | str], code: ErrorCode
) -> None:
    replies: list[Any] = []
    async with connect(relay_url.url, compression=None) as ws:
        for message in messages:
            if isinstance(message, bytes) and b"TOKEN" in message:  # the real token, please
                fields = msgpack.unpackb(message)
                message = msgpack.packb({**fields, "token": relay_url.token})
            await ws.send(message)
        with trio.fail_after(15), pytest.raises(ConnectionClosed):  # noqa: PT012
            while True:
                replies.append(msgpack.unpackb(await ws.recv(), raw=False))
        assert ws.close_code == 1008  # policy violation: closed by the relay on purpose
    assert replies[-1]["t"] == "error" and replies[-1]["code"] == code.value
    assert replies[-1]["fatal"] is True


async def test_bad_frames_after_the_handshake_are_refused_and_nothing_is_lost(
    relay_url: Endpoint, redis_store: Store
) -> None:
    async with open_control(relay_url) as control:
        run = (await control.submit(SPEC)).id
    token = (await worker_endpoint(redis_store, relay_url, run)).token
    hello = wire.encode_frame(
        wire.Hello(role=Role.WORKER, link=wire.WorkerLink(), run=run, token=token)
    )
    good = wire.encode_frame(
        wire.Publish(n=5, entry=dap({"seq": 1, "type": "event", "event": "output"}))
    )
    replies = await raw_exchange(
        relay_url,
        hello,
        b"garbage",
        msgpack.packb({"t": "publish", "n": 1, "entry": b"not an entry"}),
        wire.encode_frame(
            wire.Publish(n=2, entry=wire.encode_entry(wire.StatusEntry(event="queued")))
        ),
        wire.encode_frame(
            wire.Publish(n=3, entry=wire.encode_entry(wire.ControlEntry(action="terminate")))
        ),
        wire.encode_frame(wire.Claim(rid=1, worker="x")),
        msgpack.packb(
            {
                "t": "publish",
                "n": 4,
                "entry": msgpack.packb({"k": "dap", "body": b"x" * (wire.MAX_DAP_BODY_BYTES + 1)}),
            }
        ),
        good,
    )
    kinds = [(r["t"], r.get("code"), r.get("n")) for r in replies[1:]]
    # publishes are answered in their order (by the link's storer); a frame that is no publish
    # is refused as it arrives, so the two kinds of answer may interleave
    assert [kind for kind in kinds if kind[2] is not None] == [
        ("error", "bad_entry", 1),
        ("error", "not_allowed", 2),  # workers publish their own status events only
        ("error", "forbidden", 3),  # nobody publishes control entries (the relay writes them)
        ("error", "bad_entry", 4),
        ("ack", None, 5),  # refused numbers count as answered: no gap
    ]
    assert [kind for kind in kinds if kind[2] is None] == [
        ("error", "bad_frame", None),
        ("error", "not_allowed", None),
    ]
    stored = await redis_store.read_after(keys.stream(run, "to_ide"), "0")
    assert len(stored) == 2  # the relay's "queued" and the one good entry


async def test_resent_publishes_are_stored_once_and_gaps_are_refused(
    relay_url: Endpoint, redis_store: Store
) -> None:
    async with open_control(relay_url) as control:
        run = (await control.submit(SPEC)).id
    token = (await worker_endpoint(redis_store, relay_url, run)).token
    hello = wire.encode_frame(
        wire.Hello(role=Role.WORKER, link=wire.WorkerLink(), run=run, producer="w1", token=token)
    )

    def publish(n: int) -> bytes:
        body = {"seq": n, "type": "event", "event": "output", "body": {"output": str(n)}}
        return wire.encode_frame(wire.Publish(n=n, entry=dap(body)))

    async def until_ack(*messages: bytes, n: int) -> list[Any]:
        """The frames after the welcome, up to the ack of publish ``n`` (acks are cumulative: one
        may answer several publishes stored together) or a fatal error."""
        got: list[Any] = []
        async with connect(relay_url.url, compression=None) as ws:
            for message in messages:
                await ws.send(message)
            with trio.fail_after(10):
                while not got or not (got[-1].get("n") == n or got[-1].get("fatal")):
                    got.append(msgpack.unpackb(await ws.recv(), raw=False))
        assert got[0]["t"] == "welcome"
        return got[1:]

    first = await until_ack(hello, publish(1), publish(2), n=2)
    # a reconnect re-sends 2 (its ack was lost), then goes on; another connection skips ahead
    second = await until_ack(hello, publish(2), publish(3), n=3)
    third = await until_ack(hello, publish(5), n=5)
    assert {(r["t"], r["duplicate"]) for r in first} == {("ack", False)}
    assert [r["n"] for r in first] in ([1, 2], [2])
    assert [(r["t"], r["n"], r["duplicate"]) for r in second] == [
        ("ack", 2, True),  # a duplicate is answered on its own, with the cursor it was stored at
        ("ack", 3, False),
    ]
    assert second[0]["cursor"] == first[-1]["cursor"]
    assert third[-1]["code"] == "out_of_order" and third[-1]["fatal"] is True
    stored = await redis_store.read_after(keys.stream(run, "to_ide"), "0")
    assert len(stored) == 4  # "queued" and publishes 1, 2, 3 once each


async def test_publishes_that_queue_up_are_stored_together_in_order(
    relay_url: Endpoint, redis_store: Store
) -> None:
    async with open_control(relay_url) as control:
        run = (await control.submit(SPEC)).id
    token = (await worker_endpoint(redis_store, relay_url, run)).token
    hello = wire.encode_frame(
        wire.Hello(role=Role.WORKER, link=wire.WorkerLink(), run=run, producer="w1", token=token)
    )
    bodies = [dap({"seq": n, "type": "event", "event": "output"}) for n in range(1, 201)]
    frames = [wire.encode_frame(wire.Publish(n=n, entry=b)) for n, b in enumerate(bodies, 1)]
    acks: list[int] = []
    async with connect(relay_url.url, compression=None) as ws:
        await ws.send(hello)
        for frame in frames:  # all at once: the storer takes what queued up together
            await ws.send(frame)
        with trio.fail_after(10):
            while not acks or acks[-1] < len(frames):
                reply = msgpack.unpackb(await ws.recv(), raw=False)
                if reply["t"] == "ack":
                    acks.append(reply["n"])
    assert acks == sorted(set(acks))  # cumulative, in order, each number once
    stored = await redis_store.read_numbered(keys.stream(run, "to_ide"), "0", count=1000)
    assert [(e.payload, e.n) for e in stored[1:]] == list(zip(bodies, range(1, 201), strict=True))


async def test_oversized_messages_close_only_that_connection(
    relay_url: Endpoint, redis_store: Store
) -> None:
    async with open_control(relay_url) as control:
        run = (await control.submit(SPEC)).id
        token = (await worker_endpoint(redis_store, relay_url, run)).token
        async with connect(relay_url.url, compression=None, max_size=None) as ws:
            await ws.send(
                wire.encode_frame(
                    wire.Hello(role=Role.WORKER, link=wire.WorkerLink(), run=run, token=token)
                )
            )
            await ws.recv()
            await ws.send(b"\x00" * (wire.MAX_FRAME_BYTES + 1))
            with trio.fail_after(10), pytest.raises(ConnectionClosed):  # noqa: PT012
                while True:
                    await ws.recv()
            assert ws.close_code == 1009  # message too big
        # the relay still serves everyone else
        assert (await control.get_run(run)).id == run


async def test_broken_spec_gets_a_clear_error(relay_url: Endpoint) -> None:
    replies = await raw_exchange(
        relay_url,
        wire.encode_frame(wire.Hello(role=Role.CONTROL, token=relay_url.token)),
        msgpack.packb({"t": "submit", "rid": 5, "spec": {"command": [], "workdir": "rel"}}),
    )
    error = replies[-1]
    assert error["code"] == "bad_spec" and error["rid"] == 5 and "command" in error["message"]


async def test_a_crafted_sweep_beyond_what_the_relay_holds_is_refused_at_submit(
    relay_url: Endpoint, redis_store: Store
) -> None:
    """Past the CLI's checks (a frame written by hand): the relay checks the space again, and
    says which parameter in one line; nothing is created, and the connection serves on."""
    run = {"command": ["python", "t.py", "{x}"], "workdir": "/w", "debug": False}
    spaces = {
        1: {"name": "x", "kind": "int", "low": 0.0, "high": 1e300},
        2: {"name": "x", "kind": "float", "low": -1.7e308, "high": 1.7e308},
        3: {"name": "x", "kind": "choice", "choices": [1, 2**64 - 1]},
    }
    frames = [
        msgpack.packb({"t": "submit_sweep", "rid": rid, "spec": {"params": [p], "run": run}})
        for rid, p in spaces.items()
    ]
    hello = wire.encode_frame(wire.Hello(role=Role.CONTROL, token=relay_url.token))
    replies = await exchange(relay_url, hello, *frames, replies=1 + len(frames))
    errors = replies[1:]
    assert [(e["t"], e["code"], e["rid"]) for e in errors] == [
        ("error", "bad_spec", rid) for rid in spaces
    ]
    assert "x: an int range's bounds are within ±9007199254740992 (2**53)" in errors[0]["message"]
    assert "x: a range's bounds are within ±1e300" in errors[1]["message"]
    assert "x: an integer choice is within ±(2**63 - 1)" in errors[2]["message"]
    assert all("\n" not in e["message"] for e in errors)
    assert await redis_store.zrange_desc(keys.SWEEPS, 10) == []
    async with open_control(relay_url) as control:
        assert await control.list_sweeps() == []


async def test_unknown_run_for_the_cli(relay_url: Endpoint) -> None:
    async with open_control(relay_url) as control:
        with pytest.raises(RelayError) as info:
            await control.get_run("does-not-exist")
    assert info.value.code == ErrorCode.NO_SUCH_RUN


async def test_a_hostile_manifest_is_refused_and_the_relay_serves_on(relay_url: Endpoint) -> None:
    spec = SPEC.model_dump(mode="json")
    hostile = [
        {"path": "../../.bashrc", "digest": "ab" * 32},
        {"path": "/etc/cron.d/x", "digest": "ab" * 32},
        {"path": "link", "kind": "symlink", "target": "../../../etc"},
    ]
    frames = [
        msgpack.packb(
            {"t": "submit", "rid": i, "spec": spec, "manifest": {"entries": [entry]}},
            use_bin_type=True,
        )
        for i, entry in enumerate(hostile, start=1)
    ]
    hello = wire.encode_frame(wire.Hello(role=Role.CONTROL, token=relay_url.token))
    replies = await exchange(relay_url, hello, *frames, replies=1 + len(frames))
    errors = replies[1:]
    assert [e["code"] for e in errors] == ["bad_spec"] * 3
    assert [e["rid"] for e in errors] == [1, 2, 3]
    assert "'..' component" in errors[0]["message"]
    assert "absolute" in errors[1]["message"]
    assert "points out of the snapshot" in errors[2]["message"]
    async with open_control(relay_url) as control:  # still serving
        assert (await control.submit(SPEC)).state is RunState.QUEUED
