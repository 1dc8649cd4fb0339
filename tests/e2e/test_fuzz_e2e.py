"""Thousands of malformed and oversized messages at the relay and the adapter while a well-formed
debug session runs beside them: the session finishes correctly and both services stay up.

Real processes (`tether up`, `tether debug`), a real debuggee. The hostile peer holds a valid
``runs`` token of the same user (the worst a stolen laptop token allows): it sends junk frames on
control connections and on IDE connections of another run of the user's, hellos that are junk or
carry junk tokens, and messages over every size cap; at the adapter it opens connections that
send bytes that are not DAP, headers with absurd lengths, bodies that are not JSON, and requests
other than ``initialize`` (an ``evaluate`` that would kill the program, were it ever run).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
import trio.lowlevel
from stack import PROJECT, debug_run, local_token, relay_stack
from test_session_e2e import bp_args, ide_session, resume, stopped_frame
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import connect

from adapter.scripted_ide.dap_client import open_dap_client
from protocol_specs.dap import framing as dap_framing
from protocol_specs.runs.spec import RunSpec
from protocol_specs.wire import wire
from relay.client import Endpoint, open_control

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FRAME_TYPES = [
    "hello", "publish", "ack", "received", "heartbeat", "deliver", "commit", "submit", "rerun",
    "have_blobs", "put_blob", "get_blob", "list_runs", "report", "cancel", "get_run", "claim",
    "dispatch", "create_token", "list_tokens", "revoke_token", "get_audit", "error", "bogus",
]  # fmt: skip
JUNK_KEYS = ["rid", "n", "run", "entry", "spec", "digest", "size", "offset", "data", "cursor", "k"]


def junk_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    match kind:
        case 0:
            return None
        case 1:
            return rng.choice([True, False, 0, -1, 2**63 - 1, -(2**63), 1e308, float("nan")])
        case 2:
            return rng.randbytes(rng.randrange(0, 64))
        case 3:
            return "".join(chr(rng.randrange(0, 0x2FF)) for _ in range(rng.randrange(0, 32)))
        case 4:
            return rng.randrange(-(2**40), 2**40)
        case 5:
            return "x" * rng.randrange(0, 5000)
        case 6:
            return [junk_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
        case 7:
            return {rng.choice(JUNK_KEYS): junk_value(rng, depth + 1) for _ in range(4)}
        case _:
            return msgpack.packb({"k": rng.choice(["dap", "status", "log", "x"])})


def junk_frame(rng: random.Random) -> bytes | str:
    """Something a broken or hostile peer might send instead of a frame."""
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randbytes(rng.randrange(0, 300))
    if kind == 1:
        return "a text message"
    if kind == 2:  # a map with a real frame type and junk fields
        fields = {k: junk_value(rng) for k in rng.sample(JUNK_KEYS, rng.randrange(0, 5))}
        return msgpack.packb({"t": rng.choice(FRAME_TYPES), **fields})
    if kind == 3:  # {"t": "submit", "rid": 1, "spec": [[[...]]]} nested too deep for anyone
        head = b"".join(msgpack.packb(x) for x in ("t", "submit", "rid", 1, "spec"))
        return b"\x83" + head + b"\x91" * rng.randrange(100, 100_000) + b"\x90"
    if kind == 4:  # truncated msgpack
        whole = msgpack.packb({"t": "get_run", "rid": 7, "run": "x" * 50})
        return whole[: rng.randrange(1, len(whole))]
    return msgpack.packb(junk_value(rng))


async def answered(ws: Any, sent: int) -> int:
    """Read until ``sent`` error frames came back (each junk frame gets exactly one)."""
    errors = 0
    with trio.fail_after(60):
        while errors < sent:
            frame = wire.decode_frame(await ws.recv())
            assert isinstance(frame, wire.Error) and not frame.fatal, frame
            errors += 1
    return errors


#: how a client sees the relay refuse a message over its size cap: 1009 ("message too big"), or,
#: when the relay closed its socket with the rest of the payload unread and the kernel answered
#: with a reset that took the close frame with it, 1006. Either way that connection (only) is gone:
#: the session beside it is checked to go on.
TOO_BIG = (1009, 1006)


async def fuzz_relay(
    url: str, token: str, decoy: str, rng: random.Random, tally: dict[str, int]
) -> None:
    # 1. junk instead of a hello: refused and closed, one connection each
    for _ in range(300):
        async with connect(url, compression=None) as ws:
            # the relay may close before it has all of a big junk frame: the send fails then
            with trio.fail_after(30), pytest.raises(ConnectionClosed):  # noqa: PT012
                await ws.send(junk_frame(rng))
                while True:
                    frame = wire.decode_frame(await ws.recv())
                    assert isinstance(frame, wire.Error) and frame.fatal
        tally["relay hellos"] += 1

    # 2. junk tokens, many at once: each refused, ever more slowly
    async def bad_token(n: int) -> None:
        async with connect(url, compression=None) as ws:
            forged = f"tthu_{n:016x}_" + "A" * 43
            await ws.send(wire.encode_frame(wire.Hello(role=wire.Role.CONTROL, token=forged)))
            frame = wire.decode_frame(await ws.recv())
            assert isinstance(frame, wire.Error) and frame.code in (
                wire.ErrorCode.UNAUTHORIZED,
                wire.ErrorCode.TOO_MANY_FAILURES,
            )
        tally["relay bad tokens"] += 1

    async with trio.open_nursery() as nursery:
        for n in range(40):
            nursery.start_soon(bad_token, n)
    # 3. junk on an authenticated control connection: every frame answered with an error
    async with connect(url, compression=None, max_size=None) as ws:
        await ws.send(wire.encode_frame(wire.Hello(role=wire.Role.CONTROL, token=token)))
        assert isinstance(wire.decode_frame(await ws.recv()), wire.Welcome)
        for _ in range(10):
            batch = [junk_frame(rng) for _ in range(200)]
            for frame in batch:
                await ws.send(frame)
            tally["relay control junk"] += await answered(ws, len(batch))
    # 4. junk on an IDE connection of another run of the user's
    async with connect(url, compression=None, max_size=None) as ws:
        await ws.send(
            wire.encode_frame(
                wire.Hello(role=wire.Role.IDE, link=wire.IdeLink(), run=decoy, token=token)
            )
        )
        assert isinstance(wire.decode_frame(await ws.recv()), wire.Welcome)
        sent = 0
        for _ in range(1000):
            frame = junk_frame(rng)
            if isinstance(frame, bytes) and frame.startswith(b"\x82\xa1t\xa7publish"):
                continue  # a well-formed publish would be stored (it is the user's own run)
            await ws.send(frame)
            sent += not _silent(frame)
        with trio.fail_after(60):  # deliveries of the decoy's stream may come in between
            errors = 0
            while errors < sent:
                got = wire.decode_frame(await ws.recv())
                if isinstance(got, wire.Error):
                    assert not got.fatal, got
                    errors += 1
        tally["relay ide junk"] += errors
        # 5. over the size cap of a run connection: that connection (only) is closed
        await ws.send(b"\x00" * (wire.MAX_RUN_FRAME_BYTES + 1))
        with trio.fail_after(30), pytest.raises(ConnectionClosed):  # noqa: PT012
            while True:
                await ws.recv()
        assert ws.close_code in TOO_BIG
    # 6. over the cap before any handshake
    async with connect(url, compression=None, max_size=None) as ws:
        await ws.send(b"\x00" * (wire.MAX_HELLO_BYTES + 1))
        with trio.fail_after(30), pytest.raises(ConnectionClosed):  # noqa: PT012
            while True:
                await ws.recv()
        assert ws.close_code in TOO_BIG
    tally["relay oversized"] += 2


def _silent(frame: bytes | str) -> bool:
    """A frame a run connection takes without an answer (a heartbeat, a receipt)."""
    try:
        return isinstance(wire.decode_frame(frame), wire.Heartbeat | wire.Received)
    except wire.WireError:
        return False


def junk_dap(rng: random.Random) -> bytes:
    kind = rng.randrange(8)
    body = b'{"seq": 1, "type": "request", "command": "evaluate", "arguments": ' \
        b'{"expression": "__import__(\'os\')._exit(9)", "context": "repl"}}'  # fmt: skip
    match kind:
        case 0:
            return rng.randbytes(rng.randrange(1, 500))
        case 1:
            return b"Content-Length: 99999999999999\r\n\r\n"
        case 2:
            return b"Content-Length: -5\r\n\r\n{}"
        case 3:
            return b"Content-Length: 10\r\n\r\n{not json}"
        case 4:
            return dap_framing.encode_message(b"[1, 2, 3]")
        case 5:
            return dap_framing.encode_message(body)  # a request, but not an initialize
        case 6:
            return b"X" * 5000 + b"\r\n\r\n"  # a header far over its cap
        case _:
            return b"Content-Length: 3\r\nContent-Length: 4\r\n\r\n{}{}"


async def fuzz_adapter(port: int, rng: random.Random, tally: dict[str, int]) -> None:
    for _ in range(1500):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        try:
            await stream.send_all(junk_dap(rng))
            await stream.send_eof()  # said all it had to say: the adapter must close it now
            with trio.fail_after(30):  # (after an error answer, at most)
                while await stream.receive_some(65536):
                    pass
        except trio.BrokenResourceError:
            pass  # closed before we finished sending: refused all the same
        finally:
            await stream.aclose()
        tally["adapter junk"] += 1
    # over the byte budget of a connection that has not said initialize
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        await stream.send_all(b"Content-Length: 2000000\r\n\r\n" + b" " * 1_100_000)
        with trio.fail_after(30):
            while await stream.receive_some(65536):
                pass
    except trio.BrokenResourceError:
        pass
    finally:
        await stream.aclose()
    tally["adapter oversized"] += 1


async def test_a_debug_session_survives_a_flood_of_junk(tmp_path: Path) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    for f in PROJECT.glob("*.py"):
        (workdir / f.name).write_text(f.read_text())
    home = tmp_path / "home"
    rng = random.Random(20261123)
    tally: dict[str, int] = dict.fromkeys(
        [
            "relay hellos", "relay bad tokens", "relay control junk", "relay ide junk",
            "relay oversized", "adapter junk", "adapter oversized",
        ],
        0,
    )  # fmt: skip
    async with relay_stack(home, workers=1) as (_up, relay):
        owner = Endpoint(relay, token=local_token(home))
        async with open_control(owner) as control:
            fuzz_token, _ = await control.create_token(label="the hostile peer")
        async with debug_run(home, relay, workdir, "python", "app.py") as (debug, _run, port):
            async with open_control(owner) as control:
                decoy_spec = RunSpec(command=["true"], workdir="/decoy", debug=False)
                decoy = (await control.submit(decoy_spec)).id  # ends at once
            async with open_dap_client("127.0.0.1", port) as ide:
                async with ide_session(ide, [bp_args(workdir, "app.py", 11)]):
                    pass
                stopped, frame = await stopped_frame(ide)
                assert frame["line"] == 11
                flooded = trio.Event()

                async def flood() -> None:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(fuzz_relay, relay, fuzz_token, decoy, rng, tally)
                        nursery.start_soon(fuzz_adapter, port, rng, tally)
                    flooded.set()

                evaluations = 0
                async with trio.open_nursery() as nursery:  # the flood, while paused...
                    nursery.start_soon(flood)
                    while not flooded.is_set():  # ...and the session goes on meanwhile
                        got = await ide.request(
                            "evaluate", {"expression": "values", "frameId": frame["id"]}
                        )
                        assert got["success"] and got["body"]["result"] == "[1, 2, 3, 4, 5]"
                        evaluations += 1
                assert evaluations > 10
                await ide.request("setBreakpoints", bp_args(workdir, "app.py"))
                await resume(ide, "continue", stopped["body"]["threadId"])
                exited = await ide.wait_event("exited", timeout=60)
                assert exited["body"]["exitCode"] == 0
            await debug.wait_line(r"ended \(exited, exit code 0\)", timeout=60)
        async with open_control(owner) as control:  # the relay still serves
            assert any(r.id == decoy for r in await control.list_runs())
    assert tally == {
        "relay hellos": 300,
        "relay bad tokens": 40,
        "relay control junk": 2000,
        "relay ide junk": tally["relay ide junk"],
        "relay oversized": 2,
        "adapter junk": 1500,
        "adapter oversized": 1,
    }
    assert tally["relay ide junk"] > 800
