"""The ``tether`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio
from pydantic import ValidationError

from protocol_specs.runs import RunRecord, RunSpec

__all__ = ["main"]

DEFAULT_ADAPTER_PORT = 5678
DEFAULT_RELAY_PORT = 8765


def tether_home() -> Path:
    return Path(os.environ.get("TETHER_HOME") or Path.home() / ".tether")


def endpoint_file() -> Path:
    return tether_home() / "endpoint.json"


def resolve_relay(flag: str | None) -> str:
    """``--relay``, else ``TETHER_RELAY``, else what ``tether up`` recorded."""
    if flag:
        return flag
    if env := os.environ.get("TETHER_RELAY"):
        return env
    try:
        return str(json.loads(endpoint_file().read_text())["relay"])
    except (OSError, ValueError, KeyError):
        raise SystemExit(
            "tether: no relay to talk to. Start one with `tether up` (in another terminal), "
            "or pass --relay ws://HOST:PORT / set TETHER_RELAY."
        ) from None


class Clock:
    """Prints status lines with the time since the command started."""

    def __init__(self, prefix: str) -> None:
        self.start = time.monotonic()
        self.prefix = prefix

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.start:7.2f}s] {self.prefix}{text}", flush=True)


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
    )


async def cmd_relay(args: argparse.Namespace) -> int:
    from relay.server import serve_relay, server_port
    from relay.store import open_store

    config = relay_config(args)
    async with open_store(args.redis) as store, trio.open_nursery() as nursery:
        server = await nursery.start(
            lambda task_status: serve_relay(
                store, host=args.host, port=args.port, config=config, task_status=task_status
            )
        )
        print(
            f"tether relay: ready relay=ws://{args.host}:{server_port(server)} redis={args.redis}",
            flush=True,
        )
    return 0


async def cmd_worker(args: argparse.Namespace) -> int:
    from worker_shim.pool import run_pool

    relay = resolve_relay(args.relay)
    clock = Clock("worker: ")
    work_dir = Path(args.work_dir or tether_home() / "worker").resolve()  # noqa: ASYNC240 (startup)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: run_pool(
                relay,
                slots=args.slots,
                start_delay=args.start_delay,
                work_dir=work_dir,
                on_event=clock.say,
                task_status=task_status,
            )
        )
        print(
            f"tether worker: ready relay={relay} slots={args.slots} work_dir={work_dir}", flush=True
        )
    return 0


async def cmd_up(args: argparse.Namespace) -> int:
    from adapter.local_stack import open_local_stack

    data_dir = Path(args.data_dir or tether_home() / "data").resolve()  # noqa: ASYNC240 (startup)
    data_dir.mkdir(parents=True, exist_ok=True)
    clock = Clock("")
    async with open_local_stack(
        data_dir,
        redis=args.redis,
        relay_config=relay_config(args),
        relay_port=args.relay_port,
        workers=args.workers,
        start_delay=args.start_delay,
        on_worker_event=clock.say,
    ) as stack:
        relay, redis_url = stack.relay, stack.redis
        endpoint_file().parent.mkdir(parents=True, exist_ok=True)
        endpoint_file().write_text(
            json.dumps({"relay": relay, "pid": os.getpid(), "data_dir": str(data_dir)})
        )
        print(f"tether up: ready relay={relay} data={data_dir}", flush=True)
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


def build_spec(args: argparse.Namespace, *, debug: bool) -> RunSpec:
    """The run spec for ``tether debug`` / ``tether run`` arguments (refuses a missing command)."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise SystemExit(
            "tether: give the command to run after --, e.g. tether debug -- python train.py"
        )
    env = {}
    for item in args.env or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"tether: --env expects NAME=VALUE, got {item!r}")
        env[name] = value
    try:
        return RunSpec(
            command=command,
            workdir=str(Path(args.workdir or os.getcwd()).resolve()),
            debug=debug,
            wait_for_ide=not getattr(args, "no_wait", False),
            env=env,
            name=args.name or "",
            client_os="windows" if os.name == "nt" else "unix",
            on_unattended_stop=getattr(args, "on_unattended_stop", "wait"),
            unattended_timeout=getattr(args, "unattended_timeout", 1800.0),
            webhook=getattr(args, "webhook", None) or "",
        )
    except ValidationError as exc:
        raise SystemExit(f"tether: invalid run: {exc.errors()[0]['msg']}") from None


async def submit_run(relay: str, spec: RunSpec, say: Callable[[str], None]) -> RunRecord:
    """Snapshot the working directory and submit the run."""
    from adapter.snapshot import make_snapshot
    from relay.client import open_control

    data, count = make_snapshot(Path(spec.workdir))
    async with open_control(relay, client="tether-cli") as control:
        record = await control.submit(spec, data)
    size = f"{count} files, {len(data) / 1024:.0f} KiB"
    say(f"submitted run {record.id}: {' '.join(spec.command)} ({size})")
    return record


async def cmd_debug(args: argparse.Namespace) -> int:
    relay = resolve_relay(args.relay)
    clock = Clock("")
    spec = build_spec(args, debug=True)
    record = await submit_run(relay, spec, clock.say)
    return await _serve(relay, record.id, args.port, args.request_timeout, clock, announce="queued")


async def cmd_attach(args: argparse.Namespace) -> int:
    relay = resolve_relay(args.relay)
    clock = Clock("")
    return await _serve(
        relay, args.run, args.port, args.request_timeout, clock, announce="attached"
    )


async def _serve(
    relay: str, run_id: str, port: int, request_timeout: float, clock: Clock, *, announce: str
) -> int:
    from adapter.core import AdapterCore
    from adapter.server import serve_adapter

    async with trio.open_nursery() as nursery:
        result: dict[str, AdapterCore] = {}

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

        bound = await nursery.start(serve)
        print(f"tether debug: run {run_id} {announce}; adapter on 127.0.0.1:{bound}", flush=True)
        print("Attach your IDE to it. VS Code launch.json entry:", flush=True)
        print(launch_json(bound, run_id), flush=True)
    session = result["core"].session
    code = session.exit_code
    clock.say(f"run {run_id} ended ({session.status}, exit code {code})")
    # the program's own exit code; a run that never exited normally (cancelled, killed) is a failure
    return code if code is not None and code >= 0 else 1


async def _desktop_notice(text: str) -> None:
    from adapter.notify import notify_desktop

    await notify_desktop("tether: a breakpoint is waiting", text)


async def cmd_run(args: argparse.Namespace) -> int:
    relay = resolve_relay(args.relay)
    clock = Clock("")
    record = await submit_run(relay, build_spec(args, debug=False), clock.say)
    print(f"tether run: run {record.id} queued", flush=True)
    return 0


async def cmd_cancel(args: argparse.Namespace) -> int:
    from relay.client import open_control

    async with open_control(resolve_relay(args.relay), client="tether-cli") as control:
        record = await control.cancel(args.run)
    print(f"run {record.id}: {record.state.value}")
    return 0


async def cmd_status(args: argparse.Namespace) -> int:
    from relay.client import open_control

    async with open_control(resolve_relay(args.relay), client="tether-cli") as control:
        record = await control.get_run(args.run)
    print(record.model_dump_json(indent=2))
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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether", description="Asynchronous debugging for ML runs.")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def relay_flag(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--relay", help="relay URL (default: $TETHER_RELAY, else what `tether up` recorded)"
        )

    s = sub.add_parser(
        "up", help="run the embedded stack: Redis-compatible server, relay, local worker pool"
    )
    s.add_argument(
        "--data-dir", help="where data lives (default: $TETHER_HOME/data, TETHER_HOME=~/.tether)"
    )
    s.add_argument("--workers", type=int, default=2, help="local worker slots (default 2)")
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

    for name, help_text, fn in (
        ("debug", "submit a run in debug mode and serve the local DAP adapter for it", cmd_debug),
        ("run", "submit a run without the debugger", cmd_run),
    ):
        s = sub.add_parser(name, help=help_text)
        relay_flag(s)
        if name == "debug":
            s.add_argument(
                "--port",
                type=int,
                default=DEFAULT_ADAPTER_PORT,
                help=f"adapter port on 127.0.0.1 (default {DEFAULT_ADAPTER_PORT}; 0 = any free)",
            )
            s.add_argument(
                "--no-wait",
                action="store_true",
                help="start the program when the worker starts, even if no IDE configured breakpoints yet",
            )
            s.add_argument(
                "--request-timeout",
                type=float,
                default=30.0,
                metavar="S",
                help="error a request the debugger leaves unanswered after S seconds (default 30)",
            )
        if name == "debug":
            s.add_argument(
                "--on-unattended-stop",
                choices=["wait", "continue", "terminate"],
                default="wait",
                help="when the program pauses and no IDE is attached: wait for one (default; "
                "the run keeps its GPUs meanwhile), or continue / terminate after "
                "--unattended-timeout",
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
        s.add_argument(
            "--workdir",
            help="the directory to snapshot and run in (default: the current directory)",
        )
        s.add_argument(
            "--env",
            action="append",
            metavar="NAME=VALUE",
            help="environment for the program (repeatable)",
        )
        s.add_argument("--name", help="a label for the run")
        s.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
        s.set_defaults(fn=fn)

    s = sub.add_parser("attach", help="serve the local DAP adapter for an existing run")
    relay_flag(s)
    s.add_argument("run")
    s.add_argument("--port", type=int, default=DEFAULT_ADAPTER_PORT)
    s.add_argument("--request-timeout", type=float, default=30.0, metavar="S")
    s.set_defaults(fn=cmd_attach)

    for name, help_text, fn in (
        ("cancel", "cancel a run", cmd_cancel),
        ("status", "show a run's record", cmd_status),
    ):
        s = sub.add_parser(name, help=help_text)
        relay_flag(s)
        s.add_argument("run")
        s.set_defaults(fn=fn)

    s = sub.add_parser("relay", help="run the relay service")
    s.add_argument(
        "--redis",
        default=os.environ.get("TETHER_REDIS", "redis://127.0.0.1:6379"),
        help="Redis >= 6.2 or Valkey URL (redis://, unix://; default $TETHER_REDIS)",
    )
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=DEFAULT_RELAY_PORT)
    relay_options(s)
    s.set_defaults(fn=cmd_relay)

    s = sub.add_parser("worker", help="run a worker pool that claims queued runs")
    relay_flag(s)
    s.add_argument("--slots", type=int, default=1)
    s.add_argument("--start-delay", type=float, default=0.0, metavar="S")
    s.add_argument(
        "--work-dir", help="where run directories are made (default: $TETHER_HOME/worker)"
    )
    s.set_defaults(fn=cmd_worker)

    s = sub.add_parser("demo", help="the whole story on one machine, with a scripted IDE")
    s.add_argument("--start-delay", type=float, default=3.0, metavar="S")
    s.add_argument("--keep", action="store_true", help="keep the demo's temporary data directory")
    s.set_defaults(fn=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("websockets").setLevel(max(level, logging.WARNING))
    try:
        return int(trio.run(args.fn, args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
