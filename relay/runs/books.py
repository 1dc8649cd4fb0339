"""What a run's changes need of the registry: its store, settings and clock, and its record
operations. :class:`Books` names them as a protocol so that the modules that carry out one kind of
change (:mod:`.claiming`, :mod:`.submitting`) sit below :class:`relay.runs.registry.Registry`,
which implements it and calls them, instead of importing it back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from protocol_specs.runs.runs import RunEvent, RunRecord

from ..auth import TokenStore
from ..config import RelayConfig
from ..store import Store

__all__ = ["Books", "Change"]


class Change(NamedTuple):
    """One applied change: the record before and after it, and the version it was written as."""

    before: RunRecord
    after: RunRecord
    version: int


class Books(Protocol):
    """The registry as its changes see it (:class:`relay.runs.registry.Registry` says what each
    operation does)."""

    store: Store
    config: RelayConfig
    clock: Callable[[], float]
    tokens: TokenStore

    async def load(self, run_id: str) -> RunRecord | None: ...

    async def update(
        self, run_id: str, decide: Callable[[RunRecord], RunRecord]
    ) -> Change | None: ...

    async def create(self, record: RunRecord) -> bool: ...

    async def changed(self, record: RunRecord) -> None: ...

    async def append_status(
        self, run_id: str, event: str, record: RunRecord, *, logs: bool = False, **extra: Any
    ) -> None: ...

    async def transition(
        self,
        run_id: str,
        event: RunEvent,
        *,
        about: int | None = None,
        attempt_fields: dict[str, Any] | None = None,
        **changes: Any,
    ) -> RunRecord | None: ...

    async def settle(self, before: RunRecord, after: RunRecord) -> None: ...

    async def enqueue(self, record: RunRecord) -> None: ...
