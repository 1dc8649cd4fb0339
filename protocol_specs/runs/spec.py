"""What the user submits: the run's spec, validated where it enters (the CLI and the relay).

A :class:`RunSpec` says what to run, where it came from, the resources it asks for, its retries,
debug or not. It is frozen and refuses unknown fields; the relay keeps it inside the run's record
(``protocol_specs/runs/runs.py``), unchanged for every attempt.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..checkpoints.outputs import check_patterns
from .metrics import MAX_PATTERNS, check_condition, parse_pattern
from .resources import Resources

__all__ = ["KNOWN_BACKENDS", "REDACTED", "TAG_PATTERN", "RunSpec"]


#: the backends tether ships (``RunSpec.backend``): the CLI refuses others at submit time
KNOWN_BACKENDS = ("local", "slurm", "ray")

_BACKEND = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
_MOUNT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
#: what a tag (``--tag``) may be
TAG_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:=/-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")
#: an interpreter's file name (``python``, ``python3``, ``python3.11``)
_PYTHON_NAME = re.compile(r"python(3(\.\d+)?)?")
#: what a secret environment value looks like wherever users can see it
REDACTED = "<secret>"


class RunSpec(BaseModel):
    """What the user submitted. Validated where it enters (CLI and relay)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    command: list[str] = Field(min_length=1, max_length=4096)
    #: the submitted working directory on the user's machine (absolute); the snapshot's root
    workdir: str = Field(min_length=1, max_length=4096)
    debug: bool = True
    #: debug mode: hold the program before user code until an IDE finished its configuration
    wait_for_ide: bool = True
    #: not debug mode: a Python program starts so that an IDE can attach later (``tether
    #: attach``), without a restart; nothing of the debugger is loaded until then
    debuggable: bool = True
    #: an uncaught exception stops its thread in the raising frame instead of ending the program
    #: (a debug run: when no IDE configured exception breakpoints; a plain run: a debuggable
    #: program), until an IDE lets it go or the unattended-stop policy acts
    post_mortem: bool = True
    env: dict[str, str] = Field(default_factory=dict, max_length=1000)
    #: names in ``env`` whose values are secret: the worker's program gets them, but ``tether ls``,
    #: ``status`` and the logs show :data:`REDACTED` (and the program's output has them blanked)
    secret_env: list[str] = Field(default_factory=list, max_length=1000)
    name: str = Field(default="", max_length=200)
    #: the client OS of the submitting machine, for path separators ("unix" or "windows")
    client_os: str = "unix"
    #: what the worker does when the program is paused and no IDE is attached
    #: (``protocol_specs.session.attention``): wait, continue, terminate or suspend after
    #: ``unattended_timeout`` s (suspend: the program's ``tether.on_suspend`` saves a checkpoint and
    #: the run is suspended, its slot freed)
    on_unattended_stop: Literal["wait", "continue", "terminate", "suspend"] = "wait"
    #: what acts when ``suspend`` cannot (no ``tether.on_suspend`` function, or it failed)
    unattended_fallback: Literal["wait", "continue", "terminate"] = "wait"
    unattended_timeout: float = Field(default=1800.0, ge=0, le=30 * 24 * 3600)
    #: POSTed a JSON notice when the program stops with no IDE attached (http or https)
    webhook: str = Field(default="", max_length=2048)
    resources: Resources = Field(default_factory=Resources)
    #: data handed to the run: name -> path or URL, given to the program as ``TETHER_MOUNT_<NAME>``
    mounts: dict[str, str] = Field(default_factory=dict, max_length=64)
    #: a failed or lost attempt is retried this many times, waiting ``retry_backoff`` s, doubling
    max_retries: int = Field(default=0, ge=0, le=100)
    retry_backoff: float = Field(default=10.0, ge=0, le=3600)
    tags: list[str] = Field(default_factory=list, max_length=32)
    #: where the run goes: ``local`` (the worker pool of ``tether up``), ``slurm`` or ``ray``
    backend: str = "local"
    #: debug mode: which processes of the program the IDE is offered (``protocol_specs.session.processes``)
    processes: Literal["stopped", "all", "main"] = "stopped"
    #: debug mode: only these ranks (``RANK``) get breakpoints; empty: every process
    ranks: list[int] = Field(default_factory=list, max_length=4096)
    #: debug mode: when one rank stops, the others are paused, and a continue or step in one
    #: rank's session moves them all (``all``, acting once a second rank exists); ``one``: each
    #: rank on its own (``worker_shim/session/group.py``)
    stop: Literal["all", "one"] = "all"
    #: patterns whose named groups are metrics in the program's output lines
    #: (``protocol_specs/runs/metrics.py``): ``loss=(?P<loss>[\d.e+-]+)``
    metrics: list[str] = Field(default_factory=list, max_length=MAX_PATTERNS)

    #: checkpoints (``tether.save_checkpoint``): how many of the newest the relay keeps
    keep_checkpoints: int = Field(default=3, ge=1, le=100)
    #: a new run's first attempt starts with this checkpoint restored: ``RUN`` (its latest) or
    #: ``RUN:STEP`` (``protocol_specs/checkpoints/checkpoints.py``), checked at submit
    from_checkpoint: str = Field(default="", max_length=220)
    #: a preempted attempt's program (``tether preempt``, a scheduler's warning) has this long to
    #: checkpoint and exit before it is ended
    preempt_grace: float = Field(default=60.0, ge=0, le=3600)
    #: what the run produces (globs relative to its directory, ``**`` for any depth): uploaded
    #: after each attempt and on each checkpoint, fetched with ``tether cp`` / ``tether outputs``
    outputs: list[str] = Field(default_factory=list, max_length=64)

    #: pause the program where ``tether.report`` is called with metrics that meet this condition
    #: (``loss != loss``: ``protocol_specs/runs/metrics.py``), once; a sweep's trials: the first only
    debug_when: str = Field(default="", max_length=500)

    @field_validator("metrics")
    @classmethod
    def _metric_patterns(cls, value: list[str]) -> list[str]:
        for text in value:
            parse_pattern(text)
        return value

    @field_validator("outputs")
    @classmethod
    def _output_patterns(cls, value: list[str]) -> list[str]:
        return check_patterns(value)

    @field_validator("debug_when")
    @classmethod
    def _condition(cls, value: str) -> str:
        return check_condition(value) if value else value

    @field_validator("backend")
    @classmethod
    def _backend(cls, value: str) -> str:
        if not _BACKEND.fullmatch(value):
            raise ValueError(f"invalid backend name {value!r}")
        return value

    @field_validator("ranks")
    @classmethod
    def _ranks(cls, value: list[int]) -> list[int]:
        if any(rank < 0 for rank in value):
            raise ValueError("ranks are numbers from 0 (RANK of a torch.distributed job)")
        return sorted(set(value))

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, value: dict[str, str]) -> dict[str, str]:
        for name, where in value.items():
            if not _MOUNT_NAME.fullmatch(name):
                raise ValueError(f"invalid mount name {name!r} (letters, digits, _)")
            if not where or len(where) > 4096 or "\x00" in where:
                raise ValueError(f"mount {name!r} needs a path or URL")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"invalid environment variable name {name[:100]!r}")
            if "\x00" in text or len(text) > 128 * 1024:
                raise ValueError(f"environment variable {name}: NUL byte or over 128 KiB")
        return value

    @model_validator(mode="after")
    def _custom_resources_need_ray(self) -> RunSpec:
        if self.resources.custom and self.backend != "ray":
            raise ValueError(
                f"custom resources ({', '.join(self.resources.custom)}) are a Ray setting: "
                f"the {self.backend} backend cannot honour them"
            )
        return self

    @model_validator(mode="after")
    def _secrets_are_in_env(self) -> RunSpec:
        unknown = [name for name in self.secret_env if name not in self.env]
        if unknown:
            raise ValueError(f"secret_env names variables not in env: {', '.join(unknown[:5])}")
        return self

    def display_name(self) -> str:
        """What a list calls the run: its name, else its command without the interpreter's path
        and options (``train.py --lr 3e-4``, ``-m trainer``)."""
        if self.name:
            return self.name
        words = list(self.command)
        if words and _PYTHON_NAME.fullmatch(re.split(r"[\\/]", words[0])[-1]):
            words = words[1:]
            while words and words[0].startswith("-") and words[0] not in ("-m", "-c"):
                words = words[1:]
        return " ".join(words) or " ".join(self.command)

    def secrets(self) -> list[str]:
        """The secret values (non-empty), longest first."""
        values = {self.env[name] for name in self.secret_env if self.env.get(name)}
        return sorted(values, key=len, reverse=True)

    def redacted(self) -> RunSpec:
        """The spec with every secret environment value replaced by :data:`REDACTED`."""
        if not self.secret_env:
            return self
        env = {k: REDACTED if k in self.secret_env else v for k, v in self.env.items()}
        return self.model_copy(update={"env": env})

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: list[str]) -> list[str]:
        for tag in value:
            if not TAG_PATTERN.fullmatch(tag):
                raise ValueError(f"invalid tag {tag!r}")
        return value

    def program_env(self) -> dict[str, str]:
        """The environment the program gets on top of the worker's: ``env``, the mounts, and
        the ``--debug-when`` condition (``tether.report`` reads it)."""
        mounts = {f"TETHER_MOUNT_{name.upper()}": where for name, where in self.mounts.items()}
        when = {"TETHER_DEBUG_WHEN": self.debug_when} if self.debug_when else {}
        return {**mounts, **when, **self.env}

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
