"""The user's configuration file: relay URL, credentials and run defaults, in profiles.

``$TETHER_CONFIG``, else ``$XDG_CONFIG_HOME/tether/config.toml``, else ``~/.config/tether/config.toml``::

    [default]                 # used unless --profile / $TETHER_PROFILE names another
    relay = "ws://127.0.0.1:8765"
    backend = "local"
    max_retries = 1

    [profiles.cluster]
    relay = "wss://tether.example.org"
    backend = "slurm"
    partition = "gpu"
    gpus = 1
    memory = "32G"
    time = "4h"

    [profiles.cluster.env]
    WANDB_MODE = "offline"

A profile's keys are laid over ``[default]``; command-line options win over both. Unknown keys are
refused with the file's name, so a typo does not silently do nothing.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["ConfigError", "Profile", "config_path", "load_profile"]


class ConfigError(ValueError):
    pass


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    relay: str = ""
    token: str = ""
    backend: str = ""
    gpus: int | None = None
    cpus: int | None = None
    memory: str = ""
    time: str = ""
    partition: str = ""
    max_retries: int | None = None
    retry_backoff: str = ""
    on_unattended_stop: str = ""
    env: dict[str, str] = Field(default_factory=dict)
    mounts: dict[str, str] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)


def config_path() -> Path:
    if explicit := os.environ.get("TETHER_CONFIG"):
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "tether" / "config.toml"


def load_profile(name: str | None = None, path: Path | None = None) -> Profile:
    """The named profile (``None``: ``$TETHER_PROFILE``, else ``default``) over ``[default]``."""
    path = path or config_path()
    name = name or os.environ.get("TETHER_PROFILE") or "default"
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        if name != "default":
            raise ConfigError(f"profile {name!r}: there is no config file at {path}") from None
        return Profile()
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    base: dict[str, Any] = dict(data.get("default") or {})
    if name != "default":
        profiles = data.get("profiles") or {}
        if name not in profiles:
            known = ", ".join(sorted(profiles)) or "none"
            raise ConfigError(f"{path} has no profile {name!r} (profiles: {known})")
        overlay = profiles[name]
        for key in ("env", "mounts"):
            if key in overlay:
                overlay = {**overlay, key: {**base.get(key, {}), **overlay[key]}}
        base.update(overlay)
    try:
        return Profile.model_validate(base)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"{path}: profile {name!r}: {where}: {err['msg']}") from None
