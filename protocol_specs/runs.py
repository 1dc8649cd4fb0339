"""Run specs and the run lifecycle state machine.

Theory of operation
-------------------
A run is submitted as a :class:`RunSpec` (what to run, where it came from, debug or not). The relay keeps
a :class:`RunRecord` per run and moves it through :class:`RunState` only along :data:`TRANSITIONS`,
a table keyed by ``(state, event)``. An event not in the table for the current state raises
:class:`IllegalTransition` naming the event and the state, and leaves the record unchanged. Terminal
states (``succeeded``, ``failed``, ``cancelled``) have no outgoing transitions: a worker reporting an
exit after the user cancelled is reported as illegal and ignored by the caller.

The diagram in ``docs/run-states.md`` is generated from :data:`TRANSITIONS` (``python -m
protocol_specs.diagrams``).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "TERMINAL_STATES",
    "TRANSITIONS",
    "IllegalTransition",
    "RunEvent",
    "RunRecord",
    "RunSpec",
    "RunState",
    "next_state",
]


class RunState(StrEnum):
    QUEUED = "queued"  #: submitted, waiting for a worker slot
    STARTING = "starting"  #: claimed by a worker: fetching files, starting the program
    RUNNING = "running"  #: the program's process is running (under debugpy in debug mode)
    SUCCEEDED = "succeeded"  #: exited with status 0
    FAILED = "failed"  #: exited non-zero, or could not start
    CANCELLED = "cancelled"  #: cancelled by the user (terminateDebuggee, ``tether cancel``)
    LOST = "lost"  #: the worker stopped renewing its lease (host down, network cut for too long)


class RunEvent(StrEnum):
    CLAIM = "claim"
    START = "start"
    EXIT_OK = "exit_ok"
    EXIT_ERROR = "exit_error"
    START_FAILED = "start_failed"
    CANCEL = "cancel"
    LEASE_EXPIRED = "lease_expired"


TRANSITIONS: dict[tuple[RunState, RunEvent], RunState] = {
    (RunState.QUEUED, RunEvent.CLAIM): RunState.STARTING,
    (RunState.QUEUED, RunEvent.CANCEL): RunState.CANCELLED,
    (RunState.STARTING, RunEvent.START): RunState.RUNNING,
    (RunState.STARTING, RunEvent.START_FAILED): RunState.FAILED,
    (RunState.STARTING, RunEvent.CANCEL): RunState.CANCELLED,
    (RunState.RUNNING, RunEvent.EXIT_OK): RunState.SUCCEEDED,
    (RunState.RUNNING, RunEvent.EXIT_ERROR): RunState.FAILED,
    (RunState.RUNNING, RunEvent.CANCEL): RunState.CANCELLED,
    (RunState.STARTING, RunEvent.LEASE_EXPIRED): RunState.LOST,
    (RunState.RUNNING, RunEvent.LEASE_EXPIRED): RunState.LOST,
}

TERMINAL_STATES = frozenset(
    {RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED, RunState.LOST}
)


class IllegalTransition(Exception):
    def __init__(self, event: RunEvent, state: RunState) -> None:
        super().__init__(f"can't handle run event {event.value!r} in state {state.value!r}")
        self.event = event
        self.state = state


def next_state(state: RunState, event: RunEvent) -> RunState:
    """Return the state after ``event``; raises :class:`IllegalTransition` if not allowed."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(event, state) from None


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class RunSpec(BaseModel):
    """What the user submitted. Validated where it enters (CLI and relay)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    command: list[str] = Field(min_length=1, max_length=4096)
    #: the submitted working directory on the user's machine (absolute); the snapshot's root
    workdir: str = Field(min_length=1, max_length=4096)
    debug: bool = True
    #: debug mode: hold the program before user code until an IDE finished its configuration
    wait_for_ide: bool = True
    env: dict[str, str] = Field(default_factory=dict)
    name: str = Field(default="", max_length=200)
    #: the client OS of the submitting machine, for path separators ("unix" or "windows")
    client_os: str = "unix"
    #: what the worker does when the program is paused and no IDE is attached
    #: (``protocol_specs.attention``): wait, continue or terminate after ``unattended_timeout`` s
    on_unattended_stop: Literal["wait", "continue", "terminate"] = "wait"
    unattended_timeout: float = Field(default=1800.0, ge=0, le=30 * 24 * 3600)
    #: POSTed a JSON notice when the program stops with no IDE attached (http or https)
    webhook: str = Field(default="", max_length=2048)

    @field_validator("webhook")
    @classmethod
    def _webhook_url(cls, value: str) -> str:
        if not value:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("webhook must be an http:// or https:// URL with a host")
        if any(c.isspace() for c in value):
            raise ValueError("webhook must not contain whitespace")
        return value

    @field_validator("command")
    @classmethod
    def _command_not_blank(cls, value: list[str]) -> list[str]:
        if not value[0].strip():
            raise ValueError("the command's program must not be empty")
        if any("\x00" in part for part in value):
            raise ValueError("the command must not contain NUL characters")
        return value

    @field_validator("workdir")
    @classmethod
    def _workdir_absolute(cls, value: str) -> str:
        if not (value.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", value)):
            raise ValueError("workdir must be an absolute path")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not _ENV_NAME.match(name):
                raise ValueError(f"invalid environment variable name {name!r}")
        return value


class RunRecord(BaseModel):
    """The relay's record of a run (stored as one Redis hash, see ``relay/keys.py``)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str
    spec: RunSpec
    state: RunState = RunState.QUEUED
    created_at: float = 0.0
    updated_at: float = 0.0
    worker: str = ""
    exit_code: int | None = None
    detail: str = ""
    #: the queue entry a worker claimed (acknowledged when the run ends)
    queue_entry: str = ""

    def apply(self, event: RunEvent, *, at: float, **changes: Any) -> RunRecord:
        """The record after ``event``; raises :class:`IllegalTransition` and changes nothing."""
        state = next_state(self.state, event)
        return self.model_copy(update={"state": state, "updated_at": at, **changes})

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES
