"""Benchmark 11: tunnels into a run (``tether shell``, ``tether port-forward``).

- Keystroke echo: a ``shell`` tunnel into a running plain run; one key is sent, the time until
  the remote terminal's echo of it arrives is one sample (a person types, and waits to see it).
  On loopback, and through the slow-link proxy between the user's side and the relay (what a
  laptop far from the relay has), against the link's own round trip measured the same way (a
  byte echoed by a TCP server through the same proxy): what ``ssh`` to the node would cost.
- Port-forward throughput: ``tether port-forward`` (the CLI) to a server on the worker's
  loopback that sends a blob and closes, against reading the same server directly.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import trio

from protocol_specs.wire import wire
from protocol_specs.wire.tunnels import TunnelSpec
from protocol_specs.wire.wire import TunnelEntry, TunnelLink
from relay.client import Endpoint, RunLink, open_control, open_run_link

from .common import Dist, Stack, ms, tether, verdict
from .delay_proxy import delay_proxy

__all__ = ["run", "section"]

SERVE = """\
import socket, sys
blob = bytes(range(256)) * (int(sys.argv[2]) * 4096)
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
print("serving", flush=True)
while True:
    conn, _ = server.accept()
    with conn:
        conn.sendall(blob)
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def run(
    stack: Stack, tmp: Path, keystrokes: int, mib: int, rtts_ms: tuple[float, ...]
) -> dict[str, Any]:
    workdir = tmp / "tunnels"
    workdir.mkdir()
    (workdir / "serve.py").write_text(SERVE)
    port = _free_port()
    async with tether(
        "run", "--relay", stack.relay, "--workdir", str(workdir), "--",
        "python", "serve.py", str(port), str(mib), home=stack.home, name="tunnels-run",
    ) as submitted:  # fmt: skip
        run_id = (await submitted.wait_line(r"^(\S+)$")).group(1)
    async with tether(
        "logs", run_id, "-f", "--relay", stack.relay, home=stack.home, name="tunnels-logs"
    ) as logs:
        await logs.wait_line("serving", timeout=120)
        echo = {}
        for rtt in rtts_ms:
            echo[f"{rtt:g}"] = await _echo(stack, run_id, rtt, keystrokes)
        forward = await _throughput(stack, run_id, port, mib)
        async with tether("cancel", run_id, "--relay", stack.relay, home=stack.home) as done:
            await done.process.wait()
    return {"keystrokes": keystrokes, "echo": echo, "forward": forward}


async def _echo(stack: Stack, run_id: str, rtt: float, keystrokes: int) -> dict[str, Dist]:
    """Key-to-echo times through a shell tunnel, and the link's own round trip."""
    relay_port = int(stack.relay.rsplit(":", 1)[1])
    async with delay_proxy(relay_port, rtt_ms=rtt) as port:
        url = Endpoint(f"ws://127.0.0.1:{port}", token=stack.endpoint().token)
        async with open_control(url) as control:
            opened = await control.open_tunnel(run_id, TunnelSpec(kind="shell"))
        async with open_run_link(
            url, link=TunnelLink(tunnel=opened.tunnel), run=opened.run
        ) as link:
            await _shown(link, b"$ ", b"# ")  # the prompt: the shell reads keys now
            times = []
            for i in range(keystrokes):
                key = b"abcdefghij"[i % 10 : i % 10 + 1]
                t0 = time.perf_counter()
                await link.publish(TunnelEntry(op="data", data=key))
                await _shown(link, key)
                times.append(time.perf_counter() - t0)
            await link.publish(TunnelEntry(op="data", data=b"\x15exit\r"))  # Ctrl-U, exit
        floor = await _link_round_trips(rtt, keystrokes)
    return {"tether": Dist(times), "link": Dist(floor)}


async def _shown(link: RunLink, *wanted: bytes) -> None:
    seen = b""
    with trio.fail_after(60):
        async for delivery in link.deliveries:
            entry = wire.decode_entry(delivery.entry)
            if isinstance(entry, TunnelEntry) and entry.op == "data":
                seen += entry.data
                if any(w in seen for w in wanted):
                    return


async def _link_round_trips(rtt: float, n: int) -> list[float]:
    """One byte echoed by a TCP server through the same kind of proxy: the link's own cost."""

    async def echo(stream: trio.SocketStream) -> None:
        async for chunk in stream:
            await stream.send_all(chunk)

    times = []
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, echo, 0)
        server = listeners[0].socket.getsockname()[1]
        async with delay_proxy(server, rtt_ms=rtt) as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                for _ in range(n):
                    t0 = time.perf_counter()
                    await stream.send_all(b"x")
                    await stream.receive_some(1)
                    times.append(time.perf_counter() - t0)
        nursery.cancel_scope.cancel()
    return times


async def _throughput(stack: Stack, run_id: str, port: int, mib: int) -> dict[str, float]:
    """MiB/s reading the server's blob directly and through ``tether port-forward``."""
    direct = await _download(port, mib)
    async with tether(
        "port-forward", run_id, "--relay", stack.relay, f"0:{port}",
        home=stack.home, name="tunnels-forward",
    ) as forward:  # fmt: skip
        local = int((await forward.wait_line(r"forwarding 127\.0\.0\.1:(\d+)")).group(1))
        through = await _download(local, mib)
    return {"mib": mib, "direct_mib_s": direct, "forward_mib_s": through}


async def _download(port: int, mib: int) -> float:
    t0 = time.perf_counter()
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    got = 0
    async with stream:
        while chunk := await stream.receive_some(1 << 20):
            got += len(chunk)
    elapsed = time.perf_counter() - t0
    assert got == mib * 1024 * 1024, f"got {got} bytes of {mib} MiB"
    return mib / elapsed if elapsed else float("inf")


def section(f: dict[str, Any], _n: dict[str, int]) -> list[str]:
    """Section 11 of ``bench/report.md``."""
    when = (
        [
            f"_Measured separately (`./dev bench --only tunnels`, {f['measured']}, same machine)._",
            "",
        ]
        if f.get("measured")
        else []
    )
    rows = [
        "## 11. Tunnels into a run",
        "",
        *when,
        f"Keystroke echo through `tether shell` ({f['keystrokes']} keys, one at a time: key to "
        "its echo by the remote terminal), the user's side behind the slow-link proxy, against "
        "the link's own round trip through the same proxy (a byte echoed by a TCP server: what "
        "`ssh` to the node would cost). Target: at most the link's round trip + 10 ms.",
        "",
        "| link RTT | tether median | p99 | the link's round trip (median) | added | target |",
        "|---|---|---|---|---|---|",
    ]
    for rtt, ways in f["echo"].items():
        ours, link = ways["tether"], ways["link"]
        added = (ours.median - link.median) * 1000
        rows.append(
            f"| {rtt} ms | {ms(ours.median * 1000)} | {ms(ours.p99 * 1000)} "
            f"| {ms(link.median * 1000)} | +{added:.1f} ms | {verdict(added <= 10)} |"
        )
    fw = f["forward"]
    ratio = fw["forward_mib_s"] / fw["direct_mib_s"]
    return [
        *rows,
        "",
        f"`tether port-forward` ({fw['mib']} MiB from a server on the worker's loopback, loopback "
        f"relay): {fw['forward_mib_s']:.1f} MiB/s, against {fw['direct_mib_s']:.0f} MiB/s read "
        f"directly ({ratio:.3f} of it). Every byte goes through Redis Streams (stored, "
        "delivered, then deleted once read), so a forward is for a UI or a file, not a data "
        "pipeline.",
        "",
    ]
