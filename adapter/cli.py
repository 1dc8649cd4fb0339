"""The ``tether`` command line."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeVar

import trio
from pydantic import ValidationError

from adapter.config import ConfigError, Profile, load_profile, profile_token, save_token
from adapter.render import Terminal, mib, runs_table, status_text
from protocol_specs.runs import KNOWN_BACKENDS, Resources, RunRecord, RunSpec
from relay.client import Endpoint, RelayError
from worker_shim.housekeeping import CACHE_MAX_BYTES, KEEP_RUNS

__all__ = ["main"]


_T = TypeVar("_T")

DEFAULT_ADAPTER_PORT = 5678
DEFAULT_RELAY_PORT = 8765


def tether_home() -> Path:
    return Path(os.environ.get("TETHER_HOME") or Path.home() / ".tether")


def endpoint_file() -> Path:
    return tether_home() / "endpoint.json"


def resolve_relay(flag: str | None, args: argparse.Namespace | None = None) -> Endpoint:
    """The relay: ``--relay``, else ``TETHER_RELAY``, else the config profile's, else what
    ``tether up`` recorded; with the token to present: ``TETHER_TOKEN``, else the profile's (the
    config file: ``tether up`` writes the local user's there), and the CA file to verify a
    ``wss://`` relay with (``--ca-file``, ``TETHER_CA_FILE``, the profile's ``ca_file``)."""
    profile = _profile(args) if args is not None else Profile()
    url = flag or os.environ.get("TETHER_RELAY") or profile.relay
    if not url:
        try:
            url = str(json.loads(endpoint_file().read_text())["relay"])
        except (OSError, ValueError, KeyError):
            raise SystemExit(
                "tether: no relay to talk to. Start one with `tether up` (in another terminal), "
                "or pass --relay ws://HOST:PORT / set TETHER_RELAY."
            ) from None
    token = os.environ.get("TETHER_TOKEN") or profile.token
    ca_file = getattr(args, "ca_file", None) or os.environ.get("TETHER_CA_FILE") or profile.ca_file
    return Endpoint(relay_url(url), token=token, ca_file=ca_file)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"{value} is not between 1 and 1000")
    return value


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


class Clock:
    """Prints status lines with the time since the command started."""

    def __init__(self, prefix: str, *, stream: Any = None) -> None:
        self.start = time.monotonic()
        self.prefix = prefix
        #: where the lines go (default stdout; ``tether run`` keeps stdout for the run id)
        self.stream = stream

    def say(self, text: str) -> None:
        line = f"[{time.monotonic() - self.start:7.2f}s] {self.prefix}{text}"
        print(line, file=self.stream or sys.stdout, flush=True)


def launch_json(port: int, run_id: str) -> str:
    entry = {
        "name": f"tether: run {run_id}",
        "type": "debugpy",
        "request": "attach",
        "connect": {"host": "127.0.0.1", "port": port},
        "justMyCode": True,
    }
    return json.dumps(entry, indent=2)


# --- commands --------------------------------------------------------------------------------------


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


def relay_config(args: argparse.Namespace) -> Any:
    from relay.server import RelayConfig
    from relay.store import Cap

    return RelayConfig(
        buffer_cap=Cap(entries=args.buffer_entries, bytes=args.buffer_mib * 1024 * 1024),
        lease=args.lease,
        retention=args.retention,
        ping_interval=args.ping_interval,
        ping_timeout=args.ping_timeout,
        max_connections=args.max_connections,
        max_control_connections=args.max_control_connections,
        max_active_runs=args.max_runs,
        blob_gc_interval=args.blob_gc,
    )


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


async def cmd_relay(args: argparse.Namespace) -> int:
    from relay.blobs import FileBlobStore
    from relay.server import serve_relay, server_port
    from relay.store import open_store

    tls = tls_context(args.tls_cert, args.tls_key)
    if tls is None and not is_loopback(args.host) and not args.insecure:
        raise SystemExit(
            f"tether relay: refusing to serve plain ws:// on {args.host}: tokens and every "
            "debugger message (which can run code on the workers) would cross the network "
            "unencrypted. Give --tls-cert and --tls-key (wss://), put a TLS-terminating proxy "
            "in front and bind to 127.0.0.1, or pass --insecure if this network is trusted."
        )
    config = relay_config(args)
    blobs = FileBlobStore(Path(args.blobs or tether_home() / "data" / "blobs"))
    async with open_store(args.redis) as store, trio.open_nursery() as nursery:
        try:
            server = await nursery.start(
                lambda task_status: serve_relay(
                    store,
                    host=args.host,
                    port=args.port,
                    config=config,
                    blobs=blobs,
                    ssl=tls,
                    task_status=task_status,
                )
            )
        except (OSError, BaseExceptionGroup) as exc:  # before serving: no address to listen on
            first = _leaves(exc)[0]
            if not isinstance(first, OSError):
                raise
            taken = first.errno == errno.EADDRINUSE
            raise SystemExit(
                f"tether relay: cannot listen on {args.host}:{args.port}: "
                f"{first.strerror or first}"
                + (" (another relay?); choose another with --port N" if taken else "")
            ) from None
        scheme = "wss" if tls is not None else "ws"
        print(
            f"tether relay: ready relay={scheme}://{args.host}:{server_port(server)} "
            f"redis={redact_url(args.redis)} blobs={blobs.root}",
            flush=True,
        )
        if tls is None and not is_loopback(args.host):
            print("tether relay: warning: serving without TLS (--insecure)", flush=True)
    return 0


def redact_url(url: str) -> str:
    """A URL with its password, if any, hidden."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.password:
        return url.replace(f":{parts.password}@", ":***@", 1)
    return url


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


async def cmd_worker(args: argparse.Namespace) -> int:
    from worker_shim.pool import run_one, run_pool

    clock = Clock("worker: ")
    work_dir = Path(args.work_dir or tether_home() / "worker").resolve()  # noqa: ASYNC240 (startup)
    relay: Endpoint
    if args.credentials:
        creds = read_credentials(args.credentials)
        relay = Endpoint(
            creds["relay"],
            token=str(creds.get("token") or ""),
            ca_file=str(creds.get("ca_file") or ""),
        )
        run_id = args.run or str(creds.get("run") or "")
        attempt = args.attempt or int(creds.get("attempt") or 0)
    else:
        relay = resolve_relay(args.relay, args)
        run_id, attempt = args.run or "", args.attempt or 0
    if run_id:
        if not attempt:
            raise SystemExit("tether: --run needs --attempt N (the attempt this job runs)")
        import socket

        try:
            code = await run_one(
                relay,
                run_id,
                attempt,
                work_dir=work_dir,
                worker=f"{socket.gethostname()}-{os.getpid()}",
                on_event=clock.say,
            )
        except RelayError as exc:
            raise SystemExit(f"tether worker: {exc.message}") from None
        return code if code is not None and code >= 0 else 1
    gpus = [g for g in args.gpus.split(",") if g] if args.gpus is not None else None
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: run_pool(
                relay,
                slots=args.slots,
                start_delay=args.start_delay,
                work_dir=work_dir,
                gpus=gpus,
                name=args.name,
                on_event=clock.say,
                keep_runs=args.keep_runs,
                cache_max=args.cache_max * 2**20,
                task_status=task_status,
            )
        )
        print(
            f"tether worker: ready relay={relay.url} slots={args.slots} work_dir={work_dir}",
            flush=True,
        )
    return 0


async def cmd_up(args: argparse.Namespace) -> int:

    data_dir = Path(args.data_dir or tether_home() / "data").resolve()  # noqa: ASYNC240 (startup)
    data_dir.mkdir(parents=True, exist_ok=True)
    clock = Clock("")
    try:
        return await _up(args, data_dir, clock)
    except* (RuntimeError, OSError) as group:  # the stack could not start: say why, no traceback
        if _UP_READY:
            raise
        first = _leaves(group)[0]
        if isinstance(first, OSError) and first.errno == errno.EADDRINUSE:
            raise SystemExit(
                f"tether up: the relay's port {args.relay_port} is in use (another tether up?); "
                "stop that one, or choose another with --relay-port N"
            ) from None
        raise SystemExit(f"tether up: {first}") from None


#: whether ``tether up`` got as far as serving (failures after that are not start-up failures)
_UP_READY: list[bool] = []


async def _up(args: argparse.Namespace, data_dir: Path, clock: Clock) -> int:
    from adapter.config import config_path
    from adapter.local_stack import open_local_stack

    async with open_local_stack(
        data_dir,
        token=os.environ.get("TETHER_TOKEN") or profile_token(),
        redis=args.redis,
        relay_config=relay_config(args),
        relay_port=args.relay_port,
        workers=args.workers,
        start_delay=args.start_delay,
        gpus=[g for g in args.gpus.split(",") if g] if args.gpus is not None else None,
        on_worker_event=clock.say,
        pool_bounds=(args.keep_runs, args.cache_max * 2**20),
    ) as stack:
        relay, redis_url = stack.relay, stack.redis
        if stack.minted:
            try:
                where = save_token(stack.token)
            except OSError as exc:
                raise SystemExit(f"tether up: cannot save the token: {exc}") from None
            print(f"tether up: a token for {stack.user} is in {where} (mode 0600)", flush=True)
        else:
            print(f"tether up: using {stack.user}'s token from {config_path()}", flush=True)
        endpoint_file().parent.mkdir(parents=True, exist_ok=True)
        endpoint_file().write_text(
            json.dumps({"relay": relay, "pid": os.getpid(), "data_dir": str(data_dir)})
        )
        print(f"tether up: ready relay={relay} data={data_dir}", flush=True)
        _UP_READY.append(True)
        print(
            f"  redis: {redis_url}\n  workers: {args.workers} (start delay {args.start_delay:g} s)\n"
            "  in another terminal: tether debug -- python your_script.py",
            flush=True,
        )
        try:
            await trio.sleep_forever()
        finally:
            try:
                if json.loads(endpoint_file().read_text()).get("pid") == os.getpid():
                    endpoint_file().unlink()
            except (OSError, ValueError):
                pass
    return 0


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


def _profile(args: argparse.Namespace) -> Profile:
    try:
        return load_profile(getattr(args, "profile", None))
    except ConfigError as exc:
        raise SystemExit(f"tether: {exc}") from None


def _pairs(items: list[str] | None, what: str, base: dict[str, str]) -> dict[str, str]:
    out = dict(base)
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"tether: {what} expects NAME=VALUE, got {item!r}")
        out[name] = value
    return out


def build_spec(args: argparse.Namespace, *, debug: bool) -> RunSpec:
    """The run spec for ``tether debug`` / ``tether run`` arguments over the config profile."""
    profile = _profile(args)
    for name in (
        "env",
        "secret",
        "mount",
        "tag",
        "mem",
        "time",
        "retry_backoff",
        "name",
        "workdir",
    ):
        if not hasattr(args, name):
            setattr(args, name, None)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise SystemExit(
            "tether: give the command to run after --, e.g. tether debug -- python train.py"
        )
    if debug:  # said now, not after the queue wait: the worker would refuse it the same way
        from worker_shim.debuggee import split_python_command

        try:
            split_python_command(command)
        except ValueError as exc:
            raise SystemExit(
                f"tether: {exc} (tether run runs any command, without the debugger)"
            ) from None
    workdir = Path(args.workdir or os.getcwd()).resolve()
    if not workdir.is_dir():
        raise SystemExit(f"tether: --workdir {args.workdir}: no such directory")

    def pick(name: str, default: Any) -> Any:
        value = getattr(args, name, None)
        if value is not None:
            return value
        from_profile = getattr(profile, name, None)
        return from_profile if from_profile not in (None, "") else default

    secrets = {}
    for item in args.secret or []:
        name, sep, value = item.partition("=")
        if not sep:
            if name not in os.environ:
                raise SystemExit(f"tether: --secret {name}: no such variable in your environment")
            value = os.environ[name]
        secrets[name] = value
    try:
        memory = args.mem if args.mem is not None else parse_memory(profile.memory or "0")
        time_limit = args.time if args.time is not None else parse_duration(profile.time or "0")
        backoff = (
            args.retry_backoff
            if args.retry_backoff is not None
            else parse_duration(profile.retry_backoff or "10")
        )
        return RunSpec(
            command=command,
            workdir=str(workdir),
            debug=debug,
            wait_for_ide=not getattr(args, "no_wait", False),
            env={**_pairs(args.env, "--env", profile.env), **secrets},
            secret_env=sorted(secrets),
            name=args.name or "",
            client_os="windows" if os.name == "nt" else "unix",
            on_unattended_stop=pick("on_unattended_stop", "wait"),
            unattended_timeout=getattr(args, "unattended_timeout", None) or 1800.0,
            webhook=getattr(args, "webhook", None) or "",
            resources=Resources(
                gpus=pick("gpus", 0),
                cpus=pick("cpus", 1),
                memory_mb=memory,
                time_limit=time_limit,
                partition=pick("partition", ""),
            ),
            mounts=_pairs(args.mount, "--mount", profile.mounts),
            max_retries=pick("max_retries", 0),
            retry_backoff=backoff,
            tags=[*profile.tags, *(args.tag or [])],
            backend=_backend(pick("backend", "local")),
        )
    except argparse.ArgumentTypeError as exc:
        raise SystemExit(f"tether: in the config profile: {exc}") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise SystemExit(f"tether: invalid run: {where}: {err['msg']}") from None


def _backend(name: str) -> str:
    if name not in KNOWN_BACKENDS:
        raise SystemExit(
            f"tether: unknown backend {name!r}: use {' or '.join(KNOWN_BACKENDS)} "
            "(a run for a backend nobody serves would wait in its queue for ever)"
        )
    return name


class Progress:
    """One line of progress: redrawn in place on a terminal, a few lines elsewhere."""

    def __init__(self, clock: Clock, what: str) -> None:
        self.clock = clock
        self.what = what
        self.tty = (clock.stream or sys.stdout).isatty()
        self.shown = -1

    def __call__(self, done: int, total: int) -> None:
        if total < 4 * 1024 * 1024:
            return  # over in a moment: the summary line says what was sent
        pct = int(done * 100 / total)
        step = pct if self.tty else pct // 25 * 25
        if step == self.shown:
            return
        self.shown = step
        text = f"{self.what}: {mib(done)} of {mib(total)} ({pct}%)"
        if self.tty:
            end = "\n" if done >= total else ""
            print(
                f"\r[{time.monotonic() - self.clock.start:7.2f}s] {text}",
                end=end,
                file=self.clock.stream or sys.stdout,
                flush=True,
            )
        else:
            self.clock.say(text)


async def submit_run(
    relay: Endpoint,
    spec: RunSpec,
    say: Callable[[str], None],
    *,
    limit: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> RunRecord:
    """Snapshot the working directory, upload what the relay lacks, submit the run."""
    from adapter.snapshot import (
        DEFAULT_LIMIT,
        HashCache,
        SnapshotError,
        build_snapshot,
        upload_snapshot,
    )
    from relay.client import open_control

    root = Path(spec.workdir)
    cache = HashCache.for_tree(tether_home() / "cache" / "snapshots", root)
    try:
        snapshot = build_snapshot(root, limit=limit or DEFAULT_LIMIT, cache=cache)
    except SnapshotError as exc:
        raise SystemExit(f"tether: {exc}") from None
    for warning in snapshot.warnings:
        say(f"warning: {warning}")
    manifest = snapshot.manifest
    async with open_control(relay, client="tether-cli") as control:
        try:
            uploaded = await upload_snapshot(control, snapshot, progress or (lambda _d, _t: None))
        except SnapshotError as exc:
            raise SystemExit(f"tether: {exc}") from None
        record = await _control_call(control.submit(spec, manifest))
    say(
        f"submitted run {record.id}: {' '.join(spec.command)} ({len(manifest.entries)} files, "
        f"{mib(manifest.total_bytes)}; uploaded {uploaded.blobs} new files, "
        f"{mib(uploaded.bytes)}; {uploaded.reused} already on the relay)"
    )
    return record


async def cmd_debug(args: argparse.Namespace) -> int:
    relay = resolve_relay(args.relay, args)
    clock = Clock("")
    spec = build_spec(args, debug=True)
    _port_free(args.port)  # before submitting: nothing to clean up if it is taken
    record = await submit_run(
        relay, spec, clock.say, limit=args.snapshot_limit, progress=Progress(clock, "uploading")
    )
    _SERVING.append(record.id)
    return await _serve(
        relay,
        record.id,
        args.port,
        args.request_timeout,
        clock,
        announce="queued",
        quiet=args.quiet,
    )


async def cmd_attach(args: argparse.Namespace) -> int:
    relay = resolve_relay(args.relay, args)
    clock = Clock("")
    _port_free(args.port)
    args.run = await full_run_id(relay, args.run)
    _SERVING.append(args.run)
    return await _serve(
        relay,
        args.run,
        args.port,
        args.request_timeout,
        clock,
        announce="attached",
        quiet=args.quiet,
        from_end=True,
    )


async def _serve(
    relay: Endpoint,
    run_id: str,
    port: int,
    request_timeout: float,
    clock: Clock,
    *,
    announce: str,
    quiet: bool = False,
    from_end: bool = False,
) -> int:
    """Serve the run's adapter until the run ends; unless ``quiet``, print the program's output
    here as it comes (from the end of what it printed so far with ``from_end``: an attach)."""
    from adapter.core import AdapterCore
    from adapter.server import serve_adapter

    async with trio.open_nursery() as nursery:
        result: dict[str, AdapterCore] = {}
        served, printed = trio.Event(), trio.Event()
        if quiet:
            printed.set()
        else:
            nursery.start_soon(_print_output, relay, run_id, from_end, printed)

        def unattended(text: str) -> None:
            # the user may be anywhere but at the IDE: the terminal rings, the desktop shows it
            print(f"\a{text}", flush=True)
            nursery.start_soon(_desktop_notice, text)

        async def serve(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
            result["core"] = await serve_adapter(
                relay,
                run_id,
                port=port,
                request_timeout=request_timeout,
                on_event=clock.say,
                on_unattended=unattended,
                task_status=task_status,
            )
            served.set()

        bound = await nursery.start(serve)
        print(f"tether debug: run {run_id} {announce}; adapter on 127.0.0.1:{bound}", flush=True)
        print("Attach your IDE to it. VS Code launch.json entry:", flush=True)
        print(launch_json(bound, run_id), flush=True)
        await served.wait()
        with trio.move_on_after(OUTPUT_GRACE):
            await printed.wait()  # the run ended: the rest of its output, then stop following
        nursery.cancel_scope.cancel()
    session = result["core"].session
    code = session.exit_code
    clock.say(f"run {run_id} ended ({session.status}, exit code {code})")
    # the program's own exit code; a run that never exited normally (cancelled, killed) is a failure
    return code if code is not None and code >= 0 else 1


def _port_free(port: int) -> None:
    """Refuse, before anything is submitted or served, an adapter port that is taken."""
    if port == 0:
        return
    import socket

    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            from adapter.peer import listener_of

            holder = listener_of(port)
            raise SystemExit(
                f"tether: 127.0.0.1:{port} is in use{f' by {holder}' if holder else ''} "
                "(another tether debug or attach?); choose another with --port N, or --port 0 "
                "for any free one"
            ) from None


#: after the run ended, how long the terminal still waits for the rest of the program's output
OUTPUT_GRACE = 10.0


async def _print_output(relay: Endpoint, run_id: str, from_end: bool, done: trio.Event) -> None:
    """The program's stdout and stderr, as it prints them, on this terminal's; ``done`` once the
    run's logs say it finished (or they cannot be followed: the adapter says why)."""
    from protocol_specs import wire
    from relay.client import follow_logs

    terminal = Terminal()

    def show(entry: wire.LogEntry | wire.StatusEntry) -> None:
        if isinstance(entry, wire.LogEntry):
            terminal.write(entry.stream, entry.data)

    try:
        await follow_logs(relay, run_id, show, from_end=from_end)
    except (RelayError, OSError):
        pass
    finally:
        terminal.end()
        done.set()


async def _desktop_notice(text: str) -> None:
    from adapter.notify import notify_desktop

    await notify_desktop("tether: a breakpoint is waiting", text)


async def cmd_run(args: argparse.Namespace) -> int:
    """Submit; stdout gets the run id alone (or its record with ``--json``: scripts read it),
    progress goes to stderr. With ``-f``, stdout is the program's output."""
    relay = resolve_relay(args.relay, args)
    clock = Clock("", stream=sys.stderr)
    record = await submit_run(
        relay,
        build_spec(args, debug=False),
        clock.say,
        limit=args.snapshot_limit,
        progress=Progress(clock, "uploading"),
    )
    print(f"tether run: run {record.id} queued", file=sys.stderr, flush=True)
    if args.follow:
        return await _follow(relay, record.id)
    print(record.redacted().model_dump_json(indent=2) if args.json else record.id, flush=True)
    return 0


async def _follow(relay: Endpoint, run_id: str, *, follow: bool = True) -> int:
    """Print a run's output as it comes; the run's exit code once it ends (follow)."""
    from protocol_specs import wire
    from relay.client import follow_logs

    ended: dict[str, wire.StatusEntry] = {}
    terminal = Terminal()

    def show(entry: wire.LogEntry | wire.StatusEntry) -> None:
        if isinstance(entry, wire.LogEntry):
            terminal.write(entry.stream, entry.data)
            return
        terminal.end()
        if entry.event == "finished":
            ended["entry"] = entry
            code = f", exit code {entry.exit_code}" if entry.exit_code is not None else ""
            text = f"run {run_id} {entry.state}{code}"
            if entry.detail and entry.state != "succeeded":
                text += f": {entry.detail}"
        else:
            text = entry.detail or entry.event
        print(f"-- tether: {text}", file=sys.stderr, flush=True)

    try:
        await follow_logs(relay, run_id, show, follow=follow)
    except RelayError as exc:
        raise SystemExit(f"tether: {exc.message}") from None
    finally:
        terminal.end()
    final = ended.get("entry")
    if final is None:
        return 0
    return 0 if final.state == "succeeded" else (final.exit_code or 1)


async def cmd_logs(args: argparse.Namespace) -> int:
    relay = resolve_relay(args.relay, args)
    code = await _follow(relay, await full_run_id(relay, args.run), follow=args.follow)
    return code if args.follow else 0


async def cmd_rerun(args: argparse.Namespace) -> int:
    from relay.client import open_control

    relay = resolve_relay(args.relay, args)
    clock = Clock("")
    async with open_control(relay, client="tether-cli") as control:
        record = await _control_call(control.rerun(args.run))
    clock.say(
        f"run {record.id} queued: a rerun of {args.run} (same snapshot {record.snapshot[:12]}, "
        f"same command: {' '.join(record.spec.command)})"
    )
    if record.spec.debug:
        return await _serve(
            relay, record.id, args.port, args.request_timeout, clock, announce="queued"
        )
    if args.follow:
        return await _follow(relay, record.id)
    return 0


async def _control_call(call: Awaitable[_T]) -> _T:
    try:
        return await call
    except RelayError as exc:
        raise SystemExit(f"tether: {exc.message}") from None


async def cmd_cancel(args: argparse.Namespace) -> int:
    from relay.client import open_control

    async with open_control(resolve_relay(args.relay, args), client="tether-cli") as control:
        before = await _control_call(control.get_run(args.run))
        if before.finished:
            print(
                f"tether: run {before.id} had already ended ({before.state.value}); "
                "nothing to cancel",
                file=sys.stderr,
            )
            return 1
        record = await _control_call(control.cancel(before.id))
    print(f"run {record.id}: {record.state.value}")
    return 0


async def full_run_id(relay: Endpoint, run: str) -> str:
    """The whole id of the run ``run`` names (an id, or a unique prefix of one)."""
    from relay.client import open_control

    async with open_control(relay, client="tether-cli") as control:
        return (await _control_call(control.get_run(run))).id


async def cmd_ls(args: argparse.Namespace) -> int:
    from relay.client import open_control

    async with open_control(resolve_relay(args.relay, args), client="tether-cli") as control:
        records = await _control_call(control.list_runs(args.limit))
    if args.json:
        print(json.dumps([r.model_dump(mode="json") for r in records], indent=2))
    else:
        print(runs_table(records, time.time()))
    return 0


async def cmd_status(args: argparse.Namespace) -> int:
    from relay.client import open_control

    async with open_control(resolve_relay(args.relay, args), client="tether-cli") as control:
        record = await _control_call(control.get_run(args.run))
    if args.json:
        print(record.model_dump_json(indent=2))
    else:
        print(status_text(record, time.time()))
    return 0


async def cmd_backend(args: argparse.Namespace) -> int:
    from worker_shim.slurm import SlurmBackend

    relay = resolve_relay(args.relay, args)
    clock = Clock("slurm: ")
    state_dir = Path(args.state_dir or tether_home() / "slurm").resolve()  # noqa: ASYNC240 (startup)
    backend = SlurmBackend(
        relay,
        state_dir=state_dir,
        worker_relay=args.worker_relay or relay.url,
        python=args.python,
        poll=args.poll,
        sbatch_args=args.sbatch_arg or [],
        on_event=clock.say,
    )
    print(f"tether backend slurm: ready relay={relay} state_dir={state_dir}", flush=True)
    await backend.serve()
    return 0


def _scopes(args: argparse.Namespace) -> list[Any]:
    from protocol_specs.auth import Scope

    return sorted({Scope(name) for name in (args.scope or ["runs"])})


async def cmd_token_create(args: argparse.Namespace) -> int:
    from protocol_specs.auth import TokenInfo

    if args.redis:
        import getpass

        from relay.auth import TokenStore
        from relay.store import open_store

        async with open_store(args.redis) as store:
            token, record = await TokenStore(store).create(
                args.user or getpass.getuser(),
                scopes=_scopes(args),
                label=args.label,
                expires_in=args.expires,
                created_by="tether token create --redis",
            )
        info: TokenInfo = record.info()
    else:
        from relay.client import open_control

        async with open_control(resolve_relay(args.relay, args), client="tether-cli") as control:
            token, info = await _control_call(
                control.create_token(
                    user=args.user, scopes=_scopes(args), label=args.label, expires_in=args.expires
                )
            )
    what = f"token {info.id} for {info.user} ({', '.join(info.scopes)})"
    if args.save:
        where = save_token(token, getattr(args, "profile", None) or "default")
        print(f"tether: {what} saved in {where}")
    else:
        print(token)
        print(f"tether: {what}; shown once: keep it like a password", file=sys.stderr)
    return 0


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(at)) if at else "-"


async def cmd_token_list(args: argparse.Namespace) -> int:
    from relay.client import open_control

    async with open_control(resolve_relay(args.relay, args), client="tether-cli") as control:
        tokens = await _control_call(control.list_tokens(args.user))
    if args.json:
        print(json.dumps([t.model_dump(mode="json") for t in tokens], indent=2))
        return 0
    now = time.time()
    print(f"{'ID':<17} {'USER':<12} {'SCOPES':<18} {'CREATED':<16} {'STATE':<18} LABEL")
    for t in tokens:
        state = "active"
        if t.revoked_at:
            state = f"revoked {_when(t.revoked_at)[5:]}"
        elif t.expires_at and t.expires_at <= now:
            state = "expired"
        elif t.expires_at:
            state = f"until {_when(t.expires_at)[:10]}"
        scopes = ",".join(t.scopes)
        print(
            f"{t.id:<17} {t.user:<12} {scopes:<18} {_when(t.created_at):<16} {state:<18} {t.label}"
        )
    return 0


async def cmd_token_revoke(args: argparse.Namespace) -> int:
    from relay.client import open_control

    async with open_control(resolve_relay(args.relay, args), client="tether-cli") as control:
        info = await _control_call(control.revoke_token(args.id))
    print(f"tether: token {info.id} of {info.user} revoked")
    return 0


async def cmd_audit(args: argparse.Namespace) -> int:
    from relay.client import open_control

    async with open_control(resolve_relay(args.relay, args), client="tether-cli") as control:
        entries = await _control_call(control.audit(args.run))
    if args.json:
        print(json.dumps([e.model_dump(mode="json") for e in entries], indent=2))
        return 0
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.at))
        who = f"{e.user or '?'} (token {e.token or '-'})"
        role = f" as {e.role}" if e.role else ""
        detail = f": {e.detail}" if e.detail else ""
        client = f" [{e.client}]" if e.client else ""
        print(f"{when}  {e.event:<8} {who}{role} from {e.source or '?'}{client}{detail}")
    return 0


async def cmd_demo(args: argparse.Namespace) -> int:
    from adapter.demo import run_demo

    return await run_demo(start_delay=args.start_delay, keep=args.keep)


# --- parser ----------------------------------------------------------------------------------------


def relay_options(s: argparse.ArgumentParser) -> None:
    from relay.server import RelayConfig

    d = RelayConfig()
    g = s.add_argument_group("relay")
    g.add_argument(
        "--lease",
        type=parse_duration,
        default=d.lease,
        metavar="DURATION",
        help=f"a worker silent this long loses its run (default {d.lease:g}s)",
    )
    g.add_argument(
        "--retention",
        type=parse_duration,
        default=d.retention,
        metavar="DURATION",
        help="keep a finished run's messages this long (default 7d)",
    )
    g.add_argument(
        "--buffer-entries",
        type=int,
        default=d.buffer_cap.entries,
        metavar="N",
        help=f"most unread messages per run and direction (default {d.buffer_cap.entries})",
    )
    g.add_argument(
        "--buffer-mib",
        type=int,
        default=d.buffer_cap.bytes // (1024 * 1024),
        metavar="MIB",
        help=f"most unread bytes per run and direction (default {d.buffer_cap.bytes >> 20})",
    )
    g.add_argument(
        "--ping-interval",
        type=parse_duration,
        default=d.ping_interval,
        metavar="DURATION",
        help=f"WebSocket ping interval (default {d.ping_interval:g}s)",
    )
    g.add_argument(
        "--ping-timeout",
        type=parse_duration,
        default=d.ping_timeout,
        metavar="DURATION",
        help=f"drop a peer that misses a pong this long (default {d.ping_timeout:g}s)",
    )
    g.add_argument(
        "--max-connections",
        type=int,
        default=d.max_connections,
        metavar="N",
        help="most IDE and logs connections of one user to this relay process "
        f"(default {d.max_connections})",
    )
    g.add_argument(
        "--max-control-connections",
        type=int,
        default=d.max_control_connections,
        metavar="N",
        help="most control connections (CLI, worker pools) of one user to this relay process, "
        f"counted apart from IDE links (default {d.max_control_connections})",
    )
    g.add_argument(
        "--blob-gc",
        type=parse_duration,
        default=d.blob_gc_interval,
        metavar="DURATION",
        help="how often snapshot blobs no live run names are deleted (0: never; default "
        f"{d.blob_gc_interval / 3600:g}h; a blob used within a day is spared)",
    )
    g.add_argument(
        "--max-runs",
        type=int,
        default=d.max_active_runs,
        metavar="N",
        help=f"most unfinished runs of one user (default {d.max_active_runs})",
    )


def _run_options(s: argparse.ArgumentParser, *, debug: bool) -> None:
    """Options of ``tether run`` and ``tether debug`` (defaults: the config profile's)."""
    s.add_argument("--profile", help="config profile (default: $TETHER_PROFILE, else default)")
    s.add_argument(
        "--workdir", help="the directory to snapshot and run in (default: the current directory)"
    )
    s.add_argument(
        "--env", action="append", metavar="NAME=VALUE", help="environment for the program"
    )
    s.add_argument(
        "--secret",
        action="append",
        metavar="NAME[=VALUE]",
        help="a secret environment variable for the program (its value from your environment "
        "if not given): hidden in tether ls/status and blanked in the logs (repeatable)",
    )
    s.add_argument("--name", help="a label for the run")
    s.add_argument("--tag", action="append", metavar="TAG", help="a tag for the run (repeatable)")
    g = s.add_argument_group("resources and placement")
    g.add_argument(
        "--backend", choices=KNOWN_BACKENDS, help="where to run: local (default) or slurm"
    )
    g.add_argument("--gpus", type=int, metavar="N", help="GPUs for the run (default 0)")
    g.add_argument("--cpus", type=int, metavar="N", help="CPUs for the run (default 1)")
    g.add_argument(
        "--mem", type=parse_memory, metavar="SIZE", help="memory, e.g. 16G (Slurm --mem)"
    )
    g.add_argument(
        "--time", type=parse_duration, metavar="DURATION", help="time limit, e.g. 4h (Slurm --time)"
    )
    g.add_argument("--partition", help="Slurm partition")
    g.add_argument(
        "--mount",
        action="append",
        metavar="NAME=PATH_OR_URL",
        help="data for the run, given to it as $TETHER_MOUNT_<NAME> (repeatable)",
    )
    g = s.add_argument_group("retries")
    g.add_argument(
        "--max-retries",
        type=int,
        metavar="N",
        help="retry a failed or lost attempt up to N times (default 0)",
    )
    g.add_argument(
        "--retry-backoff",
        type=parse_duration,
        metavar="DURATION",
        help="wait before the first retry, doubling each time (default 10s)",
    )
    s.add_argument(
        "--snapshot-limit",
        type=lambda text: parse_memory(text) * 1024 * 1024,
        default=0,
        metavar="SIZE",
        help="refuse to snapshot more than this (default 2G)",
    )
    if not debug:
        s.add_argument(
            "-f", "--follow", action="store_true", help="print the run's output until it ends"
        )
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")


def _adapter_options(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--port",
        type=int,
        default=DEFAULT_ADAPTER_PORT,
        help=f"adapter port on 127.0.0.1 (default {DEFAULT_ADAPTER_PORT}; 0 = any free)",
    )
    s.add_argument(
        "--request-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="error a request the debugger leaves unanswered after S seconds (default 30)",
    )
    s.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="do not print the program's output here (the IDE and `tether logs` still have it)",
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tether")
    except PackageNotFoundError:
        return "(not installed)"


class _Parser(argparse.ArgumentParser):
    """No abbreviated options: ``--gpu 2`` is refused, not taken as ``--gpus 2``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tether", description="Asynchronous debugging for ML runs.")
    p.add_argument("--version", action="version", version=f"tether {_version()}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def relay_flag(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--relay",
            help="relay URL (default: $TETHER_RELAY, the config profile's, else what `tether up` "
            "recorded)",
        )
        sp.add_argument(
            "--ca-file",
            metavar="FILE",
            help="verify a wss:// relay's certificate against this CA file (default: "
            "$TETHER_CA_FILE, the profile's ca_file, else the system CAs)",
        )
        if not any(a.dest == "profile" for a in sp._actions):
            sp.add_argument("--profile", help="config profile (default: $TETHER_PROFILE)")

    def gpus_flag(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--gpus",
            metavar="LIST",
            help="GPU indices the pool hands out, e.g. 0,1,2,3 (default: what nvidia-smi lists)",
        )
        sp.add_argument(
            "--keep-runs",
            type=int,
            default=KEEP_RUNS,
            metavar="N",
            help=f"run directories (and logs) kept on this worker, newest first (default {KEEP_RUNS})",
        )
        sp.add_argument(
            "--cache-max",
            type=parse_memory,
            default=CACHE_MAX_BYTES // 2**20,
            metavar="SIZE",
            help=f"most the snapshot blob cache holds, e.g. 50G (default {CACHE_MAX_BYTES // 2**30}G)",
        )

    s = sub.add_parser(
        "up", help="run the embedded stack: Redis-compatible server, relay, local worker pool"
    )
    s.add_argument(
        "--data-dir", help="where data lives (default: $TETHER_HOME/data, TETHER_HOME=~/.tether)"
    )
    s.add_argument("--workers", type=int, default=2, help="local worker slots (default 2)")
    gpus_flag(s)
    s.add_argument(
        "--start-delay",
        type=float,
        default=0.0,
        metavar="S",
        help="wait S seconds before starting a claimed run (a stand-in GPU queue)",
    )
    s.add_argument(
        "--relay-port",
        type=int,
        default=DEFAULT_RELAY_PORT,
        help=f"relay port on 127.0.0.1 (default {DEFAULT_RELAY_PORT}; 0 = any free)",
    )
    s.add_argument(
        "--redis", help="use this Redis/Valkey URL instead of starting the bundled server"
    )
    relay_options(s)
    s.set_defaults(fn=cmd_up)

    s = sub.add_parser("debug", help="submit a run in debug mode and serve the local DAP adapter")
    _run_options(s, debug=True)
    relay_flag(s)
    _adapter_options(s)
    s.add_argument(
        "--no-wait",
        action="store_true",
        help="start the program when the worker starts, even if no IDE configured breakpoints yet",
    )
    s.add_argument(
        "--on-unattended-stop",
        choices=["wait", "continue", "terminate"],
        help="when the program pauses and no IDE is attached: wait for one (default; "
        "the run keeps its GPUs meanwhile), or continue / terminate after --unattended-timeout",
    )
    s.add_argument(
        "--unattended-timeout",
        type=parse_duration,
        default=1800.0,
        metavar="DURATION",
        help="how long an unattended stop lasts before continue/terminate act "
        "(e.g. 90s, 30m, 2h; default 30m)",
    )
    s.add_argument(
        "--webhook",
        metavar="URL",
        help="POST a JSON notice here when the program pauses with no IDE attached",
    )
    s.set_defaults(fn=cmd_debug)

    s = sub.add_parser("run", help="submit a run without the debugger")
    _run_options(s, debug=False)
    relay_flag(s)
    s.add_argument(
        "--json", action="store_true", help="print the run's record as JSON (default: its id)"
    )
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("attach", help="serve the local DAP adapter for an existing run")
    relay_flag(s)
    s.add_argument(
        "run", help="the run: its id, a unique prefix of it (4+ characters), or its name"
    )
    _adapter_options(s)
    s.set_defaults(fn=cmd_attach)

    s = sub.add_parser("ls", help="list runs, newest first")
    relay_flag(s)
    s.add_argument(
        "-n", "--limit", type=_count, default=30, help="how many, 1 to 1000 (default 30)"
    )
    s.add_argument("--json", action="store_true", help="the run records as JSON")
    s.set_defaults(fn=cmd_ls)

    s = sub.add_parser("status", help="show a run: state, snapshot, resources, attempts")
    relay_flag(s)
    s.add_argument(
        "run", help="the run: its id, a unique prefix of it (4+ characters), or its name"
    )
    s.add_argument("--json", action="store_true", help="the run record as JSON")
    s.set_defaults(fn=cmd_status)

    s = sub.add_parser("logs", help="print a run's output (stdout and stderr)")
    relay_flag(s)
    s.add_argument(
        "run", help="the run: its id, a unique prefix of it (4+ characters), or its name"
    )
    s.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")
    s.set_defaults(fn=cmd_logs)

    s = sub.add_parser("cancel", help="cancel a run (queued, running or paused)")
    relay_flag(s)
    s.add_argument(
        "run", help="the run: its id, a unique prefix of it (4+ characters), or its name"
    )
    s.set_defaults(fn=cmd_cancel)

    s = sub.add_parser(
        "rerun", help="run again with the same snapshot and command (debug runs get an adapter)"
    )
    relay_flag(s)
    s.add_argument(
        "run", help="the run: its id, a unique prefix of it (4+ characters), or its name"
    )
    s.add_argument("-f", "--follow", action="store_true", help="print the new run's output")
    _adapter_options(s)
    s.set_defaults(fn=cmd_rerun)

    s = sub.add_parser("relay", help="run the relay service")
    s.add_argument(
        "--redis",
        default=os.environ.get("TETHER_REDIS", "redis://127.0.0.1:6379"),
        help="Redis >= 6.2 or Valkey URL (redis://, unix://; default $TETHER_REDIS)",
    )
    s.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; others need TLS)",
    )
    s.add_argument(
        "--port",
        type=int,
        default=DEFAULT_RELAY_PORT,
        help=f"port to listen on (default {DEFAULT_RELAY_PORT}; 0: any free one)",
    )
    s.add_argument("--tls-cert", metavar="PEM", help="serve wss:// with this certificate (chain)")
    s.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    s.add_argument(
        "--insecure",
        action="store_true",
        help="allow plain ws:// on an address other than loopback (a trusted network only)",
    )
    s.add_argument(
        "--blobs",
        metavar="DIR",
        help="where snapshot blobs live (default $TETHER_HOME/data/blobs; relays sharing a Redis "
        "must share it)",
    )
    relay_options(s)
    s.set_defaults(fn=cmd_relay)

    s = sub.add_parser(
        "worker", help="run a worker pool, or (--run) the one attempt a scheduler job was made for"
    )
    relay_flag(s)
    s.add_argument("--slots", type=int, default=1, help="runs this pool runs at once (default 1)")
    gpus_flag(s)
    s.add_argument(
        "--start-delay",
        type=float,
        default=0.0,
        metavar="S",
        help="wait S seconds before starting a claimed run (a stand-in GPU queue)",
    )
    s.add_argument(
        "--work-dir", help="where run directories are made (default: $TETHER_HOME/worker)"
    )
    s.add_argument(
        "--name", help="the pool's name in `tether status` (default HOST-pool; slots add -N)"
    )
    s.add_argument("--run", help="run this run's attempt only, then exit")
    s.add_argument("--attempt", type=int, default=0, help="with --run: the attempt number")
    s.add_argument(
        "--credentials",
        metavar="FILE",
        help="a 0600 JSON file naming the relay (and run, attempt); never put these on the "
        "command line",
    )
    s.set_defaults(fn=cmd_worker)

    s = sub.add_parser(
        "backend", help="run a scheduler backend: submits queued runs as scheduler jobs"
    )
    relay_flag(s)
    s.add_argument("kind", choices=["slurm"], help="the scheduler")
    s.add_argument(
        "--state-dir",
        help="where job scripts, credentials and job logs go (default $TETHER_HOME/slurm)",
    )
    s.add_argument(
        "--worker-relay",
        metavar="URL",
        help="the relay URL as compute nodes reach it (default: the --relay URL)",
    )
    s.add_argument(
        "--python",
        default=sys.executable,
        help="the Python with tether installed on the compute nodes (default: this one)",
    )
    s.add_argument(
        "--poll",
        type=parse_duration,
        default=5.0,
        metavar="DURATION",
        help="how often the jobs' states are asked of Slurm (squeue, scontrol), e.g. 5s, 1m (default 5s)",
    )
    s.add_argument(
        "--sbatch-arg",
        action="append",
        metavar="ARG",
        help="extra sbatch argument for every job, e.g. --account=ml (repeatable)",
    )
    s.set_defaults(fn=cmd_backend)

    s = sub.add_parser("token", help="create, list and revoke user tokens")
    tsub = s.add_subparsers(dest="token_cmd", required=True, metavar="ACTION")
    t = tsub.add_parser("create", help="create a token (printed once; the relay keeps a hash)")
    relay_flag(t)
    t.add_argument("--user", default="", help="for this user (admins only; default: yourself)")
    t.add_argument(
        "--scope",
        action="append",
        choices=["runs", "admin", "backend"],
        help="runs (default): submit and debug one's own runs; admin: everyone's runs and "
        "tokens; backend: worker pools and scheduler backends (repeatable)",
    )
    t.add_argument("--label", default="", help="what the token is for")
    t.add_argument(
        "--expires", type=parse_duration, default=0.0, metavar="DURATION", help="e.g. 30d"
    )
    t.add_argument(
        "--redis",
        metavar="URL",
        help="create it in this store directly, without a relay or token (the first admin "
        "token of a new relay, on the relay's host)",
    )
    t.add_argument(
        "--save",
        action="store_true",
        help="write it into the config file's profile (mode 0600) instead of printing it",
    )
    t.set_defaults(fn=cmd_token_create)
    t = tsub.add_parser("list", help="your tokens (admins: everyone's)")
    relay_flag(t)
    t.add_argument("--user", default="", help="admins: only this user's")
    t.add_argument("--json", action="store_true", help="the tokens as JSON")
    t.set_defaults(fn=cmd_token_list)
    t = tsub.add_parser("revoke", help="revoke a token by its id (see `tether token list`)")
    relay_flag(t)
    t.add_argument("id", help="the token's id (as tether token list shows it)")
    t.set_defaults(fn=cmd_token_revoke)

    s = sub.add_parser("audit", help="who attached to a run, submitted, cancelled it, and when")
    relay_flag(s)
    s.add_argument(
        "run", help="the run: its id, a unique prefix of it (4+ characters), or its name"
    )
    s.add_argument("--json", action="store_true", help="the trail as JSON")
    s.set_defaults(fn=cmd_audit)

    s = sub.add_parser("demo", help="the whole story on one machine, with a scripted IDE")
    s.add_argument(
        "--start-delay",
        type=float,
        default=3.0,
        metavar="S",
        help="how long the demo's worker waits before starting the run (default 3)",
    )
    s.add_argument("--keep", action="store_true", help="keep the demo's temporary data directory")
    s.set_defaults(fn=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # never its debug log: it prints frames, and a hello frame carries the token
    logging.getLogger("websockets").setLevel(max(level, logging.WARNING))
    try:
        return int(trio.run(_until_stopped, args))
    except KeyboardInterrupt:
        return _interrupted()
    except BaseException as exc:  # the last word: never a traceback for the user
        return _failed(exc)


#: the run whose adapter this process serves (what Ctrl-C leaves running)
_SERVING: list[str] = []


def _interrupted() -> int:
    """Ctrl-C: what goes on without this process (a run whose adapter it served)."""
    if _SERVING:
        run = _SERVING[-1]
        print(
            f"\ntether: stopped serving run {run}'s adapter; the run goes on. "
            f"`tether attach {run}` serves it again, `tether cancel {run}` stops it.",
            file=sys.stderr,
        )
    return 130


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def _failed(exc: BaseException) -> int:
    """One line for the user, whatever went wrong; an unexpected error's traceback goes to a crash
    log (and to the terminal with -vv)."""
    leaves = _leaves(exc)
    if all(isinstance(e, SystemExit) for e in leaves):
        raise leaves[0]
    if all(isinstance(e, KeyboardInterrupt) for e in leaves):
        return _interrupted()
    if all(isinstance(e, BrokenPipeError) for e in leaves):  # `tether ls | head`
        with suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    relay_error = _relay_error(exc)
    if relay_error is not None:
        print(f"tether: {relay_error.message}", file=sys.stderr)
        return 1
    import traceback

    where = tether_home() / "crash.log"
    first = next(e for e in leaves if not isinstance(e, SystemExit | KeyboardInterrupt))
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        with open(where, "a") as log:
            log.write(
                f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} tether {' '.join(sys.argv[1:2])}\n"
            )
            traceback.print_exception(exc, file=log)
        said = f"; details in {where}"
    except OSError:
        said = ""
    if logging.getLogger().isEnabledFor(logging.DEBUG):
        traceback.print_exception(exc)
    print(f"tether: internal error ({type(first).__name__}: {first}){said}", file=sys.stderr)
    return 70


async def _until_stopped(args: argparse.Namespace) -> int:
    """Run the command; SIGTERM or SIGHUP (systemd, a container runtime, a closed terminal) stop it
    the way Ctrl-C does: everything it started is stopped and cleaned up (``tether up``'s server
    included), and it exits with 128 + the signal's number."""
    result: list[int] = []
    stopped: list[int] = []
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals:
                async for signum in signals:
                    stopped.append(signum)
                    nursery.cancel_scope.cancel()
                    return

        nursery.start_soon(watch)
        result.append(int(await args.fn(args)))
        nursery.cancel_scope.cancel()
    return 128 + stopped[0] if stopped else result[0]


def _relay_error(exc: BaseException) -> RelayError | None:
    """The relay error a command failed with, if that is all it failed with (no traceback then)."""
    if isinstance(exc, RelayError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        found = [_relay_error(e) for e in exc.exceptions]
        if found and all(found):
            return found[0]
    return None


if __name__ == "__main__":
    sys.exit(main())
