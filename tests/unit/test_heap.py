"""The relay's heap policy (``relay/heap.py``): freeze after growth, thaw after a fall."""

from __future__ import annotations

import gc

import trio
import trio.testing

from relay.heap import MIN_GROWTH, HeapAction, HeapPolicy, keep_heap


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
