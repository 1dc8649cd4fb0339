"""The ``tether`` command tree (argparse): each command, its own options and help, and the function
that runs it. Options shared by several commands are in :mod:`.options`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, TypeAlias

from .admin import cmd_audit, cmd_token_create, cmd_token_list, cmd_token_revoke
from .demo import cmd_demo
from .experiments import cmd_metrics
from .options import adapter_options, pool_options, relay_flag, relay_options, run_options
from .parser_life import lifecycle_commands, outputs_commands
from .rank_eval import cmd_eval
from .rank_stacks import cmd_stacks
from .runs import (
    cmd_attach,
    cmd_cancel,
    cmd_debug,
    cmd_logs,
    cmd_ls,
    cmd_rerun,
    cmd_run,
    cmd_status,
    cmd_ui,
)
from .service import cmd_backend, cmd_relay, cmd_up, cmd_worker
from .settings import DEFAULT_RELAY_PORT, count, parse_duration, parse_ranks
from .sweeps import cmd_sweep
from .tunnel import cmd_exec, cmd_port_forward, cmd_shell, node_flag, process_flag

__all__ = ["build_parser"]


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


#: what ``add_subparsers`` returns: where commands are added
_Commands: TypeAlias = "argparse._SubParsersAction[_Parser]"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tether", description="Asynchronous debugging for ML runs.")
    p.add_argument("--version", action="version", version=f"tether {_version()}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    _up_command(sub)
    _run_commands(sub)
    _service_commands(sub)
    _admin_commands(sub)
    _demo_command(sub)
    return p


def _up_command(sub: _Commands) -> None:
    """``tether up``: the embedded stack, for one machine."""
    s = sub.add_parser(
        "up", help="run the embedded stack: Redis-compatible server, relay, local worker pool"
    )
    s.add_argument(
        "--data-dir", help="where data lives (default: $TETHER_HOME/data, TETHER_HOME=~/.tether)"
    )
    s.add_argument("--workers", type=int, default=2, help="local worker slots (default 2)")
    pool_options(s)
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


def _run_commands(sub: _Commands) -> None:
    """Submitting, debugging and watching runs (listed in this order in ``--help``)."""
    s = sub.add_parser("debug", help="submit a run in debug mode and serve the local DAP adapter")
    run_options(s, debug=True)
    relay_flag(s)
    adapter_options(s)
    s.add_argument(
        "--no-wait",
        action="store_true",
        help="start the program when the worker starts, even if no IDE configured breakpoints yet",
    )
    g = s.add_argument_group("processes (torchrun ranks, DataLoader workers, multiprocessing)")
    g.add_argument(
        "--processes",
        choices=["stopped", "all", "main"],
        default="stopped",
        help="which of the program's processes the IDE gets a session for: the main one and each "
        "child when it first stops (stopped, the default), every child as it starts (all), or "
        "the main one only, with children not debugged at all (main)",
    )
    g.add_argument(
        "--ranks",
        type=parse_ranks,
        metavar="LIST",
        help="only these ranks ($RANK of a torch.distributed job) get breakpoints, e.g. 0,3 or "
        "0-3; the other ranks run free (default: every process)",
    )
    s.set_defaults(fn=cmd_debug)

    s = sub.add_parser("run", help="submit a run without the debugger")
    run_options(s, debug=False)
    relay_flag(s)
    s.add_argument(
        "--debuggable",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="start a Python program so that `tether attach` can debug it later, without a "
        "restart; nothing of the debugger is loaded until then (default: on; config key "
        "debuggable)",
    )
    s.add_argument(
        "--json", action="store_true", help="print the run's record as JSON (default: its id)"
    )
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("attach", help="serve the local DAP adapter for an existing run")
    relay_flag(s)
    s.add_argument(
        "run", help="the run: its id, a unique prefix of it (4+ characters), or its name"
    )
    adapter_options(s)
    s.add_argument(
        "--rank",
        "--ranks",
        dest="focus",
        type=parse_ranks,
        metavar="LIST",
        help="focus on these ranks, e.g. 3 or 0-3,7: the IDE is offered sessions for them only, "
        "and only they get breakpoints (the group still stops and moves every rank; the last "
        "focus chosen for the run holds)",
    )
    s.set_defaults(fn=cmd_attach)

    s = sub.add_parser("ls", help="list runs, newest first")
    relay_flag(s)
    s.add_argument("-n", "--limit", type=count, default=30, help="how many, 1 to 1000 (default 30)")
    s.add_argument("--json", action="store_true", help="the run records as JSON")
    s.set_defaults(fn=cmd_ls)

    s = sub.add_parser("status", help="show a run: state, snapshot, resources, attempts")
    relay_flag(s)
    s.add_argument(
        "run", help="the run: its id, a unique prefix of it (4+ characters), or its name"
    )
    s.add_argument("--json", action="store_true", help="the run record as JSON")
    s.set_defaults(fn=cmd_status)

    s = sub.add_parser("ui", help="log into the web view: print (and open) a one-time link")
    relay_flag(s)
    s.add_argument("run", nargs="?", help="open this run's page (its id, a prefix, or its name)")
    s.add_argument(
        "--open",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="open the link in the browser (default: on; --no-open only prints it)",
    )
    s.set_defaults(fn=cmd_ui)

    s = sub.add_parser("logs", help="print a run's output (stdout and stderr)")
    relay_flag(s)
    s.add_argument(
        "run", help="the run: its id, a unique prefix of it (4+ characters), or its name"
    )
    s.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")
    s.set_defaults(fn=cmd_logs)

    s = sub.add_parser("metrics", help="print a run's metrics (tether.report, --metric)")
    relay_flag(s)
    s.add_argument(
        "run", help="the run: its id, a unique prefix of it (4+ characters), or its name"
    )
    s.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")
    s.add_argument("--json", action="store_true", help="one JSON object per point")
    s.set_defaults(fn=cmd_metrics)

    outputs_commands(sub)

    _sweep_command(sub)

    s = sub.add_parser(
        "exec",
        help="run a command on the run's worker, in its directory with its environment",
    )
    relay_flag(s)
    process_flag(s)
    node_flag(s)
    s.add_argument(
        "run", help="the run: its id, a unique prefix of it (4+ characters), or its name"
    )
    # ``--relay`` may come after RUN too: cmd_exec reads what precedes ``--``
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    s.set_defaults(fn=cmd_exec)

    s = sub.add_parser(
        "stacks",
        help="the Python stacks of every process of the run, merged into classes (ranks 0-2,4-7: "
        "...), read without stopping them",
    )
    relay_flag(s)
    s.add_argument(
        "run", help="the run: its id, a unique prefix of it (4+ characters), or its name"
    )
    s.add_argument("--json", action="store_true", help="the merged report as one JSON object")
    s.set_defaults(fn=cmd_stacks)

    s = sub.add_parser(
        "eval",
        help="evaluate an expression in every paused rank of the run and compare the values "
        "(ranks 0-2,4: 0.6931; min/max/mean; tensors: shape, dtype, norm, NaN/Inf)",
    )
    relay_flag(s)
    s.add_argument(
        "run", help="the run: its id, a unique prefix of it (4+ characters), or its name"
    )
    s.add_argument("expression", help="a Python expression, e.g. 'loss.item()' (quote it)")
    s.add_argument(
        "--ranks",
        type=parse_ranks,
        default=None,
        help="only these ranks, e.g. 0,3 or 0-3 (default: every paused rank)",
    )
    s.add_argument(
        "--by-value",
        action="store_true",
        help="group the ranks by value, ordered by value (the ranks whose loss is NaN)",
    )
    s.add_argument("--json", action="store_true", help="the values as one JSON object")
    s.set_defaults(fn=cmd_eval)

    s = sub.add_parser(
        "shell", help="a shell on the run's worker, on this terminal, in the run's directory"
    )
    relay_flag(s)
    process_flag(s)
    node_flag(s)
    s.add_argument(
        "run", help="the run: its id, a unique prefix of it (4+ characters), or its name"
    )
    s.set_defaults(fn=cmd_shell)

    s = sub.add_parser(
        "port-forward",
        help="forward local ports to ports on the run's worker (like ssh -L), until Ctrl-C",
    )
    relay_flag(s)
    node_flag(s)
    s.add_argument(
        "run", help="the run: its id, a unique prefix of it (4+ characters), or its name"
    )
    s.add_argument(
        "forwards",
        nargs="+",
        metavar="[LOCAL:]REMOTE",
        help="127.0.0.1:LOCAL here to REMOTE on the worker's loopback (LOCAL 0: any free port)",
    )
    s.set_defaults(fn=cmd_port_forward)

    s = sub.add_parser("cancel", help="cancel a run (queued, running or paused)")
    relay_flag(s)
    s.add_argument(
        "run", help="the run: its id, a unique prefix of it (4+ characters), or its name"
    )
    s.set_defaults(fn=cmd_cancel)

    lifecycle_commands(sub)

    s = sub.add_parser(
        "rerun", help="run again with the same snapshot and command (debug runs get an adapter)"
    )
    relay_flag(s)
    s.add_argument(
        "run", help="the run: its id, a unique prefix of it (4+ characters), or its name"
    )
    s.add_argument("-f", "--follow", action="store_true", help="print the new run's output")
    adapter_options(s)
    s.set_defaults(fn=cmd_rerun)


def _sweep_command(sub: _Commands) -> None:
    """``tether sweep``: trials of a command over a search space (and ``ls``, ``status``,
    ``cancel``)."""
    s = sub.add_parser(
        "sweep",
        help="run a command over a search space, each trial a run "
        "(tether sweep --param lr=log:1e-5:1e-2 -- python train.py --lr {lr}); "
        "tether sweep ls | status SWEEP | cancel SWEEP",
    )
    run_options(s, debug=False)
    relay_flag(s)
    g = s.add_argument_group("the search (or in --file SWEEP.yaml)")
    g.add_argument(
        "--param",
        action="append",
        metavar="NAME=SPACE",
        help="a parameter: lr=log:1e-5:1e-2 (a float range, log scale), dropout=0:0.5, "
        "layers=int:2:8, bs=16,32,64 or opt=adam,sgd (choices); the command names it {lr}; "
        "the program also reads them with tether.params() (repeatable)",
    )
    g.add_argument("--trials", type=int, metavar="N", help="how many trials (default 10)")
    g.add_argument("--parallel", type=int, metavar="N", help="trials at once (default 1)")
    g.add_argument(
        "--search",
        choices=["random", "grid", "tpe"],
        help="how parameters are chosen (Optuna's samplers; default random; grid: every "
        "combination, at most --trials)",
    )
    g.add_argument(
        "--objective",
        metavar="METRIC[:min|max]",
        help="the metric a trial is judged by, e.g. loss:min (its last reported value)",
    )
    g.add_argument(
        "--early-stop",
        choices=["none", "asha", "median"],
        help="stop trials whose objective lags (Optuna's pruners; needs --objective)",
    )
    g.add_argument("--seed", type=int, help="the search's seed (default 0)")
    g.add_argument(
        "--stop-grace",
        type=parse_duration,
        metavar="DURATION",
        help="how long a stopped trial has to end by itself before it is cancelled (default 30s)",
    )
    g.add_argument(
        "--debug-others",
        choices=["continue", "pause"],
        help="while the trial that met --debug-when is paused, the other trials go on "
        "(continue, the default) or are held (pause) until it runs again",
    )
    g.add_argument("--file", metavar="SWEEP.yaml", help="the sweep's settings (flags win)")
    s.add_argument("--json", action="store_true", help="print the sweep as JSON")
    s.add_argument("-n", "--limit", type=count, default=30, help="sweep ls: how many (default 30)")
    s.set_defaults(fn=cmd_sweep)


def _service_commands(sub: _Commands) -> None:
    """The services of a shared deployment: relay, worker pool, scheduler backend."""
    s = sub.add_parser("relay", help="run the relay service")
    s.add_argument(
        "--redis",
        default=os.environ.get("TETHER_REDIS", "redis://127.0.0.1:6379"),
        help="Redis >= 6.2 or Valkey URL (redis://, unix://; a Redis Cluster: "
        "redis://NODE[,NODE...], any of its nodes; default $TETHER_REDIS)",
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
    pool_options(s)
    s.add_argument(
        "--work-dir", help="where run directories are made (default: $TETHER_HOME/worker)"
    )
    s.add_argument(
        "--name", help="the pool's name in `tether status` (default HOST-pool; slots add -N)"
    )
    s.add_argument("--run", help="run this run's attempt only, then exit")
    s.add_argument("--attempt", type=int, default=0, help="with --run: the attempt number")
    s.add_argument(
        "--node",
        type=int,
        default=0,
        metavar="K",
        help="with --run: join node K (>= 1) of a run that spans nodes, whose node 0 claimed "
        "the attempt (token: the attempt's worker token, TETHER_TOKEN)",
    )
    s.add_argument(
        "--credentials",
        metavar="FILE",
        help="a 0600 JSON file naming the relay (and run, attempt); never put these on the "
        "command line",
    )
    s.add_argument(
        "--scheduler",
        choices=["slurm", "ray"],
        help="with --run: the scheduler that started this job; its warnings (Slurm: SIGUSR1 "
        "before the time limit, SIGTERM on preemption or requeue; Ray: SIGTERM on `ray job stop`) "
        "preempt the attempt (the backends pass it)",
    )
    s.add_argument(
        "--kill-wait",
        type=float,
        metavar="S",
        help="with --scheduler: the scheduler's wait between SIGTERM and SIGKILL (default: "
        "Slurm 30, Ray $RAY_JOB_STOP_WAIT_TIME_S or 3)",
    )
    s.set_defaults(fn=cmd_worker)

    s = sub.add_parser(
        "backend", help="run a scheduler backend: submits queued runs as scheduler jobs"
    )
    relay_flag(s)
    s.add_argument("kind", choices=["slurm", "ray"], help="the scheduler")
    s.add_argument(
        "--state-dir",
        help="where the backend keeps its jobs (Slurm: job scripts, credentials and job logs too); "
        "default $TETHER_HOME/<kind>",
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
        help="how often the jobs' states are asked of the scheduler, e.g. 5s, 1m (default 5s)",
    )
    s.add_argument(
        "--no-shell",
        action="store_true",
        help="its jobs' workers refuse the users' tether exec, shell and port-forward",
    )
    g = s.add_argument_group("slurm")
    g.add_argument(
        "--sbatch-arg",
        action="append",
        metavar="ARG",
        help="extra sbatch argument for every job, e.g. --account=ml (repeatable)",
    )
    g = s.add_argument_group("ray")
    g.add_argument(
        "--address",
        metavar="URL",
        help="the Ray dashboard, e.g. http://HEAD:8265 (default $RAY_ADDRESS); a token for a "
        "cluster with token authentication is read from $RAY_AUTH_TOKEN",
    )
    g.add_argument(
        "--header",
        action="append",
        metavar="NAME=VALUE",
        help="an HTTP header for every request to the dashboard (a proxy's; repeatable)",
    )
    g.add_argument(
        "--work-dir",
        metavar="DIR",
        help="where the workers on the Ray nodes keep runs (default: their $TETHER_HOME/worker)",
    )
    s.set_defaults(fn=cmd_backend)


def _admin_commands(sub: _Commands) -> None:
    """Tokens and the audit trail."""
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


def _demo_command(sub: _Commands) -> None:
    """``tether demo``."""
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
