"""``tether exec`` whose start races a relay cut or a relay SIGKILL: each try's command runs once
and the CLI reports its real exit code and output, or it does not run and the CLI says so; never
a "failed" (255) after it ran, never twice (``protocol_specs/wire/tunnel_open.py``).

Real processes: Redis (the bundled server), the CLI's relay (SIGKILLed now and then and replaced
at once by one started beforehand), the worker's relay, a worker pool running a plain run, and
50 ``tether exec`` CLIs, a few at a time, each through a :class:`~faults.proxy.FaultProxy` of its
own, cut at a chosen point around its open:

- ``before``: the proxy holds the ``open_tunnel`` request (the first thing up after the welcome)
  and the link is cut: the relay never saw it;
- ``stored``: the proxy holds the relay's answer (so the relay stored the tunnel and told the
  worker) and the link is cut: the answer is lost;
- ``started``: the command wrote its line and its first output came back; every link is cut,
  the worker's too, before it reads its stdin and ends;
- ``random``: a seeded random moment shortly after the CLI connected (the handshake, the
  request, the tunnel's first connection...);
- ``kill-before`` / ``kill-stored``: as ``before`` / ``stored``, and the relay is SIGKILLed;
- ``unreachable``: no relay answers at all.

Each try's command appends a line to a file of its own: the count of lines is the count of starts.
"""

from __future__ import annotations

import os
import random
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from faults.proxy import Direction, FaultProxy
from stack import TETHER, Proc, admin_token, home_env, tether
from test_faults import FAST, kill9, relay_process

from relay.embedded.server import run_embedded_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TRIES = 50
AT_ONCE = 4
SEED = int(os.environ.get("TETHER_FAULTS_SEED", "1"))
CYCLE = ["before", "stored", "started", "random", "before", "stored", "started", "random"]
WAITS = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"
FAILED = 255


def kind_of(i: int) -> str:
    if i % 10 == 8:
        return "unreachable"
    if i % 10 == 9:
        return "kill-stored" if i % 20 == 9 else "kill-before"
    return CYCLE[i % 10]


@dataclass
class Try:
    i: int
    kind: str
    log: Path
    returncode: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    asked: int = 0  #: connections the CLI made through its proxy
    reached: bool = False  #: the fault's point came, and the fault was injected
    seconds: float = 0.0

    @property
    def code(self) -> int:
        """The command's own exit status."""
        return self.i % 7

    @property
    def argv(self) -> list[str]:
        if self.kind == "started":  # waits, after its first output, for a line on its stdin
            script = f"echo ran >> {self.log}; echo started; read x; echo got $x; exit {self.code}"
        else:
            script = f"echo ran >> {self.log}; echo out-{self.i}; echo err-{self.i} >&2; "
            script += f"exit {self.code}"
        return ["sh", "-c", script]

    @property
    def expected(self) -> tuple[int, bytes, bytes]:
        if self.kind == "started":
            return self.code, b"started\ngot go\n", b""
        return self.code, f"out-{self.i}\n".encode(), f"err-{self.i}\n".encode()

    def verdict(self) -> str:
        """``ran`` or ``did not run``; anything else fails the test, saying why."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        got = (self.returncode, self.stdout, self.stderr)
        where = f"try {self.i} ({self.kind}): {len(lines)} starts, CLI {got!r}"
        assert len(lines) <= 1, f"{where}: the command ran twice"
        if lines:
            assert got == self.expected, f"{where}: it ran, and the CLI said otherwise"
            return "ran"
        assert self.returncode == FAILED, f"{where}: it did not run"
        said = self.stderr.decode()
        assert said.startswith("tether: the command did not run: "), where
        assert said.count("\n") == 1 and "Traceback" not in said, where
        return "did not run"


class Relays:
    """The CLI's relay. :meth:`kill` SIGKILLs it and puts the standby, started beforehand, in its
    place (on another port: every try's proxy is pointed at it); a new standby starts at once."""

    def __init__(self, home: Path, redis: str, nursery: trio.Nursery) -> None:
        self.home, self.redis, self.nursery = home, redis, nursery
        self.proxies: set[FaultProxy] = set()
        self.kills = 0
        self._names = iter(f"relay-{n}" for n in range(100))
        self._standby: trio.MemoryReceiveChannel[tuple[Proc, int]]
        self._ready: trio.MemorySendChannel[tuple[Proc, int]]
        self._ready, self._standby = trio.open_memory_channel(1)
        self._lock = trio.Lock()  # one death at a time

    async def start(self) -> None:
        self.proc, self.port = await self.nursery.start(self._serve, next(self._names))
        self.nursery.start_soon(self._prepare)

    async def kill(self) -> None:
        async with self._lock:
            kill9(self.proc)
            self.kills += 1
            with trio.fail_after(60):
                self.proc, self.port = await self._standby.receive()
            for proxy in self.proxies:
                proxy.retarget("127.0.0.1", self.port)
            self.nursery.start_soon(self._prepare)

    async def _prepare(self) -> None:
        await self._ready.send(await self.nursery.start(self._serve, next(self._names)))

    async def _serve(self, name: str, *, task_status: trio.TaskStatus[tuple[Proc, int]]) -> None:
        async with relay_process(self.home, self.redis, name) as (proc, port):
            task_status.started((proc, port))
            await trio.sleep_forever()


def stall_after_the_welcome(proxy: FaultProxy, direction: Direction) -> None:
    """As the relay's welcome goes down, hold ``direction`` (in place before the CLI can answer
    the welcome): the CLI's request (``up``), or the relay's answer to it (``down``), waits in
    the proxy."""

    def hook(went: Direction, chunk: bytes) -> None:
        if went == "down" and b"welcome" in chunk:
            proxy.on_pass = None
            proxy.stall(direction)

    proxy.on_pass = hook


async def one_try(
    t: Try, home: Path, run_id: str, relays: Relays, worker_proxy: FaultProxy, rng: random.Random
) -> None:
    proxy = FaultProxy("127.0.0.1", relays.port)
    relays.proxies.add(proxy)  # at once: a relay's death retargets it
    started = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        if t.kind == "unreachable":
            proxy.refuse(True)
        held: Direction | None = None
        if t.kind in ("before", "kill-before"):
            held = "up"
        elif t.kind in ("stored", "kill-stored"):
            held = "down"
        if held:
            stall_after_the_welcome(proxy, held)
        begun = time.monotonic()
        process = await trio.lowlevel.open_process(
            [TETHER, "exec", run_id, "--relay", proxy.url_for(), "--", *t.argv],
            stdin=subprocess.PIPE if t.kind == "started" else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**home_env(home), **FAST},
            start_new_session=True,
        )

        async def read_out() -> None:
            assert process.stdout is not None
            async for chunk in process.stdout:
                t.stdout += chunk
                if b"started\n" in t.stdout:
                    started.set()

        async def read_err() -> None:
            assert process.stderr is not None
            async for chunk in process.stderr:
                t.stderr += chunk

        try:
            with trio.fail_after(60):
                async with trio.open_nursery() as pipes:
                    pipes.start_soon(read_out)
                    pipes.start_soon(read_err)
                    async with trio.open_nursery() as faulting:
                        faulting.start_soon(
                            fault, t, proxy, relays, worker_proxy, rng, started, process
                        )
                        t.returncode = await process.wait()
                        # the CLI may end before the fault's point (it found no relay: the one
                        # it reached was just SIGKILLed for another try; it said so)
                        faulting.cancel_scope.cancel()
        finally:
            if process.returncode is None:
                process.kill()
                with trio.CancelScope(shield=True):
                    await process.wait()
            t.asked = proxy.accepted
            t.seconds = time.monotonic() - begun
            relays.proxies.discard(proxy)
            nursery.cancel_scope.cancel()


async def fault(
    t: Try,
    proxy: FaultProxy,
    relays: Relays,
    worker_proxy: FaultProxy,
    rng: random.Random,
    started: trio.Event,
    process: trio.Process,
) -> None:
    """Inject ``t``'s fault at its point of the CLI's run (``t.reached`` once there)."""
    if t.kind in ("before", "stored", "kill-before", "kill-stored"):
        await proxy.wait_held("up" if t.kind.endswith("before") else "down")
        t.reached = True
        if t.kind.startswith("kill"):
            with trio.CancelScope(shield=True):  # whole, or the next tries find no relay
                await relays.kill()  # the relay dies with the request, or its answer, on its way
        await proxy.cut()
        proxy.resume()
    elif t.kind == "started":
        await started.wait()
        t.reached = True
        await proxy.cut()
        await worker_proxy.cut()
        assert process.stdin is not None
        async with process.stdin:
            await process.stdin.send_all(b"go\n")
    elif t.kind == "random":
        await proxy.wait_connections(1)
        await trio.sleep(rng.uniform(0, 0.08))  # a random moment, not a wait for a state
        t.reached = bool(await proxy.cut())


async def test_an_exec_whose_start_races_relay_faults_runs_once_or_says_it_did_not(
    tmp_path: Path, shared_tmp: Path
) -> None:
    home = tmp_path / "home"
    project = tmp_path / "project"
    project.mkdir()
    (project / "waits.py").write_text(WAITS)
    # the commands (as the run's uid, on a root worker) write their lines here
    tries = [Try(i, kind_of(i), shared_tmp / f"{i}.log") for i in range(TRIES)]
    rng = random.Random(SEED)
    async with trio.open_nursery() as nursery:
        redis = await nursery.start(_redis, tmp_path / "redis")
        await admin_token(home, redis)
        relays = Relays(home, redis, nursery)
        await relays.start()
        _, worker_port = await nursery.start(_relay, home, redis)
        worker_proxy = FaultProxy("127.0.0.1", worker_port)
        await nursery.start(worker_proxy.run)
        worker_relay = f"ws://127.0.0.1:{worker_port}"
        async with (
            tether(
                "worker", "--relay", worker_proxy.url_for(), "--work-dir", str(home / "worker"),
                home=home, name="worker", extra_env=FAST,
            ) as pool,
            tether(
                "run", "--relay", worker_relay, "--workdir", str(project), "--",
                "python", "waits.py", home=home, name="run",
            ) as run,
        ):  # fmt: skip
            await pool.wait_line(r"tether worker: ready")
            run_id = (await run.wait_line(r"^(\S+)$")).group(1)
            async with tether("logs", run_id, "-f", "--relay", worker_relay, home=home) as logs:
                await logs.wait_line("up", timeout=120)
            begun = time.monotonic()
            queue = iter(tries)  # in order, AT_ONCE at a time

            async def trying() -> None:
                for t in queue:
                    await one_try(t, home, run_id, relays, worker_proxy, rng)

            async with trio.open_nursery() as tried:
                for _ in range(AT_ONCE):
                    tried.start_soon(trying)
            took = time.monotonic() - begun
            async with tether("cancel", run_id, "--relay", worker_relay, home=home) as cancel:
                await cancel.process.wait()
        nursery.cancel_scope.cancel()
    verdicts = Counter((t.kind, t.reached, t.verdict()) for t in tries)
    print(f"\n{TRIES} tries in {took:.1f} s (seed {SEED}, {relays.kills} relay SIGKILLs):")
    for (kind, reached, verdict), n in sorted(verdicts.items()):
        print(f"  {kind:12} {'faulted' if reached else 'unfaulted':10} {verdict:12} {n}")
    slowest = max(tries, key=lambda t: t.seconds)
    print(f"  slowest: try {slowest.i} ({slowest.kind}) {slowest.seconds:.1f} s")
    # a fault injected after the request went out: the relay came back, and the command ran,
    # asked for again on a new connection
    for t in tries:
        if t.reached and t.kind != "random":
            assert t.verdict() == "ran", (t.i, t.kind, t.stderr)
        if t.reached and t.kind in ("before", "stored", "kill-before", "kill-stored"):
            assert t.asked >= 3, (t.i, t.kind, t.asked)  # the cut one, again, the tunnel's link
        if t.kind == "unreachable":
            assert t.verdict() == "did not run", (t.i, t.stderr)
    # a try whose first connection another try's relay SIGKILL broke never reaches its point
    placed = [t for t in tries if t.kind not in ("random", "unreachable")]
    assert sum(t.reached for t in placed) >= 0.8 * len(placed), [t.i for t in placed]
    assert relays.kills >= 4 and sum(t.reached for t in tries if t.kind == "random") >= 3


async def _redis(data_dir: Path, *, task_status: trio.TaskStatus[str]) -> None:
    async with run_embedded_server(data_dir) as url:
        task_status.started(url)
        await trio.sleep_forever()


async def _relay(home: Path, redis: str, *, task_status: trio.TaskStatus[tuple[Proc, int]]) -> None:
    async with relay_process(home, redis, "worker-relay") as (proc, port):
        task_status.started((proc, port))
        await trio.sleep_forever()
