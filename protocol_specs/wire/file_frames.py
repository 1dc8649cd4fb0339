"""The control frames of checkpoints, outputs and preemption (``protocol_specs/checkpoints``):
a worker records a checkpoint or its outputs (file sets whose chunks it uploaded first, with
``have_blobs`` / ``put_blob``), a worker or the CLI reads them, a user (or a scheduler's warning,
through the run's worker) preempts, pauses and resumes a run. Import these through
:mod:`protocol_specs.wire.wire`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

from ..checkpoints.checkpoints import Checkpoint
from ..checkpoints.files import FileSet
from ..snapshots.snapshots import check_digest
from .base import FROZEN, FrameType

__all__ = [
    "CheckpointStored",
    "Checkpoints",
    "GetCheckpoints",
    "GetOutputs",
    "Outputs",
    "OutputsStored",
    "Preempt",
    "PutCheckpoint",
    "PutOutputs",
    "Resume",
]


class PutCheckpoint(BaseModel):
    """A worker's checkpoint of its attempt at ``step``: ``files`` is the digest of the
    :class:`FileSet` blob it uploaded (after every chunk it names); answered by
    :class:`CheckpointStored`. On a run that spans nodes each node puts its part; the checkpoint
    is complete when every node put the step."""

    model_config = FROZEN
    t: Literal[FrameType.PUT_CHECKPOINT] = FrameType.PUT_CHECKPOINT
    rid: int
    run: str
    attempt: int = Field(ge=1)
    node: int = Field(default=0, ge=0, le=63)
    step: int = Field(ge=0)
    files: str
    #: bytes the worker uploaded for it
    sent: int = Field(default=0, ge=0)

    @field_validator("files")
    @classmethod
    def _files(cls, value: str) -> str:
        return check_digest(value)


class CheckpointStored(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.CHECKPOINT_STORED] = FrameType.CHECKPOINT_STORED
    rid: int
    checkpoint: Checkpoint
    #: every node of the attempt has put this step (always, on one node)
    complete: bool = True


class GetCheckpoints(BaseModel):
    """A run's complete checkpoints (its seed's, ``RunSpec.from_checkpoint``, while it has none of
    its own); with ``with_files``, the file set of ``step`` (None: the latest). Answered by
    :class:`Checkpoints`."""

    model_config = FROZEN
    t: Literal[FrameType.GET_CHECKPOINTS] = FrameType.GET_CHECKPOINTS
    rid: int
    run: str
    step: int | None = Field(default=None, ge=0)
    with_files: bool = False


class Checkpoints(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.CHECKPOINTS] = FrameType.CHECKPOINTS
    rid: int
    run: str
    #: the run the checkpoints are of: ``run``, or the run it seeds from while it has none
    source: str = ""
    #: oldest first
    checkpoints: list[Checkpoint] = Field(default_factory=list)
    #: the file set asked for (None: not asked, or no such checkpoint)
    files: FileSet | None = None
    #: the most bytes one checkpoint may hold on this relay
    limit: int = 0


class PutOutputs(BaseModel):
    """A worker's outputs (``RunSpec.outputs``) of its attempt: ``files`` is the digest of the
    :class:`FileSet` blob of what it found, uploaded after its chunks; merged into the run's
    outputs (a path stored again replaces the earlier version). Answered by
    :class:`OutputsStored`."""

    model_config = FROZEN
    t: Literal[FrameType.PUT_OUTPUTS] = FrameType.PUT_OUTPUTS
    rid: int
    run: str
    attempt: int = Field(ge=1)
    node: int = Field(default=0, ge=0, le=63)
    files: str

    @field_validator("files")
    @classmethod
    def _files(cls, value: str) -> str:
        return check_digest(value)


class OutputsStored(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.OUTPUTS_STORED] = FrameType.OUTPUTS_STORED
    rid: int
    count: int  #: files the run's outputs list now
    size: int  #: their bytes


class GetOutputs(BaseModel):
    """The run's outputs so far (while it runs, and after its worker is gone); answered by
    :class:`Outputs`. Their chunks are read with ``get_blob`` naming the run."""

    model_config = FROZEN
    t: Literal[FrameType.GET_OUTPUTS] = FrameType.GET_OUTPUTS
    rid: int
    run: str


class Outputs(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.OUTPUTS] = FrameType.OUTPUTS
    rid: int
    run: str
    files: FileSet = Field(default_factory=FileSet)


class Preempt(BaseModel):
    """Preempt the run's current attempt: its program is warned (``tether.should_preempt()``, a
    signal it may trap) and ended ``grace`` seconds later (None: the run's ``preempt_grace``)
    unless it exits first. The attempt ends ``preempted``; then the run is queued again without
    using a retry, or, with ``suspend`` (``tether pause``), ``suspended`` until ``resume``. A
    worker token may preempt its own attempt (a scheduler's warning reached it). Answered by
    :class:`~protocol_specs.wire.control_frames.RunInfo`."""

    model_config = FROZEN
    t: Literal[FrameType.PREEMPT] = FrameType.PREEMPT
    rid: int
    run: str
    grace: float | None = Field(default=None, ge=0, le=24 * 3600)
    suspend: bool = False
    #: why, in words (``preempted by the user``, ``slurm: time limit in 90 s``)
    detail: str = Field(default="", max_length=500)


class Resume(BaseModel):
    """Queue the next attempt of a ``suspended`` run (from its latest checkpoint); refused for a
    run with no checkpoint unless ``from_start``. Answered by ``RunInfo``."""

    model_config = FROZEN
    t: Literal[FrameType.RESUME] = FrameType.RESUME
    rid: int
    run: str
    from_start: bool = False
