"""The local pool's GPU pinning: runs wait for free GPUs, and asking for more than exist fails."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from worker_shim.backends.pool import GpuPool


async def test_runs_get_distinct_gpus_and_wait_for_free_ones() -> None:
    pool = GpuPool(["0", "1", "2"])
    first = await pool.take(2)
    second = await pool.take(1)
    assert sorted(first + second) == ["0", "1", "2"]
    got: list[list[str]] = []

    async def third() -> None:
        got.append(await pool.take(2))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(third)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # only one GPU would be free: it waits
        await pool.give_back(first)
    assert sorted(got[0]) == sorted(first)


async def test_more_gpus_than_the_pool_has_fails_at_once() -> None:
    pool = GpuPool(["0"])
    with pytest.raises(ValueError, match="asks for 2 GPUs; this worker pool has 1"):
        await pool.take(2)
    assert await GpuPool([]).take(0) == []
