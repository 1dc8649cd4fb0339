"""Submitting a run: the run spec from ``tether run`` / ``tether debug`` arguments over the config
profile (checked here, not after the queue wait), then the working directory's snapshot, the
upload of what the relay lacks, and the submission."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from adapter.show.render import mib, unattended_text
from protocol_specs.checkpoints.checkpoints import parse_source
from protocol_specs.plain_words import invalid
from protocol_specs.runs.resources import Resources
from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import KNOWN_BACKENDS, RunSpec
from protocol_specs.wire.tunnel_open import new_key
from protocol_specs.wire.wire import ErrorCode
from relay.client import ControlClient, Endpoint, RelayError, open_control

from .errors import relay_error
from .interpreter import check_targets, pin_environment, tree_holds
from .settings import pairs, parse_duration, parse_memory, profile, tether_home

__all__ = [
    "RUN_FLAGS",
    "build_spec",
    "on_snapshot",
    "submit_run",
    "unattended_policy",
    "unattended_timeout",
]

_T = TypeVar("_T")

#: a run spec's fields by the flags that set them (what a refusal names)
RUN_FLAGS = {
    "command": "the command",
    "workdir": "--workdir",
    "env": "--env",
    "secret_env": "--secret",
    "name": "--name",
    "unattended_timeout": "--unattended-timeout (seconds)",
    "webhook": "--webhook",
    "resources.gpus": "--gpus",
    "resources.cpus": "--cpus",
    "resources.nodes": "--nodes",
    "resources.memory_mb": "--mem (MiB)",
    "resources.time_limit": "--time (seconds)",
    "resources.partition": "--partition",
    "resources.custom": "--resource",
    "mounts": "--mount",
    "max_retries": "--max-retries",
    "retry_backoff": "--retry-backoff (seconds)",
    "preempt_grace": "--preempt-grace (seconds)",
    "tags": "--tag",
    "ranks": "--ranks",
    "stop": "--stop",
    "metrics": "--metric",
    "debug_when": "--debug-when",
    "outputs": "--outputs",
    "keep_checkpoints": "--keep-checkpoints",
    "from_checkpoint": "--from-checkpoint",
    # the resources, checked on their own before the spec
    "gpus": "--gpus",
    "cpus": "--cpus",
    "nodes": "--nodes",
    "memory_mb": "--mem (MiB)",
    "time_limit": "--time (seconds)",
    "partition": "--partition",
    "custom": "--resource",
}
#: a command line of each submitting command, for the user who gave it none
_EXAMPLES = {
    "run": "tether run -- python train.py",
    "debug": "tether debug -- python train.py",
    "sweep": "tether sweep --param lr=log:1e-5:1e-2 -- python train.py --lr {lr} "
    "(or command: in --file)",
}


def _stderr(text: str) -> None:
    print(f"tether: {text}", file=sys.stderr, flush=True)


def build_spec(
    args: argparse.Namespace, *, debug: bool, say: Callable[[str], None] = _stderr
) -> RunSpec:
    """The run spec for ``tether debug`` / ``tether run`` arguments over the config profile;
    ``say``: what the user should know at submit (the environment the command runs in)."""
    chosen = profile(args)
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
        example = _EXAMPLES.get(getattr(args, "cmd", ""), _EXAMPLES["debug"])
        raise SystemExit(f"tether: give the command to run after --, e.g. {example}")
    workdir = Path(args.workdir or os.getcwd()).resolve()
    if not workdir.is_dir():
        raise SystemExit(f"tether: --workdir {args.workdir}: no such directory")

    def pick(name: str, default: Any) -> Any:
        value = getattr(args, name, None)
        if value is not None:
            return value
        from_profile = getattr(chosen, name, None)
        return from_profile if from_profile not in (None, "") else default

    if pick("local_env", True):  # the environment the user works in (adapter/cli/interpreter.py)
        try:
            pinned = pin_environment(command, workdir, os.environ)
        except ValueError as exc:
            raise SystemExit(f"tether: {exc}") from None
        command = pinned.command
        if pinned.note:
            say(pinned.note)
    if debug:  # said now, not after the queue wait: the worker would refuse it the same way
        _check_debuggable(command, workdir, getattr(args, "processes", None) or "stopped")
    backend = _backend(pick("backend", "local"))
    secrets = {}
    for item in args.secret or []:
        name, sep, value = item.partition("=")
        if not sep:
            if name not in os.environ:
                raise SystemExit(f"tether: --secret {name}: no such variable in your environment")
            value = os.environ[name]
        secrets[name] = value
    try:
        memory = args.mem if args.mem is not None else parse_memory(chosen.memory or "0")
        time_limit = args.time if args.time is not None else parse_duration(chosen.time or "0")
        backoff = (
            args.retry_backoff
            if args.retry_backoff is not None
            else parse_duration(chosen.retry_backoff or "10")
        )
        return RunSpec(
            command=command,
            workdir=str(workdir),
            debug=debug,
            wait_for_ide=not getattr(args, "no_wait", False),
            debuggable=pick("debuggable", True),
            env={**pairs(args.env, "--env", chosen.env), **secrets},
            secret_env=sorted(secrets),
            name=args.name or "",
            client_os="windows" if os.name == "nt" else "unix",
            post_mortem=pick("post_mortem", True),
            # what a run does when nobody comes (docs/reliability.md, "Unattended stops"): a plain run is
            # nobody's session, a local pool's slots are few
            on_unattended_stop=pick("on_unattended_stop", unattended_policy(debug, backend)),
            unattended_fallback=pick("unattended_fallback", "wait"),
            unattended_timeout=_given(
                getattr(args, "unattended_timeout", None), unattended_timeout(backend)
            ),
            webhook=getattr(args, "webhook", None) or "",
            resources=Resources(
                **_per_node(args, pick("gpus", 0), pick("cpus", 1)),
                memory_mb=memory,
                time_limit=time_limit,
                partition=pick("partition", ""),
                custom=_amounts(getattr(args, "resource", None)),
            ),
            mounts=pairs(args.mount, "--mount", chosen.mounts),
            max_retries=pick("max_retries", 0),
            retry_backoff=backoff,
            preempt_grace=pick("preempt_grace", 60.0),
            tags=[*chosen.tags, *(args.tag or [])],
            backend=backend,
            processes=getattr(args, "processes", None) or "stopped",
            ranks=getattr(args, "ranks", None) or [],
            stop=getattr(args, "stop", None) or "all",
            metrics=getattr(args, "metric", None) or [],
            debug_when=getattr(args, "debug_when", None) or "",
            outputs=pick("outputs", []),
            keep_checkpoints=pick("keep_checkpoints", 3),
            from_checkpoint=_checkpoint_source(getattr(args, "from_checkpoint", None)),
        )
    except argparse.ArgumentTypeError as exc:
        raise SystemExit(f"tether: in the config profile: {exc}") from None
    except ValidationError as exc:
        raise SystemExit(f"tether: {invalid(exc, RUN_FLAGS)}") from None


def _checkpoint_source(text: str | None) -> str:
    """``--from-checkpoint RUN[:STEP]``, its form checked here (the relay checks the run)."""
    if not text:
        return ""
    try:
        parse_source(text)
    except ValueError as exc:
        raise SystemExit(f"tether: --from-checkpoint: {exc}") from None
    return text.strip()


#: how long a stop nobody attends lasts before the policy acts: on the local pool (a laptop's
#: few slots) and on a scheduler's backends
LOCAL_UNATTENDED_TIMEOUT = 300.0
UNATTENDED_TIMEOUT = 1800.0


def unattended_policy(debug: bool, backend: str) -> str:
    """The default ``--on-unattended-stop``: a plain run goes on (``continue``); a debug run
    waits for its IDE on a scheduler's backend, and on the local pool ends (``terminate``): a
    slot of a laptop's pool is not held for a person who is not coming back."""
    if not debug:
        return "continue"
    return "terminate" if backend == "local" else "wait"


def unattended_timeout(backend: str) -> float:
    return LOCAL_UNATTENDED_TIMEOUT if backend == "local" else UNATTENDED_TIMEOUT


def _given(value: Any, default: Any) -> Any:
    """``value`` unless it was not given (``0`` is a value)."""
    return default if value is None else value


def _check_debuggable(command: list[str], workdir: Path, processes: str) -> None:
    """What the worker would refuse in debug mode, refused before the run queues. A launcher
    named by a path (``./launch.sh``) is in the snapshot and read here; one named bare
    (``torchrun``, ``srun``) is looked up on the worker's ``PATH``, so only the worker can tell.
    A command that is not Python (a shell script) is debugged through the Python processes it
    starts, so not with ``--processes main``."""
    from worker_shim.program.python_command import (
        NOT_WITH_MAIN_ONLY,
        is_launcher,
        python_launcher,
        split_python_command,
    )

    program = command[0]
    try:
        if not is_launcher(program):
            split_python_command(command)
        elif os.sep in program and (workdir / program).resolve().is_relative_to(workdir):
            if python_launcher(program, env=dict(os.environ), cwd=str(workdir)) is None:
                if processes == "main":
                    raise ValueError(NOT_WITH_MAIN_ONLY.format(program=program))
    except ValueError as exc:
        said = str(exc)
        if "tether run" not in said and "--processes" not in said:
            said += " (tether run runs any command, without the debugger)"
        raise SystemExit(f"tether: {said}") from None


def _per_node(args: argparse.Namespace, gpus: int, cpus: int) -> dict[str, int]:
    """``nodes``, ``gpus`` and ``cpus`` from ``--nodes``, ``--gpus-per-node``, ``--cpus-per-node``
    over ``gpus``/``cpus`` (``--gpus``/``--cpus``, else the profile's). With more than one node
    GPUs and CPUs are per node: ``--gpus``/``--cpus`` would read as the run's total, so they are
    refused there."""
    nodes = _given(getattr(args, "nodes", None), 1)
    for what in ("gpus", "cpus"):
        per_node = getattr(args, f"{what}_per_node", None)
        given = getattr(args, what, None)
        if nodes > 1 and given is not None:
            raise SystemExit(
                f"tether: with --nodes {nodes}, --{what} is ambiguous: give --{what}-per-node N "
                f"(each of the {nodes} nodes gets N)"
            )
        if per_node is not None and given is not None:
            raise SystemExit(f"tether: give --{what} or --{what}-per-node, not both")
        if per_node is not None:
            if what == "gpus":
                gpus = per_node
            else:
                cpus = per_node
    return {"nodes": nodes, "gpus": gpus, "cpus": cpus}


def _amounts(items: list[str] | None) -> dict[str, float]:
    """``--resource NAME=AMOUNT`` items."""
    out = {}
    for name, text in pairs(items, "--resource", {}).items():
        try:
            out[name] = float(text)
        except ValueError:
            raise SystemExit(f"tether: --resource {name}={text}: the amount is a number") from None
    return out


def _backend(name: str) -> str:
    if name not in KNOWN_BACKENDS:
        raise SystemExit(
            f"tether: unknown backend {name!r}: use {', '.join(KNOWN_BACKENDS[:-1])} or "
            f"{KNOWN_BACKENDS[-1]} "
            "(a run for a backend nobody serves would wait in its queue for ever)"
        )
    return name


async def submit_run(
    relay: Endpoint,
    spec: RunSpec,
    say: Callable[[str], None],
    *,
    limit: int = 0,
    progress: Callable[[int, int], None] | None = None,
    hashing: Callable[[int, int], None] = lambda _done, _total: None,
) -> RunRecord:
    """Snapshot the working directory (``hashing``: the progress of reading the files it has no
    digest of), upload what the relay lacks (``progress``), submit the run."""

    key = new_key()  # asked again, the same run (``protocol_specs/runs/submits.py``)

    def submit(control: ControlClient, tree: str) -> Awaitable[RunRecord]:
        return control.submit(spec, tree=tree, key=key)

    record, said = await on_snapshot(
        relay, Path(spec.workdir), submit, say, limit=limit, progress=progress, hashing=hashing,
        again=True, command=spec.command,
    )  # fmt: skip
    say(f"submitted run {record.id}: {' '.join(spec.command)} ({said})")
    say(unattended_text(spec))
    return record


#: how long a submit whose relay was lost is asked again (it names its request: one run at most)
ASK_AGAIN_FOR = 120.0


async def on_snapshot(
    relay: Endpoint,
    root: Path,
    submit: Callable[[ControlClient, str], Awaitable[_T]],
    say: Callable[[str], None],
    *,
    limit: int = 0,
    progress: Callable[[int, int], None] | None = None,
    hashing: Callable[[int, int], None] = lambda _done, _total: None,
    again: bool = False,
    command: list[str] | None = None,
) -> tuple[_T, str]:
    """Snapshot ``root``, upload what the relay lacks, then ``submit(control, root tree)``; what
    it gave, and a few words on the snapshot (``3 files, 0.0 MiB; uploaded ...``). ``again``:
    ``submit`` may be asked again (it names its request): a relay lost once it was reached is
    asked again, on a new connection, for :data:`ASK_AGAIN_FOR` seconds. ``command``: the run's,
    whose script must be in the snapshot (refused here, not after the queue)."""
    import trio

    from adapter.snapshots.hash_cache import HashCache
    from adapter.snapshots.snapshot import DEFAULT_LIMIT, SnapshotError, build_snapshot
    from adapter.snapshots.snapshot_upload import submit_on_snapshot

    cache = HashCache.for_tree(tether_home() / "cache" / "snapshots", root)
    try:
        snapshot = build_snapshot(
            root, limit=limit or DEFAULT_LIMIT, cache=cache, save=False, progress=hashing
        )
    except SnapshotError as exc:
        raise SystemExit(f"tether: {exc}") from None
    for warning in snapshot.warnings:
        say(f"warning: {warning}")
    if command is not None:
        try:
            check_targets(command, root, lambda rel: tree_holds(snapshot.trees, rel))
        except ValueError as exc:
            raise SystemExit(f"tether: {exc}") from None
    reached, since, pause = False, 0.0, 0.5
    while True:
        try:
            async with (
                trio.open_nursery() as nursery,
                open_control(relay, client="tether-cli") as control,
            ):
                reached = True
                nursery.start_soon(trio.to_thread.run_sync, cache.save)  # while the relay is asked
                try:
                    done, uploaded = await submit_on_snapshot(
                        control,
                        snapshot,
                        lambda tree: submit(control, tree),
                        progress or (lambda _d, _t: None),
                    )
                except SnapshotError as exc:
                    raise SystemExit(f"tether: {exc}") from None
            break
        except (RelayError, BaseExceptionGroup) as failed:
            refused = relay_error(failed)
            if refused is None:
                raise
            since = since or trio.current_time()
            lost = refused.code in (ErrorCode.UNREACHABLE, ErrorCode.INTERNAL)
            if not (again and reached and lost) or trio.current_time() - since > ASK_AGAIN_FOR:
                raise SystemExit(f"tether: {refused.message}") from None
            say(f"lost the relay ({refused.message}); asking again (the same run, never a second)")
        await trio.sleep(pause)  # the relay's restart: nothing to wait on from here
        pause = min(pause * 2, 5.0)
    return done, (
        f"{snapshot.files} files, {mib(snapshot.size)}; uploaded {uploaded.blobs} new files, "
        f"{mib(uploaded.bytes)}; {uploaded.reused} already on the relay"
    )
