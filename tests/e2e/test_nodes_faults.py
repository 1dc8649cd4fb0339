"""Fault injection over two nodes: nothing lost, duplicated or reordered, per process, per node.

The stack of ``test_faults.py`` (Redis, relay A, relay B; every link through its own
:class:`~faults.proxy.FaultProxy`) with a run over two nodes, each a network namespace of its own
(``tests/netns.py``). The pool runs on node 0 (``--nodes 2``) and starts node 1's worker through
its ``--node-via`` prefix, behind ``node_relay.py`` so that node 1's link goes through a proxy of
its own::

    adapter ── to_a ──> relay A <── to_n1 ── node 1's worker  (namespace 1)
                        relay B <── to_n0 ── node 0's worker  (namespace 0, the pool)

Both nodes run ``probe.py``: a main process and its child on each node, four debugged processes
(roles ``main0``, ``child0``, ``main1``, ``child1``), each in its own session (node 0's main in
the IDE's first one; the others offered by ``startDebugging`` when they stop). Their scripted
sessions run at once while :class:`~test_faults.Chaos` cuts, resets and stalls the three links
independently; midway relay A (the adapter's and node 1's) is SIGKILLed and replaced. Every
process's numbered evaluations and numbered output lines are then audited as in ``test_faults``.

Then the IDE detaches with every process paused and ``tether debug`` exits; relay B (node 0's)
is SIGKILLed and replaced while no IDE is there; ``tether attach RUN`` and a new IDE: every paused
process on both nodes is offered again once, its stop replayed once on the thread it stopped on,
and its session goes on where the last one left (its numbered evaluations continue, in order).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import sys
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from faults.proxy import FaultProxy
from netns import Nodes, open_nodes
from stack import Proc, admin_token, tether
from test_faults import (
    FAST,
    PROBE,
    SEED,
    Chaos,
    Redis,
    Session,
    both,
    configure,
    kill9,
    offers,
    relay_process,
)
from test_group_faults import duplicated_responses, events

from adapter.scripted_ide.dap_client import DapClient, open_dap_client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NODE_RELAY = Path(__file__).resolve().parent / "node_relay.py"
ROLES = ("main0", "child0", "main1", "child1")
#: rounds of each session's script between two relay SIGKILLs
ROUNDS = 10


class RoundRobinChaos(Chaos):
    """:class:`~test_faults.Chaos` whose faults take the links in turn (each node's link is hit
    as often as the adapter's, whatever the timing), each fault still chosen at random."""

    def __init__(self, seed: int, proxies: dict[str, FaultProxy]) -> None:
        super().__init__(seed, proxies)
        self._turn = 0
        self._choose = self.random.choice

        def choose(options: Any) -> Any:
            if list(options) == sorted(self.proxies):
                self._turn += 1
                return options[self._turn % len(options)]
            return self._choose(options)

        self.random.choice = choose  # type: ignore[method-assign]


@dataclass
class NodeRelays:
    """Relay A (the adapter's and node 1's) and relay B (node 0's) on one Redis, each link
    through its own proxy; the nodes' proxies listen on the bridge."""

    redis_url: str
    relay_a: Proc
    relay_b: Proc
    to_a: FaultProxy
    to_n0: FaultProxy
    to_n1: FaultProxy
    home: Path
    count: int = 2

    @property
    def links(self) -> dict[str, FaultProxy]:
        return {"adapter-relay": self.to_a, "node0-relay": self.to_n0, "node1-relay": self.to_n1}

    async def replace(self, nursery: trio.Nursery, relay: Proc, *proxies: FaultProxy) -> Proc:
        """SIGKILL ``relay``, start a new one on the same Redis, point ``proxies`` at it."""
        kill9(relay)
        self.count += 1
        new, port = await nursery.start(
            hold, relay_process(self.home, self.redis_url, f"relay-{self.count}")
        )
        for proxy in proxies:
            proxy.retarget("127.0.0.1", port)
        return new


async def hold(
    context: AbstractAsyncContextManager[Any], *, task_status: trio.TaskStatus[Any]
) -> None:
    """``context`` entered in a task of its own (it outlives the stacks opened after it)."""
    async with context as value:
        task_status.started(value)
        await trio.sleep_forever()


async def node_relays(
    tmp_path: Path, home: Path, nodes: Nodes, nursery: trio.Nursery, stack: AsyncExitStack
) -> NodeRelays:
    redis = Redis(tmp_path / "redis")
    redis_url = await nursery.start(redis.run)
    await admin_token(home, redis_url)
    relay_a, port_a = await stack.enter_async_context(relay_process(home, redis_url, "relay-a"))
    relay_b, port_b = await stack.enter_async_context(relay_process(home, redis_url, "relay-b"))
    to_a = FaultProxy("127.0.0.1", port_a)
    to_n0 = FaultProxy("127.0.0.1", port_b, listen=nodes.bridge_address)
    to_n1 = FaultProxy("127.0.0.1", port_a, listen=nodes.bridge_address)
    for proxy in (to_a, to_n0, to_n1):
        await nursery.start(proxy.run)
    return NodeRelays(redis_url, relay_a, relay_b, to_a, to_n0, to_n1, home)


async def offered_sessions(
    stack: AsyncExitStack, ide: DapClient, probe: Path, count: int
) -> dict[str, tuple[Session, dict[str, Any], dict[str, Any]]]:
    """Answer ``count`` ``startDebugging`` offers as VS Code does; each offered process's
    session stopped at the breakpoint, by its role: (session, offered configuration, the
    ``stopped`` event's body). Each process is offered once."""
    found: dict[str, tuple[Session, dict[str, Any], dict[str, Any]]] = {}
    for _ in range(count):
        offer = await ide.wait_reverse_request("startDebugging", timeout=120)
        ide.answer(offer)
        config = offer["arguments"]["configuration"]
        connect = config["connect"]
        kid = await stack.enter_async_context(open_dap_client(connect["host"], connect["port"]))
        await configure(kid, probe, config)
        session = Session(kid, "?")
        await session.stop()
        stopped = next(m for m in kid.received if m.get("event") == "stopped")
        session.role = (await session.evaluate("ROLE")).strip("'\"")
        assert session.role not in found, f"{session.role} offered twice"
        found[session.role] = (session, config, stopped["body"])
    return found


def lines_of(clients: list[DapClient], role: str) -> list[int]:
    """The numbers of ``role``'s ``tseq`` lines among the ``output`` events of ``clients``."""
    return [
        int(m.group(1))
        for client in clients
        for msg in client.received
        if msg.get("type") == "event" and msg.get("event") == "output"
        for m in re.finditer(rf"tseq {role} (\d+)", msg["body"].get("output", ""))
    ]


def audit(clients: list[DapClient], session: Session, seen: list[int]) -> dict[str, int]:
    """Lost, duplicated and reordered messages of one process, both ways (``test_faults``'s
    audit, its output looked for in every session: each node's output reaches the IDE once)."""
    lost = len(set(range(session.sent)) - set(seen))
    duplicated = len(seen) - len(set(seen))
    reordered = sum(1 for a, b in itertools.pairwise(seen) if b < a)
    lines = lines_of(clients, session.role)
    lost += len(set(range(session.flooded)) - set(lines))
    duplicated += len(lines) - len(set(lines))
    reordered += sum(1 for a, b in itertools.pairwise(lines) if b < a)
    duplicated += duplicated_responses(session.ide)
    return {"lost": lost, "duplicated": duplicated, "reordered": reordered}


async def test_two_nodes_lose_duplicate_or_reorder_nothing_under_faults_and_reattach(
    tmp_path: Path, netns_ok: None
) -> None:
    home = tmp_path / "home"
    probe = tmp_path / "probe"
    probe.mkdir()
    # the same probe, its role tagged with its node (the line count kept: the breakpoint's line)
    text = (PROBE / "probe.py").read_text()
    role = 'ROLE = sys.argv[1] if len(sys.argv) > 1 else "main"'
    assert role in text
    tagged = f'{role.replace("ROLE = ", "ROLE = (")}) + os.environ["TETHER_NODE"]'
    starts_child = 'if ROLE == "main":'
    assert starts_child in text
    text = text.replace(starts_child, 'if ROLE.startswith("main"):')
    (probe / "probe.py").write_text(text.replace(role, tagged))
    with open_nodes(2) as nodes:
        async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
            relays = await node_relays(tmp_path, home, nodes, nursery, stack)
            to_a, to_n0, to_n1 = relays.to_a, relays.to_n0, relays.to_n1
            chaos = RoundRobinChaos(SEED, relays.links)
            first = AsyncExitStack()  # the first IDE's, closed when it detaches
            stack.push_async_exit(first)
            debug = await first.enter_async_context(
                tether(
                    "debug", "--relay", to_a.url_for("ws"), "--port", "0",
                    "--request-timeout", "120", "--nodes", "2", "--workdir", str(probe), "--",
                    "python", "probe.py", home=home, name="debug", extra_env=FAST,
                )
            )  # fmt: skip
            run_id = (await debug.wait_line(r"submitted run (\S+):")).group(1)
            m = await debug.wait_line(r"adapter on 127\.0\.0\.1:(\d+)")
            ide = await first.enter_async_context(
                open_dap_client("127.0.0.1", int(m.group(1)), serve={"startDebugging"})
            )
            await configure(ide, probe)
            via = [*nodes.prefix(1), sys.executable, str(NODE_RELAY), to_n1.url_for("ws")]
            pool = await nursery.start(
                hold,
                tether(
                    "-v", "worker", "--relay", to_n0.url_for("ws"), "--slots", "1",
                    "--work-dir", str(home / "worker"), "--no-isolation",
                    "--nodes", "2", "--node-via", " ".join(via),
                    home=home, name="pool", prefix=nodes.prefix(0), extra_env=FAST,
                )
            )  # fmt: skip
            try:
                main = Session(ide, "main0")
                await main.stop()
                assert (await main.evaluate("ROLE")).strip("'\"") == "main0"
                offered = await offered_sessions(first, ide, probe, 3)
                assert sorted(offered) == sorted(ROLES[1:]), sorted(offered)
                sessions = {"main0": main, **{role: s for role, (s, _, _) in offered.items()}}
                nursery.start_soon(chaos.run)
                await both(list(sessions.values()), ROUNDS)
                # relay A (the adapter's and node 1's) dies without a goodbye
                relays.relay_a = await relays.replace(nursery, relays.relay_a, to_a, to_n1)
                chaos.injected["relay SIGKILL"] += 1
                await both(list(sessions.values()), ROUNDS)
                chaos.enabled = False
                for proxy in relays.links.values():
                    proxy.resume()
                clients = [s.ide for s in sessions.values()]
                counts = {}
                seen_before = {}
                for role, session in sessions.items():
                    seen = json.loads((await session.evaluate("check()")).strip("'\""))
                    seen_before[role] = seen
                    counts[role] = audit(clients, session, seen)
                faults = dict(chaos.injected)
                print(f"\ntwo nodes under faults (seed {SEED}), 4 processes; faults {faults}")
                for role, session in sessions.items():
                    print(
                        f"  {role}: {session.requests} requests, {session.sent} numbered "
                        f"evaluations, {session.flooded} numbered output lines; {counts[role]}"
                    )
                assert sum(faults.values()) >= 10, faults
                for link in relays.links:  # each node's link was hit on its own
                    assert any(fault.startswith(link) for fault in faults), (link, faults)
                clean = {"lost": 0, "duplicated": 0, "reordered": 0}
                assert counts == dict.fromkeys(ROLES, clean), counts
                # each of the three other processes offered once, nothing else
                assert len(offers(ide)) == 3
                threads = {role: s.thread for role, s in sessions.items()}

                # the IDE detaches with every process paused; its adapter exits
                for role in ROLES[1:]:
                    assert (await sessions[role].ide.request("disconnect", {}, timeout=60))[
                        "success"
                    ]
                assert (await ide.request("disconnect", {}, timeout=60))["success"]
                os.killpg(debug.process.pid, signal.SIGTERM)
                with trio.fail_after(60):
                    await debug.process.wait()
                await first.aclose()
                # relay B (node 0's) dies while no IDE is there
                for proxy in relays.links.values():
                    await proxy.cut()
                relays.relay_b = await relays.replace(nursery, relays.relay_b, to_n0)

                attach = await stack.enter_async_context(
                    tether(
                        "attach", run_id, "--relay", to_a.url_for("ws"), "--port", "0",
                        "--request-timeout", "120", home=home, name="attach", extra_env=FAST,
                    )
                )  # fmt: skip
                m = await attach.wait_line(r"adapter on 127\.0\.0\.1:(\d+)")
                ide = await stack.enter_async_context(
                    open_dap_client("127.0.0.1", int(m.group(1)), serve={"startDebugging"})
                )
                await configure(ide, probe)
                again = Session(ide, "main0")
                await again.stop()
                assert again.thread == threads["main0"]
                offered = await offered_sessions(stack, ide, probe, 3)
                assert sorted(offered) == sorted(ROLES[1:]), sorted(offered)
                resumed = {"main0": again, **{role: s for role, (s, _, _) in offered.items()}}
                for role, session in resumed.items():
                    # the stop replayed once, on the thread it stopped on; nothing lost meanwhile
                    assert session.thread == threads[role], role
                    assert events(session.ide, "stopped", "continued") == ["stopped"], role
                    seen = json.loads((await session.evaluate("check()")).strip("'\""))
                    assert seen == seen_before[role], role
                    session.sent = sessions[role].sent
                    session.flooded = sessions[role].flooded
                await both(list(resumed.values()), 3)
                for role, session in resumed.items():
                    seen = json.loads((await session.evaluate("check()")).strip("'\""))
                    assert seen == list(range(session.sent)), role
                    assert duplicated_responses(session.ide) == 0, role
                assert len(offers(ide)) == 3
            except BaseException:
                print("the pool said:", pool.output, "the debug said:", debug.output, sep="\n")
                print("relay A said:", relays.relay_a.output[-5000:], sep="\n")
                for role, session in locals().get("sessions", {}).items():
                    answered = sorted(
                        m["request_seq"]
                        for m in session.ide.received
                        if m.get("type") == "response"
                    )
                    print(
                        "session",
                        role,
                        "last seq",
                        session.ide._seq,
                        "answered up to",
                        answered[-3:],
                        "missing",
                        sorted(set(range(1, session.ide._seq + 1)) - set(answered)),
                        session.ide.closed_because,
                    )
                raise
            await ide.request("disconnect", {"terminateDebuggee": True})
            nursery.cancel_scope.cancel()
