"""What a run asks its scheduler for: GPUs, CPUs, memory, time, partition, Ray custom resources.

Validated where it enters (the CLI and the relay, as part of ``protocol_specs.runs.spec.RunSpec``); each
backend honours what it can (``Resources``' docstring) and refuses at submit what it cannot.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["Resources", "short_duration"]

_PARTITION = re.compile(r"^[A-Za-z0-9_.-]{0,64}$")
#: a custom resource's name (Ray's ``--resources``; not one Ray names itself)
_RESOURCE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:/-]{0,63}$")
_RAY_OWN_RESOURCES = frozenset({"CPU", "GPU", "memory", "object_store_memory"})


class Resources(BaseModel):
    """What the run asks its scheduler for (the local pool honours ``gpus``; Slurm all but
    ``custom``; Ray all but ``time_limit`` and ``partition``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: the nodes the run spans (one worker per node joins its attempt); with more than one,
    #: ``gpus`` and ``cpus`` are per node
    nodes: int = Field(default=1, ge=1, le=64)
    gpus: int = Field(default=0, ge=0, le=64)
    cpus: int = Field(default=1, ge=1, le=1024)
    #: memory in MiB (0: the scheduler's default)
    memory_mb: int = Field(default=0, ge=0, le=64 * 1024 * 1024)
    #: wall-clock limit in seconds (0: none / the partition's)
    time_limit: float = Field(default=0.0, ge=0, le=365 * 86400)
    #: Slurm partition ("" : the cluster's default)
    partition: str = Field(default="", max_length=64)
    #: Ray custom resources the run's entrypoint holds (``--resource NAME=AMOUNT``)
    custom: dict[str, float] = Field(default_factory=dict, max_length=16)

    @field_validator("custom")
    @classmethod
    def _custom(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            if not _RESOURCE.match(name) or name in _RAY_OWN_RESOURCES:
                hint = " (use --gpus, --cpus, --mem)" if name in _RAY_OWN_RESOURCES else ""
                raise ValueError(f"invalid custom resource name {name[:80]!r}{hint}")
            if not 0 < amount <= 1e9:
                raise ValueError(f"custom resource {name}: the amount must be over 0")
        return value

    def parts(self) -> list[tuple[str, str]]:
        """What was asked, as ``(name, amount)`` pairs (what was left at its default: no pair,
        but GPUs and CPUs): ``[("gpus", "1"), ("cpus", "4"), ("mem", "16384M"), ("time", "4h")]``."""
        out = [("gpus", str(self.gpus)), ("cpus", str(self.cpus))]
        if self.memory_mb:
            out.append(("mem", f"{self.memory_mb}M"))
        if self.time_limit:
            out.append(("time", short_duration(self.time_limit)))
        if self.partition:
            out.append(("partition", self.partition))
        return out + [(name, f"{amount:g}") for name, amount in self.custom.items()]

    @field_validator("partition")
    @classmethod
    def _partition(cls, value: str) -> str:
        if not _PARTITION.match(value):
            raise ValueError(f"invalid partition name {value!r}")
        return value


def short_duration(seconds: float) -> str:
    """``45s``, ``12m``, ``3h``, ``2d``: a duration or an age, in its largest unit."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{max(seconds, 0):.0f}s"
