"""``tether sweep``: start a sweep (``protocol_specs/sweeps/sweeps.py``) from flags or a YAML file, and
``tether sweep ls | status SWEEP | cancel SWEEP``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import trio
from pydantic import ValidationError

from adapter.show.render import sweep_text, sweeps_table
from protocol_specs.plain_words import invalid
from protocol_specs.sweeps.sweeps import SweepSpec, SweepState, parse_objective, parse_param
from protocol_specs.web.web import sweep_path
from protocol_specs.wire import wire
from relay.client import ControlClient, Endpoint, open_control

from .errors import control_call
from .options import relay_flag
from .settings import count, parse_duration, resolve_relay, web_url
from .submission import build_spec, on_snapshot

__all__ = ["SWEEP_ACTIONS", "action_parser", "cmd_sweep"]

#: what ``tether sweep WORD`` does besides starting one: its argument, and what it does
SWEEP_ACTIONS = {
    "ls": ("", "list your sweeps, newest first"),
    "status": ("SWEEP", "show a sweep: its state, trials, the best one, its page's address"),
    "cancel": ("SWEEP", "cancel a sweep: its unfinished trials are cancelled"),
}
#: a sweep's fields by the flag (or the sweep file's key) that sets them
SWEEP_NAMES = {
    "params": "--param (params)",
    "trials": "--trials (trials)",
    "parallel": "--parallel (parallel)",
    "search": "--search (search)",
    "objective": "--objective (objective)",
    "early_stop": "--early-stop (early_stop)",
    "seed": "--seed (seed)",
    "stop_grace": "--stop-grace (stop_grace)",
    "debug_others": "--debug-others (debug_others)",
    "name": "--name (name)",
}
#: seconds between two looks at a followed sweep
_FOLLOW_EVERY = 2.0


async def cmd_sweep(args: argparse.Namespace) -> int:
    words = list(args.command)
    if words and words[0] in SWEEP_ACTIONS:
        return await _action(words, args)
    spec = sweep_spec(args)  # what is wrong with the sweep first: no relay needed
    relay = resolve_relay(args.relay, args)

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def submit(control: ControlClient, tree: str) -> Awaitable[wire.SweepInfo]:
        return control.submit_sweep(spec, tree=tree)

    info, said = await on_snapshot(
        relay, Path(spec.run.workdir), submit, say, limit=args.snapshot_limit,
        command=spec.run.command,
    )  # fmt: skip
    if info.sweep.state is SweepState.FAILED:  # its first round failed
        raise SystemExit(f"tether: sweep {info.sweep.id} failed: {info.sweep.detail}")
    say(f"submitted sweep {info.sweep.id}: {spec.total()} trials, {spec.parallel} at once ({said})")
    if args.json:
        print(info.model_dump_json(indent=2))
    else:
        print(info.sweep.id)
    if args.follow:
        return await _follow(relay, info.sweep.id)
    return 0


def sweep_spec(args: argparse.Namespace) -> SweepSpec:
    """The sweep the flags and ``--file`` describe (flags win), checked now: not after a queue
    wait."""
    given = _file(args.file) if args.file else {}
    if not args.command or args.command == ["--"]:
        command = given.pop("command", None)
        if isinstance(command, str):
            command = command.split()
        if command:
            args.command = ["--", *map(str, command)]
    for key in ("env", "metric", "tag"):
        extra = given.pop(key, None)
        if extra:
            pairs = [f"{k}={v}" for k, v in extra.items()] if isinstance(extra, dict) else extra
            setattr(args, key, [*map(str, pairs), *(getattr(args, key, None) or [])])
    for key in (
        "gpus",
        "cpus",
        "nodes",
        "backend",
        "name",
        "max_retries",
        "preempt_grace",
        "debug_when",
    ):
        if getattr(args, key, None) is None and key in given:
            setattr(args, key, given.pop(key))
    run = build_spec(args, debug=False)
    params = [
        *_file_params(given.pop("params", {})),
        *(args.param or []),
    ]
    try:
        spec = SweepSpec(
            params=[parse_param(text) for text in params],
            trials=_pick(args.trials, given, "trials", 10),
            parallel=_pick(args.parallel, given, "parallel", 1),
            search=_pick(args.search, given, "search", "random"),
            objective=_objective(_pick(args.objective, given, "objective", "")),
            early_stop=_pick(args.early_stop, given, "early_stop", "none"),
            seed=_pick(args.seed, given, "seed", 0),
            stop_grace=_pick(args.stop_grace, given, "stop_grace", 30.0, parse_duration),
            debug_others=_pick(args.debug_others, given, "debug_others", "continue"),
            name=run.name,
            run=run,
        )
    except ValidationError as exc:
        raise SystemExit(f"tether: invalid sweep: {invalid(exc, SWEEP_NAMES)}") from None
    except ValueError as exc:
        raise SystemExit(f"tether: {exc}") from None
    try:  # what the relay and the samplers can hold (the relay checks it again)
        spec.check_limits()
    except ValueError as exc:
        raise SystemExit(f"tether: invalid sweep: {exc}") from None
    return spec


def _pick(flag: Any, given: dict[str, Any], key: str, default: Any, cast: Any = None) -> Any:
    if flag is not None:
        return flag
    value = given.get(key.replace("_", "-"), given.get(key, default))
    return cast(str(value)) if cast is not None and isinstance(value, str) else value


def _objective(text: str) -> Any:
    return parse_objective(text) if text else None


def _file(path: str) -> dict[str, Any]:
    import yaml

    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise SystemExit(f"tether: --file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SystemExit(f"tether: --file {path} is not YAML: {exc}") from None
    if not isinstance(loaded, dict):
        raise SystemExit(f"tether: --file {path}: a mapping of settings, e.g. trials: 12")
    known = {
        "command", "params", "trials", "parallel", "search", "objective", "early_stop",
        "early-stop", "seed", "stop_grace", "stop-grace", "env", "metric", "tag", "gpus", "cpus",
        "nodes", "backend", "name", "max_retries", "preempt_grace", "debug_when", "debug_others",
        "debug-others",
    }  # fmt: skip
    unknown = sorted(set(loaded) - known)
    if unknown:
        raise SystemExit(
            f"tether: --file {path}: unknown setting {unknown[0]!r} (known: "
            f"{', '.join(sorted(k for k in known if '-' not in k))})"
        )
    return dict(loaded)


def _file_params(params: Any) -> list[str]:
    """A file's ``params``: ``{lr: "log:1e-5:1e-2", bs: [16, 32]}``."""
    if not isinstance(params, dict):
        raise SystemExit("tether: --file: params is a mapping, e.g. lr: log:1e-5:1e-2")
    out = []
    for name, space in params.items():
        if isinstance(space, list):
            space = ",".join(str(v) for v in space)
        out.append(f"{name}={space}")
    return out


def action_parser(what: str) -> argparse.ArgumentParser:
    """``tether sweep ls | status SWEEP | cancel SWEEP``: each its own options and ``--help``."""
    usage, text = SWEEP_ACTIONS[what]
    parser = argparse.ArgumentParser(
        prog=f"tether sweep {what}", description=text, allow_abbrev=False
    )
    relay_flag(parser)
    if what == "ls":
        parser.add_argument("-n", "--limit", type=count, help="how many, newest first (default 30)")
    else:
        parser.add_argument(
            "sweep", nargs="?", metavar=usage, help="the sweep: its id, a prefix, or its name"
        )
    parser.add_argument("--json", action="store_true", help="print the sweep(s) as JSON")
    return parser


def _action_args(words: list[str], args: argparse.Namespace) -> tuple[str, list[str]]:
    """``ls``, ``status SWEEP``, ``cancel SWEEP``, with the options that may follow the word
    (``--relay``, ``--json``, ``-n``) read into ``args``; ``--help`` prints the action's help."""
    parser = action_parser(words[0])
    later, unknown = parser.parse_known_args(words[1:])  # --help: its help, exit 0
    what = words[0]
    if unknown and unknown[0].startswith("-"):
        raise SystemExit(f"tether: sweep {what}: unknown option {unknown[0]} (--help)")
    if unknown:
        said = "takes no arguments" if what == "ls" else "names one sweep"
        raise SystemExit(f"tether: sweep {what} {said}, not {unknown[0]} (--help)")
    if what != "ls" and not later.sweep:
        raise SystemExit(f"tether: sweep {what} SWEEP: name one sweep (tether sweep ls)")
    for name in ("relay", "ca_file", "profile", "limit"):
        if getattr(later, name, None) is not None:
            setattr(args, name, getattr(later, name))
    args.json = args.json or later.json
    return what, [later.sweep] if what != "ls" else []


async def _action(words: list[str], args: argparse.Namespace) -> int:
    what, rest = _action_args(words, args)
    relay = resolve_relay(args.relay, args)
    async with open_control(relay, client="tether-cli") as control:
        if what == "ls":
            sweeps = await control_call(control.list_sweeps(args.limit))
            if args.json:
                print(json.dumps([s.model_dump(mode="json") for s in sweeps], indent=2))
            else:
                print(sweeps_table(sweeps, time.time()))
            return 0
        if what == "cancel":
            info = await control_call(control.cancel_sweep(rest[0]))
            print(f"sweep {info.sweep.id}: {info.sweep.state.value}")
            return 0
        info = await control_call(control.get_sweep(rest[0]))
    if args.json:
        print(info.model_dump_json(indent=2))
    else:
        print(sweep_text(info.sweep, info.trials, time.time()))
        print(f"\npage       {web_url(relay.url, sweep_path(info.sweep.id))}")
    return 0


async def _follow(relay: Endpoint, sweep_id: str) -> int:
    """Print the sweep's trials each time they change, until it ends."""
    shown = ""
    async with open_control(relay, client="tether-cli") as control:
        while True:
            info = await control_call(control.get_sweep(sweep_id))
            text = sweep_text(info.sweep, info.trials, time.time(), ages=False)
            if text != shown:
                print(text + "\n", flush=True)
                shown = text
            if info.sweep.finished:
                return 0 if info.sweep.state.value == "finished" else 1
            await trio.sleep(_FOLLOW_EVERY)
