"""The control frames of sweeps (``protocol_specs/sweeps/sweeps.py``): submit one, look at one or all of
one's own, cancel one. Import these through :mod:`protocol_specs.wire.wire`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from ..snapshots.snapshots import Manifest, check_digest
from ..sweeps.sweeps import SweepRecord, SweepSpec, Trial
from .base import FROZEN, FrameType

__all__ = [
    "CancelSweep",
    "ClaimPause",
    "GetSweep",
    "ListSweeps",
    "PauseClaimed",
    "SubmitSweep",
    "SweepInfo",
    "SweepList",
]


class SubmitSweep(BaseModel):
    """Start a sweep of ``spec`` on the snapshot ``manifest`` or the root tree ``tree`` (as
    ``submit`` names a run's); answered by :class:`SweepInfo` once its first trials are queued."""

    model_config = FROZEN
    t: Literal[FrameType.SUBMIT_SWEEP] = FrameType.SUBMIT_SWEEP
    rid: int
    spec: SweepSpec
    manifest: Manifest = Field(default_factory=Manifest)
    tree: str = ""

    @field_validator("tree")
    @classmethod
    def _tree(cls, value: str) -> str:
        return check_digest(value) if value else value

    @field_validator("spec")
    @classmethod
    def _within_limits(cls, value: SweepSpec) -> SweepSpec:
        """What the relay and the samplers can hold (the CLI checked it too; a crafted frame
        may not have been)."""
        value.check_limits()
        return value

    @model_validator(mode="after")
    def _one_snapshot(self) -> SubmitSweep:
        if self.tree and self.manifest.entries:
            raise ValueError("a sweep names its snapshot by a manifest or by a tree, not both")
        return self


class GetSweep(BaseModel):
    """A sweep and its trials (``sweep``: its id, or a unique prefix of it)."""

    model_config = FROZEN
    t: Literal[FrameType.GET_SWEEP] = FrameType.GET_SWEEP
    rid: int
    sweep: str = Field(min_length=1, max_length=64)


class CancelSweep(BaseModel):
    """No more trials; the running ones cancelled."""

    model_config = FROZEN
    t: Literal[FrameType.CANCEL_SWEEP] = FrameType.CANCEL_SWEEP
    rid: int
    sweep: str = Field(min_length=1, max_length=64)


class ListSweeps(BaseModel):
    """The newest sweeps (one's own; an admin's: everyone's)."""

    model_config = FROZEN
    t: Literal[FrameType.LIST_SWEEPS] = FrameType.LIST_SWEEPS
    rid: int
    limit: int = Field(default=30, ge=1, le=1000)


class SweepInfo(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.SWEEP] = FrameType.SWEEP
    rid: int
    sweep: SweepRecord
    trials: list[Trial] = Field(default_factory=list)


class SweepList(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.SWEEPS] = FrameType.SWEEPS
    rid: int
    sweeps: list[SweepRecord]


class ClaimPause(BaseModel):
    """A worker's question: the program of ``run``'s attempt reported ``values`` at ``step`` and
    they meet its ``--debug-when``; may it pause there? A sweep's trial may if it is the first of
    its sweep to ask; any other run may."""

    model_config = FROZEN
    t: Literal[FrameType.CLAIM_PAUSE] = FrameType.CLAIM_PAUSE
    rid: int
    run: str
    attempt: int = Field(ge=1)
    step: int = Field(default=0, ge=0)
    values: dict[str, float] = Field(default_factory=dict, max_length=64)


class PauseClaimed(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.PAUSE_CLAIMED] = FrameType.PAUSE_CLAIMED
    rid: int
    pause: bool
    detail: str = ""
