"""The commands about runs: submit one (``run``, ``debug``, ``rerun``), serve its DAP adapter
(``debug``, ``attach``), print its output (``logs``, and ``run -f``), and look at or stop runs
(``ls``, ``status``, ``cancel``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from urllib.parse import urlencode

import trio

from adapter.show.render import (
    Clock,
    Progress,
    Terminal,
    ended_text,
    launch_json,
    runs_table,
    status_text,
)
from protocol_specs.runs.runs import RunRecord, RunState
from protocol_specs.session.session import StatusEvent
from protocol_specs.web.web import run_path
from protocol_specs.wire import wire
from relay.client import Endpoint, RelayError, follow_logs, open_control

from .errors import control_call
from .settings import resolve_relay, web_url
from .submission import build_spec, submit_run

__all__ = [
    "FOLLOWING",
    "SERVING",
    "cmd_attach",
    "cmd_cancel",
    "cmd_debug",
    "cmd_logs",
    "cmd_ls",
    "cmd_preempt",
    "cmd_rerun",
    "cmd_resume",
    "cmd_run",
    "cmd_status",
]

#: the run whose adapter this process serves (what Ctrl-C leaves running)
SERVING: list[str] = []
#: the run whose output this process follows until it ends (``-f``: what Ctrl-C leaves running)
FOLLOWING: list[str] = []

#: after the run ended, how long the terminal still waits for the rest of the program's output
OUTPUT_GRACE = 10.0
#: how often a terminal whose run is queued asks the relay what the run waits for
QUEUE_LOOK = 3.0


async def cmd_debug(args: argparse.Namespace) -> int:
    clock = Clock("", stream=sys.stderr if args.json else sys.stdout)
    # what is wrong with the command first: no relay needed
    spec = build_spec(args, debug=True, say=clock.say)
    relay = resolve_relay(args.relay, args)
    _port_free(args.port)  # before submitting: nothing to clean up if it is taken
    record = await submit_run(
        relay,
        spec,
        clock.say,
        limit=args.snapshot_limit,
        progress=Progress(clock, "uploading"),
        hashing=Progress(clock, "hashing"),
    )
    SERVING.append(record.id)
    return await _serve(relay, record.id, args, clock, announce="queued")


async def cmd_attach(args: argparse.Namespace) -> int:
    relay = resolve_relay(args.relay, args)
    clock = Clock("", stream=sys.stderr if args.json else sys.stdout)
    _port_free(args.port)
    async with open_control(relay, client="tether-cli") as control:
        record = await control_call(control.get_run(args.run))
    if why := not_attachable(record):
        raise SystemExit(f"tether: {why}")
    args.run = record.id
    SERVING.append(args.run)
    return await _serve(relay, args.run, args, clock, announce="attached", from_end=True)


async def _serve(
    relay: Endpoint,
    run_id: str,
    args: argparse.Namespace,
    clock: Clock,
    *,
    announce: str,
    from_end: bool = False,
) -> int:
    """Serve the run's adapter (``args``: the adapter's options) until the run ends; unless
    ``--quiet``, print the program's output here as it comes (from the end of what it printed so
    far with ``from_end``: an attach)."""
    from adapter.dap.core import AdapterCore
    from adapter.dap.server import serve_adapter

    async with trio.open_nursery() as nursery:
        result: dict[str, AdapterCore] = {}
        served, printed = trio.Event(), trio.Event()
        if args.quiet:
            printed.set()
        else:
            nursery.start_soon(_print_output, relay, run_id, from_end, printed)

        def unattended(text: str) -> None:
            # the user may be anywhere but at the IDE: the terminal rings, the desktop shows it
            text += f"\nIts page: {web_url(relay.url, run_path(run_id))}"
            print(f"\a{text}", flush=True)
            nursery.start_soon(_desktop_notice, text)

        async def serve(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
            result["core"] = await serve_adapter(
                relay,
                run_id,
                port=args.port,
                request_timeout=args.request_timeout,
                on_event=clock.say,
                on_unattended=unattended,
                focus=getattr(args, "focus", None),
                task_status=task_status,
            )
            served.set()

        bound = await nursery.start(serve)
        nursery.start_soon(say_why_queued, relay, run_id, clock.say)
        if args.json:
            print(json.dumps({"run": run_id, "port": bound}), flush=True)
        else:
            print(
                f"tether {getattr(args, 'cmd', 'debug')}: run {run_id} {announce}; adapter on 127.0.0.1:{bound}"
            )
            print("Attach your IDE to it. VS Code launch.json entry:")
            print(launch_json(bound, run_id), flush=True)
        await served.wait()
        with trio.move_on_after(OUTPUT_GRACE):
            await printed.wait()  # the run ended: the rest of its output, then stop following
        nursery.cancel_scope.cancel()
    session = result["core"].session
    code = session.exit_code
    clock.say(ended_text(run_id, session.status, code, session.status_detail))
    # the program's own exit code; a run that never exited normally (cancelled, killed) is a failure
    return code if code is not None and code >= 0 else 1


def _port_free(port: int) -> None:
    """Refuse, before anything is submitted or served, an adapter port that is taken.

    The probe listens as the adapter will (``SO_REUSEADDR``, as trio's listeners set it): a port
    the last session left in TIME-WAIT is free to serve on at once, while one a live listener
    holds is refused (on Linux ``SO_REUSEADDR`` never lets two listeners share a port; tether
    never sets ``SO_REUSEPORT``, which would)."""
    if port == 0:
        return
    import socket

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
            probe.listen(1)
        except OSError:
            from adapter.dap.peer import listener_of

            holder = listener_of(port)
            raise SystemExit(
                f"tether: 127.0.0.1:{port} is in use{f' by {holder}' if holder else ''} "
                "(another tether debug or attach?); choose another with --port N, or --port 0 "
                "for any free one"
            ) from None


async def _print_output(relay: Endpoint, run_id: str, from_end: bool, done: trio.Event) -> None:
    """The program's stdout and stderr, as it prints them, on this terminal's; ``done`` once the
    run's logs say it finished (or they cannot be followed: the adapter says why)."""
    terminal = Terminal()

    def show(entry: wire.LogEntry | wire.StatusEntry) -> None:
        if isinstance(entry, wire.LogEntry):
            terminal.write(entry.stream, entry.data, entry.node)

    try:
        await follow_logs(relay, run_id, show, from_end=from_end)
    except (RelayError, OSError):
        pass
    finally:
        terminal.end()
        done.set()


async def say_why_queued(relay: Endpoint, run_id: str, say: Callable[[str], None]) -> None:
    """While the run is queued, say what it waits for each time that changes (what holds its
    pool's slots: ``relay/runs/queue_wait.py``), asking the relay every :data:`QUEUE_LOOK` seconds;
    returns once the run left the queue. A lost relay is asked again (the logs say it is lost)."""
    said = ""
    while True:
        try:
            async with open_control(relay, client="tether-cli") as control:
                while (record := await control.get_run(run_id)).state is RunState.QUEUED:
                    if record.queued_why and record.queued_why != said:
                        said = record.queued_why
                        say(f"queued: {said}")
                    await trio.sleep(QUEUE_LOOK)  # a poll: the relay pushes no such news
                return
        except RelayError:
            await trio.sleep(QUEUE_LOOK)


async def _desktop_notice(text: str) -> None:
    from adapter.show.notify import notify_desktop

    await notify_desktop("tether: a paused run is waiting for you", text)


async def cmd_run(args: argparse.Namespace) -> int:
    """Submit; stdout gets the run id alone (or its record with ``--json``: scripts read it),
    progress goes to stderr. With ``-f``, stdout is the program's output."""
    spec = build_spec(args, debug=False)  # what is wrong with the command first: no relay needed
    relay = resolve_relay(args.relay, args)
    clock = Clock("", stream=sys.stderr)
    record = await submit_run(
        relay,
        spec,
        clock.say,
        limit=args.snapshot_limit,
        progress=Progress(clock, "uploading"),
        hashing=Progress(clock, "hashing"),
    )
    print(f"tether run: run {record.id} queued", file=sys.stderr, flush=True)
    if args.follow:
        return await _follow(relay, record.id)
    print(record.redacted().model_dump_json(indent=2) if args.json else record.id, flush=True)
    return 0


async def _follow(relay: Endpoint, run_id: str, *, follow: bool = True) -> int:
    """Print a run's output as it comes; the run's exit code once it ends (follow)."""
    ended: dict[str, wire.StatusEntry] = {}
    terminal = Terminal()
    notices: list[str] = []
    noticed = trio.Event()

    def show(entry: wire.LogEntry | wire.StatusEntry) -> None:
        nonlocal noticed
        if isinstance(entry, wire.LogEntry):
            terminal.write(entry.stream, entry.data, entry.node)
            return
        terminal.end()
        if entry.event == StatusEvent.UNATTENDED_STOP:
            # as in tether debug: the terminal rings and, following it live, the desktop says it
            bell = "\a" if follow else ""
            print(f"{bell}-- tether: {entry.detail or entry.event}", file=sys.stderr, flush=True)
            if follow and entry.detail and not entry.detail.startswith("Terminating"):
                notices.append(f"{entry.detail}\nIts page: {web_url(relay.url, run_path(run_id))}")
                noticed.set()
            return
        if entry.event == StatusEvent.FINISHED:
            ended["entry"] = entry
            if run_id in FOLLOWING:  # ended: Ctrl-C from now on leaves nothing running
                FOLLOWING.remove(run_id)
            code = f", exit code {entry.exit_code}" if entry.exit_code is not None else ""
            text = f"run {run_id} {entry.state}{code}"
            if entry.detail and entry.state != "succeeded":
                text += f": {entry.detail}"
        else:
            text = entry.detail or entry.event
        print(f"-- tether: {text}", file=sys.stderr, flush=True)

    async def desktop() -> None:
        nonlocal noticed
        while True:
            await noticed.wait()
            noticed = trio.Event()
            while notices:
                await _desktop_notice(notices.pop(0))

    def said(text: str) -> None:
        terminal.end()
        print(f"-- tether: {text}", file=sys.stderr, flush=True)

    if follow:
        FOLLOWING.append(run_id)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(desktop)
            if follow:
                nursery.start_soon(say_why_queued, relay, run_id, said)
            await follow_logs(relay, run_id, show, follow=follow)
            nursery.cancel_scope.cancel()
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
    relay = resolve_relay(args.relay, args)
    clock = Clock("", stream=sys.stderr if args.json else sys.stdout)
    async with open_control(relay, client="tether-cli") as control:
        record = await control_call(control.rerun(args.run))
    clock.say(
        f"run {record.id} queued: a rerun of {args.run} (same snapshot {record.snapshot[:12]}, "
        f"same command: {' '.join(record.spec.command)})"
    )
    if record.spec.debug:
        return await _serve(relay, record.id, args, clock, announce="queued")
    if args.json:  # nothing serves: the new run's id alone
        print(json.dumps({"run": record.id, "port": None}), flush=True)
    if args.follow:
        return await _follow(relay, record.id)
    return 0


async def cmd_cancel(args: argparse.Namespace) -> int:
    async with open_control(resolve_relay(args.relay, args), client="tether-cli") as control:
        before = await control_call(control.get_run(args.run))
        if before.finished:
            print(
                f"tether: run {before.id} had already ended ({before.state.value}); "
                "nothing to cancel",
                file=sys.stderr,
            )
            return 1
        record = await control_call(control.cancel(before.id))
    print(f"run {record.id}: {record.state.value}")
    return 0


async def cmd_preempt(args: argparse.Namespace) -> int:
    """``tether preempt RUN`` and ``tether pause RUN`` (``args.suspend``)."""
    async with open_control(resolve_relay(args.relay, args), client="tether-cli") as control:
        record = await control_call(
            control.preempt(args.run, grace=args.grace, suspend=args.suspend)
        )
    if record.state is RunState.SUSPENDED:
        print(f"run {record.id}: suspended; tether resume {record.id} queues it again")
        return 0
    grace = record.spec.preempt_grace if args.grace is None else args.grace
    then = f"suspended (tether resume {record.id})" if args.suspend else "queued again"
    print(
        f"run {record.id}: attempt {record.attempt} preempted; its program has {grace:g} s to "
        f"checkpoint and exit, then the run is {then}"
    )
    return 0


async def cmd_resume(args: argparse.Namespace) -> int:
    from protocol_specs.runs.preemption import next_attempt

    async with open_control(resolve_relay(args.relay, args), client="tether-cli") as control:
        record = await control_call(control.resume(args.run, from_start=args.from_start))
    print(f"run {record.id}: queued; {next_attempt(record)}")
    return 0


def not_attachable(record: RunRecord) -> str:
    """Why an IDE cannot debug the run, or ``""``: an ended run never can; a debug run can, a
    plain run when it started a Python program debuggable (``tether run``'s default)."""
    from worker_shim.program.python_command import is_python

    if record.finished:
        said = record.where()
        return (
            f"run {record.id} has ended ({record.state.value}{f', {said}' if said else ''}): "
            f"there is nothing to debug. `tether logs {record.id}` shows its output; `tether "
            f"rerun {record.id}` runs it again"
        )
    if record.spec.debug:
        return ""
    command = " ".join(record.spec.command)[:200]
    if not record.spec.debuggable:
        return (
            f"run {record.id} was started with --no-debuggable: no debugger can reach it without "
            f"a restart (`tether debug -- {command}` runs it again under the debugger)"
        )
    program = record.spec.command[0]
    if not (is_python(program) or program.endswith(".py")):
        return (
            f"run {record.id} runs `{command}`, not a Python program: only a Python program can "
            f"be attached to later (`tether debug -- {command}` debugs every Python process it "
            "starts)"
        )
    return ""


async def full_run_id(relay: Endpoint, run: str) -> str:
    """The whole id of the run ``run`` names (an id, or a unique prefix of one)."""
    async with open_control(relay, client="tether-cli") as control:
        return (await control_call(control.get_run(run))).id


async def cmd_ls(args: argparse.Namespace) -> int:
    async with open_control(resolve_relay(args.relay, args), client="tether-cli") as control:
        records = await control_call(control.list_runs(args.limit))
    if args.json:
        print(json.dumps([r.model_dump(mode="json") for r in records], indent=2))
    else:
        print(runs_table(records, time.time()))
    return 0


async def cmd_status(args: argparse.Namespace) -> int:
    endpoint = resolve_relay(args.relay, args)
    async with open_control(endpoint, client="tether-cli") as control:
        record = await control_call(control.get_run(args.run))
    if args.json:
        print(record.model_dump_json(indent=2))
    else:
        print(status_text(record, time.time()))
        print(f"page       {web_url(endpoint.url, run_path(record.id))}")
    return 0


async def cmd_ui(args: argparse.Namespace) -> int:
    """``tether ui [RUN]``: a link that logs this user into the web view once, opened in the
    browser (the code is in the link's fragment, which no server log or Referer ever holds)."""
    endpoint = resolve_relay(args.relay, args)
    async with open_control(endpoint, client="tether-cli") as control:
        path = "/ui"
        if args.run:
            path = run_path((await control_call(control.get_run(args.run))).id)
        got = await control_call(control.web_login())
    fragment = urlencode({"code": got.code, **({"next": path} if path != "/ui" else {})})
    link = web_url(endpoint.url, "/ui/login", got.base) + "#" + fragment
    print(f"tether ui: open {link}")
    print(
        f"  (it logs you in once, within {got.expires_in:.0f} s; the page itself is {web_url(endpoint.url, path, got.base)})"
    )
    if args.open:
        import webbrowser

        webbrowser.open(link)
    return 0
