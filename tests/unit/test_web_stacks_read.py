"""``relay/web/stacks.py`` on the in-memory store, the worker played by the test: the relay's own
``stacks`` tunnel (its control entry in ``to_worker``, the answer read from the tunnel's ``down``
stream), joined with the record read after the stacks; and every way it says why not, in one
line: a run that is not running, a worker that fails or says nothing, an answer that is not
stacks. (Over real HTTP with the real worker: ``tests/integration/test_web_stacks.py``.)"""

from __future__ import annotations

import json

import trio
import trio.testing

from protocol_specs.runs.runs import Attempt, ProcessRow, RunRecord, RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.session.processes import MAIN
from protocol_specs.wire import wire
from protocol_specs.wire.wire import StreamName
from relay.runs.tunnels import Tunnels
from relay.store import MemoryStore, keys
from relay.web.stacks import read_stacks, stacks_answer, stacks_section

RUN = "6b0400000000aa"


def record(state: RunState = RunState.RUNNING, **fields: object) -> RunRecord:
    spec = RunSpec(command=["python", "launch.py"], workdir="/w")
    base = {"id": RUN, "spec": spec, "owner": "alice", "attempts": [Attempt(n=1)], "attempt": 1}
    return RunRecord.model_validate({**base, "state": state, **fields})


def sampled(*ranks: int) -> bytes:
    frame = {"file": "train.py", "line": 40, "function": "step", "path": "/w/train.py"}
    threads = [{"name": "MainThread", "tid": 1, "main": True, "frames": [frame]}]
    processes = [{"pid": 10, "name": "main process (pid 10)", "threads": threads}]
    processes += [
        {"pid": 11 + r, "name": f"rank {r} (pid {11 + r})", "rank": r, "threads": threads}
        for r in ranks
    ]
    return json.dumps({"program": 10, "processes": processes}).encode()


#: the tunnels the test's worker has served (each read opens one of its own)
SERVED: set[str] = set()


async def worker(store: MemoryStore, *steps: wire.TunnelEntry) -> str:
    """Wait for a new tunnel's control entry, then write ``steps`` into its ``down`` stream."""
    while True:
        for _id, payload in await store.read_after(keys.stream(RUN, StreamName.TO_WORKER), "0"):
            entry = wire.decode_entry(payload)
            if (
                isinstance(entry, wire.ControlEntry)
                and entry.action == "tunnel"
                and entry.detail not in SERVED
            ):
                SERVED.add(entry.detail)
                assert entry.data["kind"] == "stacks"
                down = keys.tunnel_stream(RUN, entry.detail, "down")
                for step in steps:
                    await store.append(down, wire.encode_entry(step))
                return entry.detail
        await trio.sleep(0.01)


async def read(
    store: MemoryStore, shown: RunRecord, fresh: RunRecord | None, **kw: float
) -> object:
    noted: list[str] = []

    async def noting(tunnel: str) -> None:
        noted.append(tunnel)

    async def reload() -> RunRecord | None:
        return fresh

    got = await read_stacks(
        Tunnels(store), store, shown, "alice", noting=noting, reload=reload, **kw
    )
    assert len(noted) <= 1
    return got


async def test_the_workers_stacks_are_merged_with_who_is_paused_as_the_record_says_after() -> None:
    store = MemoryStore()
    data = sampled(0, 1, 2, 3)
    paused = record(
        state=RunState.PAUSED,
        processes={
            MAIN: ProcessRow(title="main process", pid=10),
            "12": ProcessRow(title="rank 1 (pid 12)", pid=12, rank=1, state="paused",
                             reason="breakpoint", where="train.py:40 in step"),
        },
    )  # fmt: skip
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            worker, store,
            wire.TunnelEntry(op="data", fd=1, data=data[:50]),
            wire.TunnelEntry(op="data", fd=2, data=b"a warning, not the stacks"),
            wire.TunnelEntry(op="data", fd=1, data=data[50:]),
            wire.TunnelEntry(op="exit", code=0),
        )  # fmt: skip
        with trio.fail_after(10):
            report = await read(store, record(), paused)
    status, body = stacks_answer(report)  # type: ignore[arg-type]
    assert status == 200
    assert body["header"] == (
        f"run {RUN}: 5 Python processes, 1 paused, in 2 places (main threads, outermost call first)"
    )
    assert body["lines"] == [  # the record read after the stacks says rank 1 is paused
        "ranks 0-3, main process (pid 10): train.py:40 step",
        "  ranks 0,2-3, main process (pid 10) (running): (here)",
        "  rank 1 (paused: breakpoint): (here)",
    ]
    assert [c["label"] for c in body["report"]["classes"]] == [  # type: ignore[index]
        "ranks 0,2-3, main process (pid 10)",
        "rank 1",
    ]


async def test_why_there_are_no_stacks_is_one_line(autojump_clock: trio.testing.MockClock) -> None:
    store = MemoryStore()
    ended = await read(store, record(RunState.SUCCEEDED, finished=True), None)
    assert ended == f"run {RUN} is succeeded: its stacks can be read while it runs (or is paused)"
    assert await read(store, record(RunState.QUEUED), None) == (
        f"run {RUN} is queued: its stacks can be read while it runs (or is paused)"
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            worker, store, wire.TunnelEntry(op="exit", detail="run x's program has not started yet")
        )
        failed = await read(store, record(), None)
    assert failed == "the stacks were not read: run x's program has not started yet"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker, store)  # a worker that never answers
        silent = await read(store, record(), None, wait=8.0)
    assert silent == "the worker did not send the stacks within 8 s; try again"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            worker, store,
            wire.TunnelEntry(op="data", fd=1, data=b"py-spy: not found"),
            wire.TunnelEntry(op="exit", code=0),
        )  # fmt: skip
        garbled = await read(store, record(), None)
    assert garbled == f"run {RUN}'s worker answered with no stacks (is it an older tether?)"
    assert stacks_answer(garbled) == (409, {"error": garbled})  # type: ignore[arg-type]


def test_the_section_is_on_the_page_of_a_run_whose_processes_can_be_read() -> None:
    assert f'data-stacks="/ui/runs/{RUN}/stacks"' in stacks_section(record())
    assert "<h2>Ranks</h2>" in stacks_section(record(RunState.PAUSED))
    assert stacks_section(record(RunState.QUEUED)) == ""
    assert stacks_section(record(RunState.FAILED, finished=True)) == ""


async def node_workers(store: MemoryStore, answers: dict[int, list[wire.TunnelEntry]]) -> None:
    """Each node's worker: the tunnel naming its node gets that node's ``answers``."""
    while answers:
        for _id, payload in await store.read_after(keys.stream(RUN, StreamName.TO_WORKER), "0"):
            entry = wire.decode_entry(payload)
            if isinstance(entry, wire.ControlEntry) and entry.detail not in SERVED:
                SERVED.add(entry.detail)
                down = keys.tunnel_stream(RUN, entry.detail, "down")
                for step in answers.pop(entry.data["node"]):
                    await store.append(down, wire.encode_entry(step))
        await trio.sleep(0.01)


async def test_every_nodes_stacks_are_read_and_a_node_that_failed_is_named() -> None:
    store = MemoryStore()
    spec = RunSpec(command=["torchrun", "t.py"], workdir="/w", resources={"nodes": 3})
    shown = record(spec=spec)
    answers = {
        0: [wire.TunnelEntry(op="data", fd=1, data=sampled(0, 1)), wire.TunnelEntry(op="exit", code=0)],
        1: [wire.TunnelEntry(op="data", fd=1, data=sampled(2, 3)),  # the same pids
            wire.TunnelEntry(op="exit", code=0)],
        2: [wire.TunnelEntry(op="exit", detail="run x's program has not started yet")],
    }  # fmt: skip
    with trio.fail_after(10):  # every node's tunnel is asked for (or its worker waits)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(node_workers, store, answers)
            got = await read_stacks(
                Tunnels(store), store, shown, "alice", noting=_nothing, reload=_no_record
            )
    status, body = stacks_answer(got)
    assert status == 200, body
    assert body["header"] == (
        f"run {RUN}: 6 Python processes, in 1 place (main threads, outermost call first); "
        "not read: node 2: the stacks were not read: run x's program has not started yet"
    )
    assert body["lines"] == [
        "ranks 0-3, main process (pid 10), main process (pid 10) on node 1 (running): "
        "train.py:40 step"
    ]


async def _nothing(_tunnel: str) -> None:
    pass


async def _no_record() -> RunRecord | None:
    return None
