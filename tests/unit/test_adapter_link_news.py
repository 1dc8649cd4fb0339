"""What the relay link tells the adapter from its own tasks (:mod:`adapter.dap.link_news`): a
refusal names the request its publish carried, once, and only while the relay has not stored it."""

from __future__ import annotations

import trio

from adapter.dap.link_news import LinkNews, Refused
from protocol_specs.session.processes import MAIN
from protocol_specs.wire import wire


def _error(message: str) -> wire.Error:
    return wire.Error(code=wire.ErrorCode.BUFFER_FULL, message=message)


def _queued(news: LinkNews) -> list[Refused | tuple[bool, str]]:
    out: list[Refused | tuple[bool, str]] = []
    while True:
        try:
            out.append(news.received.receive_nowait())
        except trio.WouldBlock:
            return out


def test_a_refusal_names_what_its_publish_carried_once() -> None:
    news = LinkNews()
    news.published(1, MAIN, 7, answered=0)
    news.published(2, "pid-9", None, answered=0)
    news.refused(1, _error("the run's buffer is full"))
    news.refused(1, _error("again"))  # answered once: a second refusal of it names nothing
    news.refused(2, _error("presence"))
    assert _queued(news) == [
        Refused(MAIN, 7, "the run's buffer is full"),
        Refused("pid-9", None, "presence"),
    ]


def test_what_the_relay_stored_is_forgotten_and_never_refused() -> None:
    news = LinkNews()
    news.published(1, MAIN, 1, answered=0)
    news.published(2, MAIN, 2, answered=0)
    news.published(3, MAIN, 3, answered=2)  # 1 and 2 are stored
    for n in (1, 2, 3):
        news.refused(n, _error("no"))
    assert _queued(news) == [Refused(MAIN, 3, "no")]


def test_the_link_state_is_told_and_queued() -> None:
    events: list[str] = []
    news = LinkNews(events.append)
    news.state(False, "connection reset")
    news.state(True, "reconnected")
    assert events == ["relay link down: connection reset", "relay link up: reconnected"]
    assert _queued(news) == [(False, "connection reset"), (True, "reconnected")]
