"""Into the run, through the relay (``protocol_specs/wire/tunnels.py``): ``tether exec`` runs a command
on the run's worker, ``tether shell`` opens a shell there on a terminal (both in the run's
directory with the run's environment), ``tether port-forward`` forwards local ports to ports of
the worker's loopback, a tunnel per connection. ``--node K``: on node K's worker of a run that
spans nodes (default: node 0's); the relay refuses a node the run does not have."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import termios
import tty
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import partial
from typing import BinaryIO

import trio

from protocol_specs.wire import wire
from protocol_specs.wire.tunnel_open import DidNotRun, MayHaveRun, Retry, TunnelOpening
from protocol_specs.wire.tunnels import CHUNK, TunnelSpec
from protocol_specs.wire.wire import ErrorCode, TunnelEntry, TunnelLink
from relay.client import Endpoint, LinkPolicy, RunLink, open_control, open_run_link, tunnel_steps

from .errors import control_call, relay_error
from .settings import resolve_relay

__all__ = [
    "TETHER_FAILED",
    "cmd_exec",
    "cmd_port_forward",
    "cmd_shell",
    "listen_local",
    "node_flag",
    "open_tunnel_once",
    "process_flag",
    "run_tunnel",
]

#: the exit status when tether itself failed (the command did not run, or its end was lost),
#: as ``ssh`` does: a command's own status is anything else
TETHER_FAILED = 255


async def cmd_exec(args: argparse.Namespace) -> int:
    command = _options_before_the_command(args)
    if not command:
        raise SystemExit("tether: give the command after --, e.g. tether exec RUN -- nvidia-smi")
    relay = resolve_relay(args.relay, args)
    send_stdin = not sys.stdin.isatty()
    spec = TunnelSpec(
        kind="exec", argv=command, stdin=send_stdin, process=args.process or "", node=args.node
    )
    opened = await _open(relay, args.run, spec)
    if isinstance(opened, str):
        return _failed(opened)
    stdin = sys.stdin.fileno() if send_stdin else None
    code, said = await run_tunnel(relay, opened, stdin=stdin, out=_stdio())
    return _failed(said, code) if said else code


async def cmd_shell(args: argparse.Namespace) -> int:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise SystemExit(
            "tether: tether shell needs a terminal; for a command in a script: "
            "tether exec RUN -- COMMAND"
        )
    relay = resolve_relay(args.relay, args)
    size = os.get_terminal_size()
    term = os.environ.get("TERM") or "xterm-256color"
    spec = TunnelSpec(
        kind="shell",
        cols=size.columns,
        rows=size.lines,
        term=term,
        process=args.process or "",
        node=args.node,
    )
    opened = await _open(relay, args.run, spec)
    if isinstance(opened, str):
        return _failed(opened)
    with raw_terminal(sys.stdin.fileno()):
        code, said = await run_tunnel(relay, opened, stdin=0, out=_stdio(), window=True)
    return _failed(said, code) if said else code


async def cmd_port_forward(args: argparse.Namespace) -> int:
    forwards = [_forward_spec(text) for text in args.forwards]  # bad input: said first
    relay = resolve_relay(args.relay, args)
    async with open_control(relay, client="tether-port-forward") as control:
        record = await control_call(control.get_run(args.run))
    if record.finished or record.state.value not in ("running", "paused"):
        raise SystemExit(
            f"tether: run {record.id} is {record.state.value}: a port of its worker can be "
            "forwarded while it runs"
        )
    nodes = record.spec.resources.nodes
    if args.node >= nodes:
        raise SystemExit(f"tether: run {record.id} has no node {args.node} (nodes 0-{nodes - 1})")
    whose = f"node {args.node}'s worker" if nodes > 1 else "worker"
    # every port taken before any is served
    opened = [(await listen_local(local), remote) for local, remote in forwards]
    async with trio.open_nursery() as nursery:
        for listeners, remote in opened:
            port = listeners[0].socket.getsockname()[1]
            print(
                f"tether: forwarding 127.0.0.1:{port} to port {remote} of run {record.id}'s "
                f"{whose} (Ctrl-C stops)",
                file=sys.stderr,
                flush=True,
            )
            serve = partial(_forward_one, relay, record.id, remote, args.node)
            nursery.start_soon(partial(trio.serve_listeners, serve, listeners))
    return 0


async def listen_local(port: int) -> list[trio.SocketListener]:
    """Listeners on ``127.0.0.1:port`` (0: any free port), or one line saying why not. trio's
    listeners set ``SO_REUSEADDR``: a port the last forward left in TIME-WAIT serves again at
    once, while one a live listener holds is refused (Linux never lets two listeners share it)."""
    try:
        return await trio.open_tcp_listeners(port, host="127.0.0.1")
    except OSError as exc:
        raise SystemExit(f"tether: cannot listen on 127.0.0.1:{port}: {exc.strerror}") from None


def _forward_spec(text: str) -> tuple[int, int]:
    """``[LOCAL:]REMOTE`` as (local port, remote port); local 0: any free one."""
    local, _, remote = text.rpartition(":")
    try:
        pair = int(local or remote), int(remote)
    except ValueError:
        raise SystemExit(
            f"tether: {text!r} is not [LOCAL:]REMOTE, e.g. 6006 or 8080:6006"
        ) from None
    if not (0 <= pair[0] <= 65535 and 1 <= pair[1] <= 65535):
        raise SystemExit(f"tether: {text!r}: ports are 1 to 65535 (LOCAL 0: any free one)")
    return pair


async def _forward_one(
    relay: Endpoint, run: str, remote: int, node: int, stream: trio.SocketStream
) -> None:
    """One local connection, through a tunnel of its own to ``remote`` on ``node``'s worker."""
    async with stream:
        opened = await _open(relay, run, TunnelSpec(kind="forward", port=remote, node=node))
        if isinstance(opened, str):
            print(f"tether: port {remote}: {opened}", file=sys.stderr, flush=True)
            return
        try:
            async with open_run_link(
                relay, link=TunnelLink(tunnel=opened.tunnel), run=opened.run, client="tether-cli",
                policy=tunnel_link_policy(),
            ) as link:  # fmt: skip
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_local_to_tunnel, stream, link)
                    end = await _tunnel_to_local(link, stream)
                    nursery.cancel_scope.cancel()
        except BaseException as exc:
            refused = relay_error(exc)
            if refused is None:
                raise
            end = TunnelEntry(op="exit", detail=refused.message)
        if end.detail:
            print(f"tether: port {remote}: {end.detail}", file=sys.stderr, flush=True)


async def _local_to_tunnel(stream: trio.SocketStream, link: RunLink) -> None:
    try:
        while chunk := await stream.receive_some(CHUNK):
            await link.publish(TunnelEntry(op="data", data=bytes(chunk), transient=True))
    except trio.BrokenResourceError:
        pass
    await link.publish(TunnelEntry(op="eof"))


async def _tunnel_to_local(link: RunLink, stream: trio.SocketStream) -> TunnelEntry:
    """What the worker's end of the connection sends, to the local one, until the tunnel's
    ``exit`` (returned)."""
    async for entry in tunnel_steps(link):
        try:
            if entry.op == "data":
                await stream.send_all(entry.data)
            elif entry.op == "eof":
                await stream.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the local side went: its end goes up, and the tunnel ends
        if entry.op == "exit":
            return entry
    return TunnelEntry(op="exit", detail="the relay link ended before the connection did")


async def _open(relay: Endpoint, run: str, spec: TunnelSpec) -> wire.TunnelOpened | str:
    """The opened tunnel, or what to tell the user (that it did not start, and why)."""
    got = await open_tunnel_once(relay, run, spec)
    if isinstance(got, wire.TunnelOpened):
        return got
    what = _WHAT[spec.kind]
    if isinstance(got, DidNotRun):
        return f"{what[0]}: {got.why}"
    return (
        f"the relay was lost after it was asked to start {what[1]} ({got.why}): it may have "
        f"started (tether audit {run} lists the tunnels the relay opened)"
    )


#: per kind: what a refused tunnel says, and what it would have started
_WHAT = {
    "exec": ("the command did not run", "the command"),
    "shell": ("the shell did not start", "the shell"),
    "forward": ("the connection was not forwarded", "the connection"),
}


async def open_tunnel_once(
    relay: Endpoint, run: str, spec: TunnelSpec, *, opening: TunnelOpening | None = None
) -> wire.TunnelOpened | DidNotRun | MayHaveRun:
    """Open a tunnel, asking again (the same request: ``opening.key``) when the answer was lost,
    so what it runs starts once or not at all (``protocol_specs/wire/tunnel_open.py`` decides)."""
    opening = opening or TunnelOpening(give_up_after=GIVE_UP_AFTER)
    while True:
        asked = False
        try:
            async with open_control(relay, client=f"tether-{spec.kind}") as control:
                opening.asking()
                asked = True
                return await control.open_tunnel(run, spec, key=opening.key)
        except BaseException as exc:
            refused = relay_error(exc)
            if refused is None:
                raise
            answered = asked and refused.code is not ErrorCode.UNREACHABLE
            step = opening.failed(
                refused.code, refused.message, trio.current_time(), answered=answered
            )
        if not isinstance(step, Retry):
            return step
        await trio.sleep(step.delay)


#: how long a tunnel's link keeps trying to get back to the relay before it ends, saying so
GIVE_UP_AFTER = 120.0


def tunnel_link_policy() -> LinkPolicy:
    """A tunnel's link reconnects after a drop (nothing typed or shown is lost meanwhile) and
    gives up after :data:`GIVE_UP_AFTER` s without the relay: a shell never hangs for ever. Its
    first connection too keeps trying that long: the tunnel is open, what it runs may have
    started, and its output and exit code wait in the relay."""
    return LinkPolicy.from_env(give_up_after=GIVE_UP_AFTER, first_connect_within=GIVE_UP_AFTER)


def _failed(said: str, code: int = TETHER_FAILED) -> int:
    print(f"tether: {said}", file=sys.stderr)
    return code


@contextmanager
def raw_terminal(fd: int) -> Iterator[None]:
    """The terminal in raw mode (every key goes to the remote shell as typed), restored after,
    blocking again (the reader made it non-blocking, and the shell that runs us shares it)."""
    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        os.set_blocking(fd, True)


def _options_before_the_command(args: argparse.Namespace) -> list[str]:
    """The command after ``--``; the options given between RUN and ``--`` (``--relay``) are
    read into ``args`` (argparse leaves everything after RUN to the command)."""
    from .options import relay_flag

    words = list(args.command)
    if "--" not in words:
        return words
    cut = words.index("--")
    if cut:
        options = argparse.ArgumentParser(prog="tether exec RUN", add_help=False)
        relay_flag(options)
        process_flag(options)
        node_flag(options)
        options.set_defaults(node=None)  # given before RUN: kept unless given here too
        for name, value in vars(options.parse_args(words[:cut])).items():
            if value is not None:
                setattr(args, name, value)
    return words[cut + 1 :]


def process_flag(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--process",
        metavar="PID",
        type=_pid,
        help="in that process's directory with its environment (a rank's RANK, LOCAL_RANK, "
        "CUDA_VISIBLE_DEVICES...; tether status lists the run's processes); default: the run's",
    )


def node_flag(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--node",
        metavar="K",
        type=_node,
        default=0,
        help="on node K's worker, of a run that spans nodes (tether status lists them; "
        "--process: a pid of node K's); default: node 0's",
    )


def _node(text: str) -> int:
    if not text.isdecimal() or int(text) > 63:
        raise argparse.ArgumentTypeError(f"{text!r} is not a node (0 to 63)")
    return int(text)


def _pid(text: str) -> str:
    if not text.isdecimal() or len(text) > 10:
        raise argparse.ArgumentTypeError(f"{text!r} is not a process id")
    return text


def _stdio() -> dict[int, BinaryIO]:
    return {1: sys.stdout.buffer, 2: sys.stderr.buffer}


async def run_tunnel(
    relay: Endpoint,
    opened: wire.TunnelOpened,
    *,
    stdin: int | None,
    out: dict[int, BinaryIO],
    window: bool = False,
) -> tuple[int, str]:
    """Serve an opened tunnel: ``stdin`` (a file descriptor) goes up, what comes down goes to
    ``out`` by fd, and with ``window`` this terminal's size when it changes. The command's exit
    status (:data:`TETHER_FAILED` if it did not run), and what to tell the user ("" if all went
    as it should)."""
    try:
        async with open_run_link(
            relay, link=TunnelLink(tunnel=opened.tunnel), run=opened.run, client="tether-cli",
            policy=tunnel_link_policy(),
        ) as link:  # fmt: skip
            try:
                async with trio.open_nursery() as nursery:
                    if stdin is not None:
                        nursery.start_soon(_send, link, stdin)
                    if window:
                        nursery.start_soon(_resizes, link, stdin if stdin is not None else 0)
                    end = await _receive(link, out)
                    nursery.cancel_scope.cancel()
            except BaseException:  # Ctrl-C, a signal: the remote side hangs up too, as with ssh
                await _hang_up(link)
                raise
    except BaseException as exc:  # a refusal may come wrapped in the link's exception group
        refused = relay_error(exc)
        if refused is None:
            raise
        return TETHER_FAILED, refused.message
    if end.code is None:
        return TETHER_FAILED, end.detail or "the command did not run"
    return end.code, end.detail


async def _hang_up(link: RunLink) -> None:
    """Tell the command (or shell) its user went (``SIGHUP``) and wait for its end, briefly,
    whatever happens."""
    with trio.CancelScope(shield=True), trio.move_on_after(HANG_UP_WAIT), suppress(Exception):
        await link.publish(TunnelEntry(op="signal", detail="SIGHUP"))
        async for entry in tunnel_steps(link):
            if entry.op == "exit":
                return


#: how long tether waits, after Ctrl-C, for the remote command to end
HANG_UP_WAIT = 3.0


async def _send(link: RunLink, fd: int) -> None:
    """Our stdin, up the tunnel, then its end."""
    stream = trio.lowlevel.FdStream(os.dup(fd))
    try:
        async with stream:
            while chunk := await stream.receive_some(CHUNK):
                await link.publish(TunnelEntry(op="data", data=bytes(chunk), transient=True))
        await link.publish(TunnelEntry(op="eof"))
    finally:
        os.set_blocking(fd, True)  # what runs us shares it


async def _resizes(link: RunLink, fd: int) -> None:
    """This terminal's new size, up the tunnel, each time it changes."""
    with trio.open_signal_receiver(signal.SIGWINCH) as changes:
        async for _ in changes:
            size = os.get_terminal_size(fd)
            await link.publish(TunnelEntry(op="resize", cols=size.columns, rows=size.lines))


async def _receive(link: RunLink, out: dict[int, BinaryIO]) -> TunnelEntry:
    """What comes down, to ``out``, until the worker's ``exit`` (which is returned)."""
    async for entry in tunnel_steps(link):
        if entry.op == "data" and entry.fd in out:
            sink = out[entry.fd]
            sink.write(entry.data)
            sink.flush()
        elif entry.op == "exit":
            return entry
    return TunnelEntry(op="exit", detail="the relay link ended before the command did")
