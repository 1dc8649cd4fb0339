"""What one user may take and how: failed logins slowed down, connections and active runs capped,
big messages refused before the handshake; TLS verified, plain text on loopback only.

Against a live relay (``live_relay.py``) on a real Redis-compatible server over real
WebSockets. Each test names the refusal it pins; each also checks that the refused peer got
nothing and that the relay still serves the others.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import msgpack
import pytest
import trio
import trustme
from live_relay import SPEC, Relay, live_relay, refusal, submitted
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import connect

from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode, IdeLink, Role
from relay.auth import TokenStore
from relay.client import Endpoint, RelayError, open_control, open_run_link
from relay.server import RelayConfig, serve_relay, server_port
from relay.store import Store

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


@pytest.fixture
async def relay(redis_store: Store) -> AsyncIterator[Relay]:
    async with live_relay(redis_store) as r:
        yield r


# --- limits ----------------------------------------------------------------------------------------


async def test_failed_authentications_are_slowed_down_and_good_ones_are_not(
    redis_store: Store,
) -> None:
    config = RelayConfig(auth_free=2, auth_delay=0.05)
    async with live_relay(redis_store, config) as relay:
        codes = [
            (await refusal(relay.bare("tthu_0123456789abcdef_" + "C" * 43))).code for _ in range(4)
        ]
        assert codes == [ErrorCode.UNAUTHORIZED] * 2 + [ErrorCode.TOO_MANY_FAILURES] * 2
        last = await refusal(relay.bare("nope"))
        assert last.code == ErrorCode.TOO_MANY_FAILURES and "waits 0.4 s" in last.message
        async with open_control(relay.alice) as control:  # the same address, a good token
            await control.list_runs()


async def test_connections_per_user_are_capped(redis_store: Store) -> None:
    config = RelayConfig(max_connections=2, max_control_connections=2)
    async with live_relay(redis_store, config) as relay:
        async with open_control(relay.alice), open_control(relay.alice):
            got = await refusal(relay.alice)
            assert got.code == ErrorCode.TOO_MANY_CONNECTIONS
            async with open_control(relay.bob):
                pass  # another user is not affected
        async with open_control(relay.alice):
            pass  # closed ones are counted out


async def test_idle_ide_links_never_lock_the_same_users_control_calls_out(
    redis_store: Store,
) -> None:
    """IDE and logs links are counted apart from control connections: a user whose adapters
    hold every link they may have still gets `tether ls` and `tether cancel`."""
    async with live_relay(redis_store, RelayConfig(max_connections=2)) as relay:
        run = await submitted(relay.alice)
        async with (
            open_run_link(relay.alice, link=IdeLink(), run=run),
            open_run_link(relay.alice, link=IdeLink(), run=run),
        ):
            async with connect(relay.url, compression=None) as ws:
                await ws.send(
                    wire.encode_frame(
                        wire.Hello(
                            role=Role.IDE, link=wire.IdeLink(), run=run, token=relay.alice.token
                        )
                    )
                )
                refused = wire.decode_frame(await ws.recv())
            assert isinstance(refused, wire.Error)
            assert refused.code == ErrorCode.TOO_MANY_CONNECTIONS
            async with open_control(relay.alice) as control:
                assert [r.id for r in await control.list_runs()] == [run]


async def test_active_runs_per_user_are_capped(redis_store: Store) -> None:
    async with live_relay(redis_store, RelayConfig(max_active_runs=2)) as relay:
        async with open_control(relay.alice) as control:
            first = (await control.submit(SPEC)).id
            await control.submit(SPEC)
            with pytest.raises(RelayError) as info:
                await control.submit(SPEC)
            assert info.value.code == ErrorCode.TOO_MANY_RUNS
            await control.cancel(first)
            await control.submit(SPEC)  # room again
        await submitted(relay.bob)  # bob has his own allowance


async def test_a_big_message_before_the_handshake_is_refused(relay: Relay) -> None:
    async with connect(relay.url, compression=None, max_size=None) as ws:
        await ws.send(b"\x00" * (wire.MAX_HELLO_BYTES + 1))
        with trio.fail_after(10), pytest.raises(ConnectionClosed):  # noqa: PT012
            while True:
                await ws.recv()
        assert ws.close_code == 1009
    async with open_control(relay.alice):
        pass


async def test_a_hello_naming_no_token_is_audited_on_the_run_it_tried(relay: Relay) -> None:
    run = await submitted(relay.alice)
    async with connect(relay.url, compression=None) as ws:
        await ws.send(
            msgpack.packb(
                {"t": "hello", "v": 2, "role": "ide", "run": run, "link": {"kind": "ide"}}
            )
        )
        reply = msgpack.unpackb(await ws.recv())
    assert reply["code"] == "unauthorized"
    async with open_control(relay.alice) as control:
        trail = await control.audit(run)
    assert trail[-1].event == "refused" and trail[-1].source.startswith("127.0.0.1:")


# --- transport -------------------------------------------------------------------------------------


async def test_tls_relay_is_verified_by_clients(redis_store: Store, tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    token, _ = await TokenStore(redis_store).create("alice")
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            lambda task_status: serve_relay(
                redis_store, port=0, ssl=context, task_status=task_status
            )
        )
        url = f"wss://localhost:{server_port(server)}"
        async with open_control(Endpoint(url, token=token, ca_file=str(ca_file))) as control:
            assert control.user == "alice"
        with pytest.raises(RelayError) as info:
            async with open_control(Endpoint(url, token=token)):  # the system CAs do not know it
                pass
        assert info.value.code == "tls" and "certificate" in info.value.message
        nursery.cancel_scope.cancel()


def test_a_plain_text_relay_refuses_to_listen_beyond_loopback() -> None:
    tether = str(Path(sys.executable).with_name("tether"))
    out = subprocess.run(
        [tether, "relay", "--host", "0.0.0.0", "--port", "0", "--redis", "redis://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode != 0
    assert "refusing to serve plain ws:// on 0.0.0.0" in out.stderr and "--insecure" in out.stderr
    half = subprocess.run(
        [tether, "relay", "--tls-cert", "cert.pem", "--redis", "redis://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert half.returncode != 0 and "--tls-cert and --tls-key go together" in half.stderr
