"""Into the run: ``tether exec`` runs a command on the run's worker, through the relay
(``protocol_specs/tunnels.py``), in the run's directory with the run's environment."""

from __future__ import annotations

import argparse
import os
import sys
from typing import BinaryIO

import trio

from protocol_specs import wire
from protocol_specs.tunnels import CHUNK, TunnelSpec
from protocol_specs.wire import Role, TunnelEntry, WireError
from relay.client import Endpoint, RunLink, open_control, open_run_link

from .errors import relay_error
from .settings import resolve_relay

__all__ = ["TETHER_FAILED", "cmd_exec", "run_tunnel"]

#: the exit status when tether itself failed (the command did not run, or its end was lost),
#: as ``ssh`` does: a command's own status is anything else
TETHER_FAILED = 255


async def cmd_exec(args: argparse.Namespace) -> int:
    command = _options_before_the_command(args)
    if not command:
        raise SystemExit("tether: give the command after --, e.g. tether exec RUN -- nvidia-smi")
    relay = resolve_relay(args.relay, args)
    send_stdin = not sys.stdin.isatty()
    spec = TunnelSpec(kind="exec", argv=command, stdin=send_stdin)
    try:
        async with open_control(relay, client="tether-exec") as control:
            opened = await control.open_tunnel(args.run, spec)
    except BaseException as exc:  # refused: said in one line, with tether's own status
        refused = relay_error(exc)
        if refused is None:
            raise
        print(f"tether: {refused.message}", file=sys.stderr)
        return TETHER_FAILED
    return await run_tunnel(
        relay, opened, stdin=sys.stdin.fileno() if send_stdin else None, out=_stdio()
    )


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
        for name, value in vars(options.parse_args(words[:cut])).items():
            if value is not None:
                setattr(args, name, value)
    return words[cut + 1 :]


def _stdio() -> dict[int, BinaryIO]:
    return {1: sys.stdout.buffer, 2: sys.stderr.buffer}


async def run_tunnel(
    relay: Endpoint, opened: wire.TunnelOpened, *, stdin: int | None, out: dict[int, BinaryIO]
) -> int:
    """Serve an opened ``exec`` tunnel: ``stdin`` (a file descriptor) goes up, what comes down
    goes to ``out`` by fd; the command's exit status (:data:`TETHER_FAILED` if it did not run)."""
    try:
        async with open_run_link(
            relay, role=Role.TUNNEL, run=opened.run, tunnel=opened.tunnel, client="tether-exec"
        ) as link:
            async with trio.open_nursery() as nursery:
                if stdin is not None:
                    nursery.start_soon(_send, link, stdin)
                end = await _receive(link, out)
                nursery.cancel_scope.cancel()
    except BaseException as exc:  # a refusal may come wrapped in the link's exception group
        refused = relay_error(exc)
        if refused is None:
            raise
        print(f"tether: {refused.message}", file=sys.stderr)
        return TETHER_FAILED
    if end.detail or end.code is None:
        print(f"tether: {end.detail or 'the command did not run'}", file=sys.stderr)
    return TETHER_FAILED if end.code is None else end.code


async def _send(link: RunLink, fd: int) -> None:
    """Our stdin, up the tunnel, then its end."""
    stream = trio.lowlevel.FdStream(os.dup(fd))
    async with stream:
        while chunk := await stream.receive_some(CHUNK):
            await link.publish(TunnelEntry(op="data", data=bytes(chunk), transient=True))
    await link.publish(TunnelEntry(op="eof"))


async def _receive(link: RunLink, out: dict[int, BinaryIO]) -> TunnelEntry:
    """What comes down, to ``out``, until the worker's ``exit`` (which is returned)."""
    async for delivery in link.deliveries:
        try:
            entry = wire.decode_entry(delivery.entry)
        except WireError:
            continue
        if not isinstance(entry, TunnelEntry):
            continue
        if entry.op == "data" and entry.fd in out:
            sink = out[entry.fd]
            sink.write(entry.data)
            sink.flush()
        elif entry.op == "exit":
            return entry
    return TunnelEntry(op="exit", detail="the relay link ended before the command did")
