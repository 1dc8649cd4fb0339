"""The user's configuration file: relay URL, credentials and run defaults, in profiles.

``$TETHER_CONFIG``, else ``$XDG_CONFIG_HOME/tether/config.toml``, else ``~/.config/tether/config.toml``::

    [default]                 # used unless --profile / $TETHER_PROFILE names another
    relay = "ws://127.0.0.1:8765"
    backend = "local"
    max_retries = 1
    outputs = ["out/", "*.csv"]

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

A file that holds a ``token`` must be readable by its owner only (mode 0600), as ssh insists for
its keys: the token lets anyone run code on the user's runs. ``tether token create --save`` writes
a token here (:func:`save_token`), creating the file with that mode; nothing writes into a file
that is not TOML (:class:`ConfigError`, naming it). ``tether up`` keeps its token in its data
directory, not here (``adapter/cli/stacks.py``).
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from protocol_specs.plain_words import invalid

__all__ = [
    "ConfigError",
    "Profile",
    "check_config",
    "config_path",
    "load_profile",
    "profile_token",
    "save_token",
]


class ConfigError(ValueError):
    pass


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    relay: str = ""
    token: str = ""
    #: a ``wss://`` relay's certificate is checked against this CA file (default: the system CAs)
    ca_file: str = ""
    backend: str = ""
    gpus: int | None = None
    cpus: int | None = None
    memory: str = ""
    time: str = ""
    partition: str = ""
    max_retries: int | None = None
    retry_backoff: str = ""
    #: how many of a run's checkpoints the relay keeps (``--keep-checkpoints``)
    keep_checkpoints: int | None = None
    on_unattended_stop: str = ""
    #: what acts when ``on_unattended_stop = "suspend"`` cannot (``--unattended-fallback``)
    unattended_fallback: str = ""
    #: ``tether run``: start Python programs so that ``tether attach`` can debug them later
    debuggable: bool | None = None
    #: an uncaught exception stops the program for an IDE instead of ending it
    post_mortem: bool | None = None
    #: a command names the Python environment it was submitted from by its path
    local_env: bool | None = None
    env: dict[str, str] = Field(default_factory=dict)
    mounts: dict[str, str] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)
    #: what runs produce (``--outputs``): globs relative to the run's directory
    outputs: list[str] = Field(default_factory=list)


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
        text, data = _read(path)
    except FileNotFoundError:
        if name != "default":
            raise ConfigError(f"profile {name!r}: there is no config file at {path}") from None
        return Profile()
    if _TOKEN_LINE.search(text) and path.stat().st_mode & 0o077:
        raise ConfigError(
            f"{path} holds a token but others can read it (mode "
            f"{path.stat().st_mode & 0o777:o}); run: chmod 600 {path}"
        )
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
        raise ConfigError(f"{path}: profile {name!r}: {invalid(exc)}") from None


_TOKEN_LINE = re.compile(r"^\s*token\s*=", re.MULTILINE)


def _read(path: Path) -> tuple[str, dict[str, Any]]:
    """The file's text and its TOML; ``FileNotFoundError`` if there is none, else one
    :class:`ConfigError` naming the file for anything unreadable (binary garbage included)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not a TOML file (byte {exc.start} is not UTF-8 text); fix or move it"
        ) from None
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def check_config(path: Path | None = None) -> Path:
    """The config file's path, once it is known to be absent or parseable (``ConfigError``
    otherwise): what a command checks before writing into it."""
    path = path or config_path()
    try:
        _read(path)
    except FileNotFoundError:
        pass
    return path


def profile_token(name: str = "default", path: Path | None = None) -> str:
    """The token a profile names in the file (not merged with ``[default]``), or ""."""
    try:
        _text, data = _read(path or config_path())
    except (OSError, ConfigError):
        return ""
    table = data.get("default") if name == "default" else (data.get("profiles") or {}).get(name)
    token = (table or {}).get("token", "")
    return token if isinstance(token, str) else ""


def save_token(token: str, name: str = "default", path: Path | None = None) -> Path:
    """Set ``token`` in profile ``name`` of the config file, keeping everything else as written;
    the file ends up (or is created) readable by its owner only. A file that is not TOML is never
    written into: :class:`ConfigError`, naming it."""
    path = path or config_path()
    header = "[default]" if name == "default" else f"[profiles.{name}]"
    try:
        lines = _read(path)[0].splitlines()
    except FileNotFoundError:
        lines = []
    line = f'token = "{token}"'
    start = next((i for i, text in enumerate(lines) if text.strip() == header), None)
    if start is None:
        lines = [header, line, "", *lines]
    else:
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")),
            len(lines),
        )
        found = [i for i in range(start + 1, end) if re.match(r"\s*token\s*=", lines[i])]
        if found:
            lines[found[0]] = line
        else:
            lines.insert(start + 1, line)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path
