"""Many short runs through relay SIGKILLs and a Redis restart: every run succeeds, exactly once.

Redis (the bundled server, append-only file), two relays (``tether relay``), a two-slot worker pool
(``tether worker``) and eight concurrent clients (in this process, over real WebSockets, as
``tether run -f`` does: submit, then follow the run's logs to its end). The pool and the clients
reach the relays through fault proxies (:class:`~faults.proxy.FaultProxy`), retargeted to a live
relay when one is killed, so the pool's claims flow on through each fault. As runs finish, the faults come:

1. the pool's relay is SIGKILLed (and replaced) right after it recorded two claims whose answers
   are still on their way (held in the stalled proxy, then cut): the report's "lost, though no
   worker ever started it". Those claims must go back to the queue at the same attempt
   (``protocol_specs/runs/claims.py``), then run once;
2. Redis is restarted from its append-only file;
3. the other relay, which the pool and the clients use by then, is SIGKILLed (and replaced) at
   whatever moment it is in.

Each program appends its run's name to one file (one line per execution) and prints it. The check:
every run ``succeeded`` at attempt 1, its name is in the file exactly once, and its output is in
its logs. Submissions wait while a fault is injected (a submit cut short by its relay's death is
another matter: the relay writes the run's record before its queue entry); the runs already
queued, claimed and running do not.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from faults.proxy import FaultProxy
from stack import Proc, admin_token, tether
from stack import relay_process as shared_relay_process
from test_faults import Redis

from adapter.config import profile_token
from protocol_specs.runs.runs import RunRecord, RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire import wire
from protocol_specs.wire.wire import IdeLink
from relay.client import Endpoint, RelayError, follow_logs, open_control, open_run_link

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

RUNS = int(os.environ.get("TETHER_LOAD_RUNS", "200"))
CLIENTS = 8
#: runs whose claims' answers the first fault loses
LOST = ("lost-0", "lost-1")
#: a claim nobody confirms goes back after 2 s (and the next sweep, at most ~0.7 s later); the
#: lease is the default's: on a loaded machine a worker's links can stay down through the relay
#: kills and the Redis restart for over 30 s, and a worker silent past its lease is lost by
#: design (its run was lost here once in CI, a run that had run), which is not what this tests
RELAY_FLAGS = (
    "--ping-interval", "0.5", "--ping-timeout", "0.5", "--lease", "90", "--claim-confirm", "2",
)  # fmt: skip
FAST = {"TETHER_PING_INTERVAL": "0.5", "TETHER_PING_TIMEOUT": "0.5"}
#: the program: one line per execution in the shared file, then its output
PROGRAM = (
    "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n'); print('hello', sys.argv[2])"
)


def relay_process(
    home: Path, redis: str, name: str
) -> AbstractAsyncContextManager[tuple[Proc, int]]:
    return shared_relay_process(home, redis, name, RELAY_FLAGS, verbose=True)


class Relays:
    """Two relay processes, each replaceable: ``kill`` SIGKILLs one and starts its successor."""

    def __init__(self, home: Path, redis: str, nursery: trio.Nursery) -> None:
        self.home, self.redis, self.nursery = home, redis, nursery
        self.procs: dict[str, Proc] = {}
        self.ports: dict[str, int] = {}
        self.started = 0

    async def start(self, slot: str) -> None:
        self.started += 1
        name = f"relay-{slot}{self.started}"

        async def serve(task_status: trio.TaskStatus[tuple[Proc, int]]) -> None:
            async with relay_process(self.home, self.redis, name) as (proc, port):
                task_status.started((proc, port))
                await trio.sleep_forever()

        self.procs[slot], self.ports[slot] = await self.nursery.start(serve)

    async def kill(self, slot: str) -> None:
        """SIGKILL it (its successor is started by :meth:`start`)."""
        proc = self.procs[slot]
        os.killpg(proc.process.pid, signal.SIGKILL)
        with trio.fail_after(30):
            await proc.process.wait()


class Gate:
    """Submissions pass while it is open; :meth:`closed` waits for those under way to finish."""

    def __init__(self) -> None:
        self.open = True
        self.under_way = 0
        self.passed = 0
        self.changed = trio.Condition()

    @asynccontextmanager
    async def passing(self) -> AsyncIterator[None]:
        async with self.changed:
            while not self.open:
                await self.changed.wait()
            self.under_way += 1
            self.passed += 1
        try:
            yield
        finally:
            async with self.changed:
                self.under_way -= 1
                self.changed.notify_all()

    @asynccontextmanager
    async def closed(self) -> AsyncIterator[None]:
        async with self.changed:
            self.open = False
            while self.under_way:
                await self.changed.wait()
        try:
            yield
        finally:
            async with self.changed:
                self.open = True
                self.changed.notify_all()


class Progress:
    """How many runs ended; waits for a number of them."""

    def __init__(self) -> None:
        self.ended = 0
        self.changed = trio.Condition()

    async def one_ended(self) -> None:
        async with self.changed:
            self.ended += 1
            self.changed.notify_all()

    async def reached(self, count: int) -> None:
        async with self.changed:
            while self.ended < count:
                await self.changed.wait()


async def claimed(via: Endpoint, run: str) -> None:
    """Until ``run``'s ``claimed`` status is in its ``to_ide`` stream."""
    async with open_run_link(via, link=IdeLink(), run=run) as ide:
        async for delivery in ide.deliveries:
            entry = wire.decode_entry(delivery.entry)
            if isinstance(entry, wire.StatusEntry) and entry.event == StatusEvent.CLAIMED:
                return


def spec_of(name: str, ran: Path) -> RunSpec:
    """A plain run (no debugger, not debuggable: the quickest start) of :data:`PROGRAM`."""
    command = ["python", "-c", PROGRAM, str(ran), name]
    return RunSpec(command=command, workdir="/w", debug=False, debuggable=False, name=name)


async def retrying(call: Callable[[], Awaitable[Any]]) -> Any:
    """``call()`` again while the relay it reaches is being replaced (nothing here submits)."""
    for _ in range(60):
        try:
            return await call()
        except RelayError as exc:
            if exc.code not in ("unreachable", "internal"):
                raise
        await trio.sleep(0.5)  # a relay's restart: nothing to wait on from here
    raise AssertionError("the relays stayed out of reach")


async def test_hundreds_of_runs_through_relay_kills_and_a_redis_restart_run_once_each(
    tmp_path: Path, shared_tmp: Path
) -> None:
    home = tmp_path / "home"
    ran = shared_tmp / "ran.txt"  # every program appends to it (each run a uid of its own)
    ran.touch()
    ran.chmod(0o666)
    gate, progress = Gate(), Progress()
    outputs: dict[str, bytes] = {}
    records: dict[str, RunRecord] = {}
    faults: list[str] = []
    began = time.monotonic()
    async with trio.open_nursery() as nursery:
        redis = Redis(tmp_path / "redis")
        url = await nursery.start(redis.run)
        await admin_token(home, url)
        relays = Relays(home, url, nursery)
        await relays.start("a")
        await relays.start("b")
        pool_proxy, client_proxy = FaultProxy("127.0.0.1", 1), FaultProxy("127.0.0.1", 1)
        await nursery.start(pool_proxy.run)
        await nursery.start(client_proxy.run)
        pool_proxy.retarget("127.0.0.1", relays.ports["a"])
        client_proxy.retarget("127.0.0.1", relays.ports["b"])
        via = Endpoint(client_proxy.url_for(), token=profile_token(path=home / "config.toml"))
        async with tether(
            "worker", "--relay", pool_proxy.url_for(), "--slots", "2", "--name", "pool",
            "--work-dir", str(home / "pool"), home=home, name="pool", extra_env=FAST,
        ) as pool:  # fmt: skip
            await pool.wait_line(r"tether worker: ready")

            async def finish(name: str, run: str) -> None:
                """Follow the run's logs to its end (from the start again if cut short), then
                note its record."""
                entries: list[Any] = []

                async def follow() -> None:
                    entries.clear()
                    await follow_logs(via, run, entries.append)

                async def get() -> RunRecord:
                    async with open_control(via) as control:
                        return await control.get_run(run)

                await retrying(follow)
                outputs[name] = b"".join(e.data for e in entries if isinstance(e, wire.LogEntry))
                records[name] = await retrying(get)
                await progress.one_ended()

            async def client(number: int) -> None:
                for i in range(number, RUNS, CLIENTS):
                    name = f"load-{i}"
                    async with gate.passing(), open_control(via) as control:
                        run = (await control.submit(spec_of(name, ran))).id
                    await finish(name, run)

            def claims_made(slot: str) -> int:
                return sum(1 for line in pool.lines if f"{slot}: claimed run" in line)

            async def lose_two_answers(load: trio.Nursery) -> None:
                """Both slots wait on relay A (the queue drained); two runs come; relay A records
                their claims and answers into the stalled proxy; then it dies, and the proxy's
                links with it (the answers in them are lost)."""
                await progress.reached(gate.passed)
                for slot in ("pool-0", "pool-1"):
                    waits = rf"{slot} \(.*\) waits for a run of local"
                    await relays.procs["a"].wait_count(waits, claims_made(slot) + 1)
                pool_proxy.stall()
                async with open_control(via) as control:
                    runs = [(await control.submit(spec_of(name, ran))).id for name in LOST]
                for run in runs:
                    await claimed(via, run)
                await relays.kill("a")
                await pool_proxy.cut()
                pool_proxy.retarget("127.0.0.1", relays.ports["b"])
                pool_proxy.resume()
                for name, run in zip(LOST, runs, strict=True):
                    load.start_soon(finish, name, run)
                await relays.start("a")

            async def inject(load: trio.Nursery) -> None:
                await progress.reached(RUNS // 5)
                async with gate.closed():
                    await lose_two_answers(load)
                    faults.append(
                        f"SIGKILL the pool's relay with two claims' answers on their way, after "
                        f"{progress.ended} runs"
                    )
                await progress.reached(RUNS * 9 // 20)
                async with gate.closed():
                    await redis.restart()
                    faults.append(f"restart Redis after {progress.ended} runs")
                await progress.reached(RUNS * 7 // 10)
                async with gate.closed():  # the other one, which the pool and clients now use
                    pool_proxy.retarget("127.0.0.1", relays.ports["a"])
                    client_proxy.retarget("127.0.0.1", relays.ports["a"])
                    await relays.kill("b")
                    faults.append(
                        f"SIGKILL the pool's and clients' relay after {progress.ended} runs"
                    )
                    await relays.start("b")

            with trio.fail_after(240):
                async with trio.open_nursery() as load:
                    load.start_soon(inject, load)
                    for number in range(CLIENTS):
                        load.start_soon(client, number)
            assert pool.process.returncode is None, pool.output
            assert "Traceback" not in pool.output
        nursery.cancel_scope.cancel()
    wall = time.monotonic() - began

    assert len(faults) == 3, faults
    executions = Counter(ran.read_text().split())
    names = [f"load-{i}" for i in range(RUNS)] + list(LOST)
    twice = {name: n for name, n in executions.items() if n != 1}
    assert not twice, f"runs that ran more than once: {twice}"
    assert sorted(executions) == sorted(names), "runs that never ran"
    ended = Counter(record.state for record in records.values())
    assert ended == {RunState.SUCCEEDED: len(names)}, ended
    assert all(r.attempt == 1 and len(r.attempts) == 1 for r in records.values())
    missing = [name for name in names if f"hello {name}".encode() not in outputs[name]]
    assert not missing, f"runs without their output in their logs: {missing[:5]}"
    released = sum(r.attempts[-1].released for r in records.values())
    # the two claims whose answers were lost went back to the queue once each, same attempt
    assert [records[name].attempts[-1].released for name in LOST] == [1, 1], records
    print(
        f"\n{len(names)} runs from {CLIENTS} clients, 2 relays, a 2-slot pool in {wall:.1f} s: "
        f"{ended[RunState.SUCCEEDED]} succeeded, each ran once; faults: {'; '.join(faults)}; "
        f"claims whose answer was lost and that went back to the queue: {released}",
        file=sys.stderr,
    )
