"""What the worker does with its run link's news (``worker_shim/shim.py``), over a fake link: a
run ended (cancelled, or lost) while the link was away is stopped when the link comes back."""

from __future__ import annotations

from typing import cast

import trio
import trio.testing

from protocol_specs.runs.runs import RunRecord, RunState
from protocol_specs.runs.spec import RunSpec
from relay.client import RunLink
from worker_shim.session.link_news import LinkNews
from worker_shim.shim import _end_when_ended


class FakeLink:
    def __init__(self, run: RunRecord) -> None:
        self.run = run  #: the run record as of the latest connection


async def test_a_run_ended_while_the_link_was_away_is_stopped_when_it_comes_back() -> None:
    record = RunRecord(id="r1", spec=RunSpec(command=["x"], workdir="/w"), state=RunState.RUNNING)
    link = FakeLink(record)
    said: list[str] = []
    news = LinkNews(said.append, "r1")
    stopped: list[str] = []

    async def stop(who: str) -> None:
        stopped.append(who)

    async def end(who: str) -> None:
        await _end_when_ended(cast(RunLink, link), news, lambda: stop(who))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(end, "plain")
            nursery.start_soon(end, "debug")  # a plain run an IDE attached to: both wait
            news.state(False, "connection lost")
            news.state(True, "reconnected to the relay (connection 2)")
            await trio.testing.wait_all_tasks_blocked()
            assert stopped == []  # still running: nothing to stop
            link.run = record.model_copy(update={"state": RunState.CANCELLED})
            news.state(True, "reconnected to the relay (connection 3)")
    assert sorted(stopped) == ["debug", "plain"]
    assert said.count("run r1 is cancelled: stopping the program") == 1  # said once
