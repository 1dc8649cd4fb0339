"""The worker pool: N slots, each claiming queued runs from the relay and running them to the end."""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import trio

from relay.client import RelayError, open_control

from .shim import run_shim

__all__ = ["run_pool"]

log = logging.getLogger("tether.worker")


async def run_pool(
    relay_url: str,
    *,
    slots: int = 1,
    start_delay: float = 0.0,
    work_dir: Path,
    name: str | None = None,
    python: str = sys.executable,
    on_event: Callable[[str], None] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``slots`` claim loops until cancelled. ``start_delay`` stands in for a GPU queue."""
    say = on_event or (lambda _text: None)
    base = name or f"{socket.gethostname()}-pool"
    runs_dir = work_dir / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    async with trio.open_nursery() as nursery:
        for slot in range(slots):
            nursery.start_soon(
                _slot, relay_url, f"{base}-{slot}", start_delay, runs_dir, python, say
            )
        task_status.started()


async def _slot(
    relay_url: str,
    worker: str,
    start_delay: float,
    runs_dir: Path,
    python: str,
    say: Callable[[str], None],
) -> None:
    backoff = 0.2
    while True:
        try:
            async with open_control(relay_url, client=f"tether-worker {worker}") as control:
                backoff = 0.2
                while True:
                    record, snapshot = await control.claim(worker)
                    say(f"{worker}: claimed run {record.id}")
                    if start_delay > 0:
                        say(
                            f"{worker}: waiting {start_delay:g} s before starting run {record.id} (--start-delay)"
                        )
                        await trio.sleep(start_delay)
                    try:
                        await run_shim(
                            relay_url,
                            record,
                            snapshot,
                            runs_dir=runs_dir,
                            python=python,
                            on_event=say,
                        )
                    except RelayError as exc:
                        say(f"{worker}: lost the relay while running {record.id}: {exc}")
        except RelayError as exc:
            log.warning("%s: %s; retrying in %.1f s", worker, exc, backoff)
            await trio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
