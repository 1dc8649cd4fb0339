"""The relay's heap policy (``relay/gc_policy.py``): freeze after growth, thaw after a fall."""

from __future__ import annotations

import gc

import trio
import trio.testing

from relay.gc_policy import MIN_GROWTH, STEADY_GROWTH, HeapAction, HeapPolicy, keep_heap


def test_a_growing_relay_freezes_at_each_quarter_and_thaws_after_halving() -> None:
    policy = HeapPolicy()
    steps = [
        10,
        MIN_GROWTH - 1,
        MIN_GROWTH,
        300,
        10_000,
        12_000,
        12_500,
        6_300,
        4_999,
        4_000,
        6_300,
    ]
    assert [policy.decide(n) for n in steps] == [
        None,
        None,
        HeapAction.FREEZE,  # 256: the least growth worth it
        None,  # +44
        HeapAction.FREEZE,  # 10,000
        None,  # +20 %
        HeapAction.FREEZE,  # +25 %
        None,  # down to 6,300: not below half of 12,500 yet
        HeapAction.THAW,  # below half of 12,500
        None,  # counting from 4,999 again
        HeapAction.FREEZE,  # 6,300 >= 4,999 * 5 / 4
    ]


def test_growth_that_stops_short_of_a_quarter_is_frozen_once_steady() -> None:
    policy = HeapPolicy()
    last = 9_950 + STEADY_GROWTH
    steps = [8_000, 9_000, 9_900, 9_950, 9_960, last - 1, last]
    assert [policy.decide(n) for n in steps] == [
        HeapAction.FREEZE,
        None,  # +12.5 %, growing
        None,  # +23.8 %, growing
        HeapAction.FREEZE,  # steady (+0.5 % since the last look) after +1,950
        HeapAction.REFREEZE,  # steady, 10 new since the freeze: what survived since, frozen
        HeapAction.REFREEZE,  # steady, STEADY_GROWTH - 1 new
        HeapAction.FREEZE,  # steady, STEADY_GROWTH new: a freeze that counts from here
    ]


def test_a_population_that_turned_over_is_collected_whole_once() -> None:
    policy = HeapPolicy()
    assert policy.decide(10_000, ended=0) is HeapAction.FREEZE
    assert policy.decide(10_000, ended=4_000) is HeapAction.REFREEZE  # 40 % turned over
    assert policy.decide(10_000, ended=5_000) is HeapAction.RENEW  # half: its garbage collected
    assert policy.decide(10_000, ended=9_000) is HeapAction.REFREEZE  # counting from 5,000
    assert policy.decide(10_000, ended=10_000) is HeapAction.RENEW
    assert policy.decide(11_000, ended=10_000) is None  # growing: neither steady nor a quarter


async def test_keep_heap_freezes_and_thaws_the_process(
    autojump_clock: trio.testing.MockClock,
) -> None:
    counts = iter([MIN_GROWTH, MIN_GROWTH, 1])
    seen: list[int] = []
    with trio.move_on_after(16):  # three looks, five seconds apart

        def count() -> int:
            n = next(counts)
            if n == 1:
                seen.append(gc.get_freeze_count())
            return n

        try:
            await keep_heap(count)
        finally:
            frozen_after = gc.get_freeze_count()
    gc.unfreeze()
    assert seen and seen[0] > 0  # frozen at the first look
    assert frozen_after == 0  # thawed at the third
