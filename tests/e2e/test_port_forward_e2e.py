"""``tether port-forward RUN [LOCAL:]REMOTE``: local ports to ports of the worker's loopback,
through the relay, like ``ssh -L``. Real processes: ``tether up``'s relay and Redis, a worker
pool whose run serves HTTP on the worker's loopback, the CLI; parallel downloads through the
forward are checked by digest, and a port nothing listens on is said."""

from __future__ import annotations

import hashlib
import os
import re
import socket
from pathlib import Path

import pytest
import trio
from stack import relay_stack, tether, worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _get(port: int, path: str) -> bytes:
    """An HTTP/1.0 GET through the forward: the body."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200"), head[:100]
    return body


async def test_parallel_downloads_through_a_forwarded_port(tmp_path: Path) -> None:
    home = tmp_path / "home"
    workdir = tmp_path / "project"
    workdir.mkdir()
    blobs = {f"blob{i}.bin": os.urandom(1_000_000 + i) for i in range(6)}
    for name, data in blobs.items():
        (workdir / name).write_bytes(data)
    remote = _free_port()
    (workdir / "serve.py").write_text(
        "import http.server\nprint('serving', flush=True)\n"
        "http.server.test(HandlerClass=http.server.SimpleHTTPRequestHandler, "
        f"port={remote}, bind='127.0.0.1')\n"
    )
    async with relay_stack(home) as (_up, relay), worker(home, relay):
        async with tether(
            "run", "--relay", relay, "--workdir", str(workdir), "--", "python", "serve.py",
            home=home, name="run",
        ) as run:  # fmt: skip
            run_id = (await run.wait_line(r"^(\S+)$")).group(1)
        async with tether("logs", run_id, "-f", "--relay", relay, home=home, name="logs") as logs:
            await logs.wait_line("serving", timeout=120)
            async with tether(
                "port-forward", run_id, "--relay", relay, f"0:{remote}", f"0:{_free_port()}",
                home=home, name="forward",
            ) as forward:  # fmt: skip
                said = r"forwarding 127\.0\.0\.1:(\d+) to port (\d+)"
                await forward.wait_count(said, 2)
                ports = {int(r): int(loc) for loc, r in re.findall(said, forward.output)}
                local = ports.pop(remote)
                [(_closed, elsewhere)] = ports.items()
                got: dict[str, bytes] = {}

                async def download(name: str) -> None:
                    got[name] = await _get(local, f"/{name}")

                with trio.fail_after(120):
                    async with trio.open_nursery() as nursery:
                        for name in blobs:
                            nursery.start_soon(download, name)
                assert {n: hashlib.sha256(d).hexdigest() for n, d in got.items()} == {
                    n: hashlib.sha256(d).hexdigest() for n, d in blobs.items()
                }
                # a port nothing listens on, on the worker: the connection ends, and it is said
                stream = await trio.open_tcp_stream("127.0.0.1", elsewhere)
                async with stream:
                    with trio.fail_after(30):
                        assert await stream.receive_some(10) == b""
                await forward.wait_line(r"nothing accepts connections on port \d+ of the worker")
            async with tether("audit", run_id, "--relay", relay, home=home, name="audit") as audit:
                await audit.process.wait()
            assert len(re.findall(rf"forward {remote}", audit.output)) == len(blobs)
            async with tether("cancel", run_id, "--relay", relay, home=home, name="cancel") as c:
                await c.process.wait()
