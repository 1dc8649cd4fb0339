"""Worker pools against relay faults, with real processes: a relay SIGKILLed while the pool waits
for work or runs a program, the pool's link cut, and a pool that dies while waiting.

Redis (the bundled server), the relay, `tether worker` and the CLI are each their own process; the
pool reaches the relay through a :class:`~faults.proxy.FaultProxy` (so a restarted relay, on a new
port, is reached at the same address, and the link can be cut). Every run must finish with its
program's exit code and output; the pool must never exit.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest
import trio
from faults.proxy import FaultProxy
from stack import Proc, admin_token, tether
from stack import relay_process as shared_relay_process

from relay.embedded.server import run_embedded_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

RELAY_FLAGS = ("--ping-interval", "0.5", "--ping-timeout", "0.5", "--lease", "60")


def relay_process(
    home: Path, redis: str, name: str
) -> AbstractAsyncContextManager[tuple[Proc, int]]:
    return shared_relay_process(home, redis, name, RELAY_FLAGS, verbose=True)


@asynccontextmanager
async def pool(home: Path, relay: str, name: str) -> AsyncIterator[Proc]:
    async with tether(
        "worker",
        "--relay",
        relay,
        "--name",
        name,
        "--work-dir",
        str(home / name),
        home=home,
        name=name,
        extra_env={"TETHER_PING_INTERVAL": "0.5", "TETHER_PING_TIMEOUT": "0.5"},
    ) as proc:
        await proc.wait_line(r"tether worker: ready")
        yield proc


def kill9(proc: Proc) -> None:
    os.killpg(proc.process.pid, signal.SIGKILL)


async def run_to_end(home: Path, relay: str, workdir: Path, code: str) -> tuple[str, str]:
    """`tether run -f -- python -c CODE`: (run id, its output); the run must exit 0."""
    async with tether(
        "run", "-f", "--relay", relay, "--workdir", str(workdir), "--", "python", "-c", code,
        home=home, name="run",
    ) as cli:  # fmt: skip
        m = await cli.wait_line(r"run (\w+) queued", timeout=60)
        with trio.fail_after(120):
            returncode = await cli.process.wait()
        assert returncode == 0, cli.output
        return m.group(1), cli.output


async def status(home: Path, relay: str, run: str) -> dict[str, object]:
    async with tether("status", run, "--json", "--relay", relay, home=home, name="status") as cli:
        with trio.fail_after(60):
            await cli.process.wait()
        return dict(json.loads(cli.output))


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    (path / "README").write_text("a project\n")
    return path


async def test_a_pool_serves_on_through_relay_kills_and_link_cuts(
    tmp_path: Path, workdir: Path, shared_tmp: Path
) -> None:
    home = tmp_path / "home"
    async with trio.open_nursery() as nursery:
        redis = await nursery.start(_redis, tmp_path / "redis")
        await admin_token(home, redis)
        proxy = FaultProxy("127.0.0.1", 1)
        await nursery.start(proxy.run)
        via = proxy.url_for()
        async with relay_process(home, redis, "relay-1") as (relay1, port):
            proxy.retarget("127.0.0.1", port)
            async with pool(home, via, "p") as workers:
                await relay1.wait_line(r"p-0 \(.*\) waits for a run of local")
                kill9(relay1)  # the relay dies while the pool waits for work
                await workers.wait_line(r"p-0: lost the relay")
                async with relay_process(home, redis, "relay-2") as (relay2, port):
                    proxy.retarget("127.0.0.1", port)
                    await workers.wait_line(r"p-0: back with the relay")
                    first, out = await run_to_end(home, via, workdir, "print('after a relay kill')")
                    assert "after a relay kill" in out
                    await relay2.wait_line(r"p-0 \(.*\) waits for a run of local")
                    assert await proxy.cut() > 0  # the pool's link is cut while it waits
                    second, out = await run_to_end(home, via, workdir, "print('after a cut')")
                    assert "after a cut" in out
                    flag = shared_tmp / "go"  # the program (a uid of its own) looks for it
                    waits = (
                        "import os, time\n"
                        f"while not os.path.exists({str(flag)!r}): time.sleep(0.05)\n"
                        "print('ran through a relay kill')"
                    )
                    outputs: list[str] = []
                    async with trio.open_nursery() as running:
                        done = trio.Event()

                        async def submit() -> None:
                            outputs.append((await run_to_end(home, via, workdir, waits))[1])
                            done.set()

                        running.start_soon(submit)
                        await workers.wait_line(rf"p-0: claimed run (?!{first}|{second})\w+")
                        kill9(relay2)  # the relay dies while the pool runs a program
                        async with relay_process(home, redis, "relay-3") as (_relay3, port):
                            proxy.retarget("127.0.0.1", port)
                            flag.write_text("")
                            with trio.fail_after(120):
                                await done.wait()
                            await workers.wait_count(r"p-0: back with the relay", 2)
                    assert "ran through a relay kill" in outputs[0]
                    assert workers.process.returncode is None, workers.output
                    assert "Traceback" not in workers.output
        nursery.cancel_scope.cancel()


async def test_a_pool_that_died_while_waiting_never_takes_the_next_run(
    tmp_path: Path, workdir: Path
) -> None:
    home = tmp_path / "home"
    async with trio.open_nursery() as nursery:
        redis = await nursery.start(_redis, tmp_path / "redis")
        await admin_token(home, redis)
        async with relay_process(home, redis, "relay") as (relay, port):
            url = f"ws://127.0.0.1:{port}"
            async with pool(home, url, "dead") as dead:
                await relay.wait_line(r"dead-0 \(.*\) waits for a run of local")
                kill9(dead)
                with trio.fail_after(30):
                    await dead.process.wait()
            async with pool(home, url, "alive"):
                await relay.wait_line(r"alive-0 \(.*\) waits for a run of local")
                run, out = await run_to_end(home, url, workdir, "print('served')")
                assert "served" in out
            attempts = (await status(home, url, run))["attempts"]
            assert isinstance(attempts, list)
            (only,) = attempts
            assert only["worker"] == "alive-0" and only["outcome"] == "succeeded"
            waited = only["claimed_at"] - only["queued_at"]
            print(f"queued -> claimed by the healthy pool: {waited * 1000:.0f} ms")
        nursery.cancel_scope.cancel()


async def _redis(data_dir: Path, *, task_status: trio.TaskStatus[str]) -> None:
    async with run_embedded_server(data_dir) as url:
        task_status.started(url)
        await trio.sleep_forever()
