"""The pump's view for the ordering barrier, on a real program's pipes: the mark covers what is still
in the pipe (``FIONREAD``), and is reached once all of it was handed over."""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from worker_shim.program.debuggee import OutputPump, start_plain, terminate_group

#: 50,000 bytes on stdout in one write, then a word on stderr, then it waits to be ended
WRITER = "import os, time\nos.write(1, b'x' * 50000)\nos.write(2, b'written')\ntime.sleep(600)\n"


async def test_the_mark_covers_the_pipe_and_is_reached_once_handed_over(tmp_path: Path) -> None:
    release = trio.Event()
    stdout: list[bytes] = []
    stderr, reading = trio.Event(), trio.Event()

    async def on_output(stream: str, data: bytes) -> None:
        if stream == "stderr":
            stderr.set()
            return
        stdout.append(data)
        reading.set()
        await release.wait()  # the first chunk keeps the stdout pump busy

    process = await start_plain([sys.executable, "-c", WRITER], cwd=str(tmp_path), env={})
    pump = OutputPump(process, str(tmp_path / "log"), on_output)
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump.run)
                await stderr.wait()  # the 50,000 bytes were written before this
                await reading.wait()
                mark = pump.mark()
                assert mark["stdout"] == 50000  # read so far, plus what the pipe still holds
                assert not pump.reached(mark)
                release.set()
                while not pump.reached(mark):
                    await pump.moved()
                assert sum(map(len, stdout)) == 50000
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await terminate_group(process, grace=1)
