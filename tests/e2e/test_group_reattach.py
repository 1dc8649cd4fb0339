"""The IDE goes away while every rank is paused, and comes back: the group is offered again.

The stack of ``test_group_faults.py`` (Redis, relay A for the adapter and relay B for the worker,
each link through a :class:`~faults.proxy.FaultProxy`) runs 4 ranks of
``programs/ranks4_worker.py`` under ``--stop all`` with a breakpoint in rank 2's line. Once every
rank is paused and seen stopped in its own session, the IDE disconnects (detach: the run goes on)
and ``tether debug`` exits (SIGTERM, the user closed the terminal). Optionally relay A is then
SIGKILLed and replaced while no IDE is there, both links cut. A new ``tether attach RUN`` is
served and a new IDE attaches.

Proved: every paused rank is offered again, once; each new session sees its rank's stop replayed
once, on the thread it stopped on before, with the same reason; a continue in one session runs
every rank to its end (each rank's last line printed once, exit codes 0), and each session sees
its stop, its continue and its end, in that order.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path

import pytest
import trio
from stack import Proc, tether
from test_faults import FAST, two_relays
from test_group_faults import RANKS, Storm, configure, duplicated_responses, events
from test_group_faults import outputs as said

from adapter.scripted_ide.dap_client import DapClient, open_dap_client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PROGRAMS = Path(__file__).resolve().parent / "programs"


async def offered_ranks(
    stack: AsyncExitStack, ide: DapClient, ws: Path
) -> tuple[dict[int, DapClient], dict[int, dict[str, object]]]:
    """Answer the IDE's ``startDebugging`` offers until every rank has a session that saw it
    stopped; each rank offered once."""
    ranks: dict[int, DapClient] = {}
    stops: dict[int, dict[str, object]] = {}
    while len(ranks) < RANKS:
        offer = await ide.wait_reverse_request("startDebugging", timeout=120)
        ide.answer(offer)
        config = offer["arguments"]["configuration"]
        connect = config["connect"]
        rank_ide = await stack.enter_async_context(
            open_dap_client(connect["host"], connect["port"])
        )
        await configure(rank_ide, ws, config)
        stopped = await rank_ide.wait_event("stopped", timeout=120)
        rank = int(re.match(r"rank (\d+)", config["name"]).group(1))  # type: ignore[union-attr]
        assert rank not in ranks, f"rank {rank} offered twice"
        ranks[rank] = rank_ide
        stops[rank] = stopped["body"]
        expected = "breakpoint" if rank == 2 else "pause"
        assert stopped["body"]["reason"] == expected, (rank, stopped)
    assert sorted(ranks) == list(range(RANKS))
    return ranks, stops


async def hold(
    process: AbstractAsyncContextManager[Proc], *, task_status: trio.TaskStatus[None]
) -> None:
    async with process:
        task_status.started()
        await trio.sleep_forever()


@pytest.mark.parametrize("relay_sigkill", [False, True], ids=["detach", "detach-relay-sigkill"])
async def test_an_ide_that_detaches_during_a_group_stop_gets_every_rank_back(
    tmp_path: Path, relay_sigkill: bool
) -> None:
    home = tmp_path / "home"
    ws = tmp_path / "ws"
    ws.mkdir()
    for name in ("ranks_launcher.py", "ranks4_worker.py"):
        shutil.copy(PROGRAMS / name, ws / name)
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        relays = await two_relays(tmp_path, home, nursery, stack)
        relay_a, to_a, to_b = relays.relay_a, relays.to_a, relays.to_b
        storm = Storm(stack, home, relays.redis_url, relays.links)
        first = AsyncExitStack()
        debug = await first.enter_async_context(
            tether(
                "debug", "--relay", to_a.url_for("ws"), "--port", "0", "--request-timeout", "120",
                "--stop", "all", "--workdir", str(ws), "--",
                "python", "ranks_launcher.py", str(RANKS), "ranks4_worker.py",
                home=home, name="debug", extra_env=FAST,
            )
        )  # fmt: skip
        run_id = (await debug.wait_line(r"submitted run (\S+):")).group(1)
        m = await debug.wait_line(r"adapter on 127\.0\.0\.1:(\d+)")
        ide = await first.enter_async_context(
            open_dap_client("127.0.0.1", int(m.group(1)), serve={"startDebugging"})
        )
        await configure(ide, ws, {"justMyCode": True, "connect": {"port": 0}})
        worker = tether(
            "worker", "--relay", to_b.url_for("ws"), "--work-dir", str(home / "worker"),
            home=home, name="worker", extra_env=FAST,
        )  # fmt: skip
        await nursery.start(hold, worker)  # outlives the first IDE's stack
        before, stops_before = await offered_ranks(first, ide, ws)

        # the IDE detaches (every session, the run's last), then its adapter exits
        for rank_ide in before.values():
            assert (await rank_ide.request("disconnect", {}, timeout=60))["success"]
        assert (await ide.request("disconnect", {}, timeout=60))["success"]
        os.killpg(debug.process.pid, signal.SIGTERM)
        with trio.fail_after(60):
            await debug.process.wait()
        await first.aclose()
        if relay_sigkill:
            relay_a = await storm.strike(relay_a)

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
        await configure(ide, ws, {"justMyCode": True, "connect": {"port": 0}})
        ranks, stops = await offered_ranks(stack, ide, ws)
        for rank, rank_ide in ranks.items():
            # the stop replayed, once, on the thread the rank stopped on
            assert stops[rank]["threadId"] == stops_before[rank]["threadId"], rank
            assert events(rank_ide, "stopped", "continued") == ["stopped"], rank

        go = await ranks[1].request("continue", {"threadId": stops[1]["threadId"]}, timeout=90)
        assert go["success"], go
        exited = await ide.wait_event("exited", timeout=120)
        assert exited["body"]["exitCode"] == 0, exited
        with trio.fail_after(60):
            while "launcher done" not in said(ide):
                await ide.wait_event("output", timeout=60)
        text = said(ide)
        assert "launcher done, rank exit codes [0, 0, 0, 0]" in text, text
        for rank, rank_ide in ranks.items():
            assert text.count(f"rank {rank} done") == 1, (rank, text)
            await rank_ide.wait_event("terminated", timeout=60)
            seen = events(rank_ide, "stopped", "continued", "terminated")
            assert seen == ["stopped", "continued", "terminated"], (rank, seen)
            assert duplicated_responses(rank_ide) == 0
        assert duplicated_responses(ide) == 0
        offered = [m for m in ide.received if m.get("command") == "startDebugging"]
        assert len(offered) == RANKS
        if relay_sigkill:
            assert storm.injected["relay SIGKILL"] == 1, storm.injected
        await ide.request("disconnect", {"terminateDebuggee": True})
        nursery.cancel_scope.cancel()
