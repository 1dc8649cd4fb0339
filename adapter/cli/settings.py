"""Where the CLI's settings come from: the tether home, the relay endpoint (flag, environment,
config profile, the local stacks ``tether up`` recorded), the relay's options, TLS, and the parsers of the
values users type (durations, amounts of memory, counts, ``NAME=VALUE`` pairs)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from adapter.config import ConfigError, Profile, load_profile
from protocol_specs.session.rank_values import parse_rank_list
from relay.client import Endpoint

__all__ = [
    "DEFAULT_ADAPTER_PORT",
    "DEFAULT_RELAY_PORT",
    "count",
    "is_loopback",
    "pairs",
    "parse_duration",
    "parse_memory",
    "parse_ranks",
    "profile",
    "read_credentials",
    "redact_url",
    "relay_config",
    "relay_url",
    "resolve_relay",
    "tether_home",
    "tls_context",
]

DEFAULT_ADAPTER_PORT = 5678
DEFAULT_RELAY_PORT = 8765


def tether_home() -> Path:
    return Path(os.environ.get("TETHER_HOME") or Path.home() / ".tether")


def profile(args: argparse.Namespace) -> Profile:
    """The config profile ``--profile`` (else ``$TETHER_PROFILE``, else the default) names."""
    try:
        return load_profile(getattr(args, "profile", None))
    except ConfigError as exc:
        raise SystemExit(f"tether: {exc}") from None


def resolve_relay(flag: str | None, args: argparse.Namespace | None = None) -> Endpoint:
    """The relay: ``--relay``, else ``TETHER_RELAY``, else the ``tether up`` stack ``--stack`` /
    ``TETHER_STACK`` names, else the config profile's, else the running stack (see
    :mod:`adapter.cli.stacks`); with the token to present: ``TETHER_TOKEN``, else the profile's
    when the profile named the relay, else the stack's when the relay is a running stack's, else
    the profile's; and the CA file to verify a ``wss://`` relay with (``--ca-file``,
    ``TETHER_CA_FILE``, the profile's ``ca_file``)."""
    from .stacks import choose, live_stacks, read_token, stack_at

    chosen = profile(args) if args is not None else Profile()
    home = tether_home()
    wanted = getattr(args, "stack", None) or os.environ.get("TETHER_STACK")
    url = flag or os.environ.get("TETHER_RELAY") or ""
    stack = None
    if not url and (wanted or not chosen.relay):
        picked = choose(
            live_stacks(home),
            Path(wanted).expanduser().resolve() if wanted else None,
            (home / "data").resolve(),
        )
        if isinstance(picked, str):
            raise SystemExit(f"tether: {picked}")
        stack, url = picked, picked.relay
    url = relay_url(url or chosen.relay)
    from_profile = not (flag or os.environ.get("TETHER_RELAY") or stack)
    if stack is None:
        stack = stack_at(home, url)
    token = os.environ.get("TETHER_TOKEN") or ""
    if not token and not (from_profile and chosen.token) and stack is not None:
        token = read_token(stack.data_dir)
    token = token or chosen.token
    ca_file = getattr(args, "ca_file", None) or os.environ.get("TETHER_CA_FILE") or chosen.ca_file
    return Endpoint(url, token=token, ca_file=ca_file)


def web_url(relay: str, path: str = "/ui", base: str = "") -> str:
    """The web view's address for ``path``: under ``base`` (the relay's ``public_url``, when its
    operator set one), else on the relay's own host and port over HTTP(S)."""
    if base:
        return base.rstrip("/") + path
    scheme, _, rest = relay.partition("://")
    host = rest.split("/", 1)[0]
    return f"{'https' if scheme == 'wss' else 'http'}://{host}{path}"


def relay_url(url: str) -> str:
    """A relay's WebSocket URL: ``ws://`` or ``wss://``; an ``http(s)://`` one is refused with the
    right spelling, a bare ``host:port`` is taken as ``ws://host:port``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return f"ws://{url}"
    if scheme in ("ws", "wss") and rest:
        return url
    if scheme in ("http", "https") and rest:
        fixed = f"{'wss' if scheme == 'https' else 'ws'}://{rest}"
        raise SystemExit(f"tether: the relay speaks WebSocket: use {fixed}, not {url}")
    raise SystemExit(f"tether: {url!r} is not a relay URL (ws://HOST:PORT or wss://HOST:PORT)")


def redact_url(url: str) -> str:
    """A URL with its password, if any, hidden."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.password:
        return url.replace(f":{parts.password}@", ":***@", 1)
    return url


def count(text: str) -> int:
    """A whole number from 1 to 1000 (``tether ls -n``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"{value} is not between 1 and 1000")
    return value


def parse_ranks(text: str) -> list[int]:
    """``0,3`` or ``0-3,8``: ranks of a torch.distributed job, as many as a focus and a spec
    take (:data:`~protocol_specs.session.rank_values.MAX_RANKS`), as the console's ``@ranks``."""
    try:
        return parse_rank_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h``, ``1d`` -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip().lower()
    scale = units.get(text[-1:], 0)
    number = text[:-1] if scale else text
    try:
        value = float(number) * (scale or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration (examples: 90, 90s, 30m, 2h, 1d)"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError("a duration cannot be negative")
    return value


def parse_memory(text: str) -> int:
    """``16G``, ``512M``, ``2048`` (MiB) -> MiB."""
    units = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
    raw = text.strip().lower().removesuffix("b").removesuffix("i")
    scale = units.get(raw[-1:], 0)
    try:
        value = float(raw[:-1] if scale else raw) * (scale or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an amount of memory (examples: 512M, 16G)"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError("memory cannot be negative")
    return int(value)


def pairs(items: list[str] | None, what: str, base: dict[str, str]) -> dict[str, str]:
    """``base`` updated with ``NAME=VALUE`` items (``--env``, ``--mount``)."""
    out = dict(base)
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"tether: {what} expects NAME=VALUE, got {item!r}")
        out[name] = value
    return out


def relay_config(args: argparse.Namespace) -> Any:
    """The relay's configuration from ``tether relay`` / ``tether up`` options."""
    from relay.config import RelayConfig
    from relay.store import Cap

    return RelayConfig(
        buffer_cap=Cap(entries=args.buffer_entries, bytes=args.buffer_mib * 1024 * 1024),
        lease=args.lease,
        claim_confirm=args.claim_confirm,
        retention=args.retention,
        ping_interval=args.ping_interval,
        ping_timeout=args.ping_timeout,
        max_connections=args.max_connections,
        max_control_connections=args.max_control_connections,
        max_active_runs=args.max_runs,
        max_active_sweeps=args.max_sweeps,
        blob_gc_interval=args.blob_gc,
        web=args.web,
        public_url=args.public_url or "",
    )


def public_url(url: str) -> str:
    """``--public-url``: an http(s) address with a host, nothing after it but a slash."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        raise argparse.ArgumentTypeError(f"expected http(s)://HOST[:PORT], not {url!r}")
    return url.rstrip("/")


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tls_context(cert: str | None, key: str | None) -> Any:
    """The relay's TLS context (``None`` without ``--tls-cert``); refuses half a configuration."""
    import ssl

    if not cert and not key:
        return None
    if not (cert and key):
        raise SystemExit("tether relay: --tls-cert and --tls-key go together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise SystemExit(f"tether relay: cannot load the TLS certificate or key: {exc}") from None
    return context


def read_credentials(path: str) -> dict[str, Any]:
    """The worker's credentials file (JSON: relay, run, attempt, token, ca_file); refused unless
    only its owner can read it."""
    file = Path(path)
    try:
        mode = file.stat().st_mode
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"tether: cannot read the credentials file {path}: {exc}") from None
    if mode & 0o077:
        raise SystemExit(
            f"tether: the credentials file {path} is readable by others "
            f"(mode {mode & 0o777:o}); it must be 0600"
        )
    if not isinstance(data, dict) or not isinstance(data.get("relay"), str):
        raise SystemExit(f"tether: the credentials file {path} names no relay")
    return data
