"""The option groups several commands share: how to find the relay, the run's options (``run``,
``debug``), the local adapter's, a worker pool's, and the relay's limits. Every option has help
text (a unit test walks the parser)."""

from __future__ import annotations

import argparse

from protocol_specs.runs.spec import KNOWN_BACKENDS
from worker_shim.backends.housekeeping import CACHE_MAX_BYTES, KEEP_RUNS

from .settings import DEFAULT_ADAPTER_PORT, parse_duration, parse_memory, public_url

__all__ = ["adapter_options", "pool_options", "relay_flag", "relay_options", "run_options"]


def relay_flag(sp: argparse.ArgumentParser) -> None:
    """How a command finds the relay: ``--relay``, ``--ca-file``, ``--profile``."""
    sp.add_argument(
        "--relay",
        help="relay URL (default: $TETHER_RELAY, the config profile's, else the running "
        "`tether up`'s)",
    )
    sp.add_argument(
        "--stack",
        metavar="DATA_DIR",
        help="talk to the `tether up` whose data directory is DATA_DIR, when several run "
        "(default: $TETHER_STACK, else the only one running, else the default data directory's)",
    )
    sp.add_argument(
        "--ca-file",
        metavar="FILE",
        help="verify a wss:// relay's certificate against this CA file (default: "
        "$TETHER_CA_FILE, the profile's ca_file, else the system CAs)",
    )
    if not any(a.dest == "profile" for a in sp._actions):
        sp.add_argument("--profile", help="config profile (default: $TETHER_PROFILE)")


def run_options(s: argparse.ArgumentParser, *, debug: bool) -> None:
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
    s.add_argument(
        "--local-env",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the command in the Python environment you submit from: a python (or "
        "torchrun...) that your active venv or conda env provides, or a path into one "
        "(.venv/bin/python), is named by its absolute path, which the worker must see (default: "
        "on; config key local_env); --no-local-env: as written, found on the worker",
    )
    s.add_argument("--name", help="a label for the run")
    s.add_argument("--tag", action="append", metavar="TAG", help="a tag for the run (repeatable)")
    s.add_argument(
        "--metric",
        action="append",
        metavar="PATTERN",
        help="a regular expression whose named groups are metrics in the program's output "
        "lines, e.g. 'loss=(?P<loss>[\\d.e+-]+)' (a group named step: the step); repeatable. "
        "No code change needed; tether.report() in the program is the other way",
    )
    s.add_argument(
        "--outputs",
        action="extend",
        nargs="+",
        metavar="GLOB",
        help="files the run produces, relative to its directory ('out/', 'preds.csv', "
        "'**/*.png'): the worker sends them home after each attempt and each checkpoint; "
        "fetch them with tether cp RUN:PATH, list them with tether outputs RUN (config key "
        "outputs; end the list with -- before the command)",
    )
    s.add_argument(
        "--debug-when",
        metavar="CONDITION",
        help="pause the program where tether.report() is called with metrics that meet this "
        "condition, e.g. 'loss != loss' (NaN) or 'isnan(loss) or grad_norm > 1e3', once; "
        "an IDE attaches to it there (a sweep: the first trial only)",
    )
    s.add_argument(
        "--stop",
        choices=["all", "one"],
        default=None,
        help="when one rank of a distributed job stops, pause every rank, and apply continue, "
        "step and pause in any rank's session to all of them (all, the default, acting once a "
        "second rank exists), or each rank on its own (one)",
    )
    g = s.add_argument_group("resources and placement")
    g.add_argument(
        "--backend", choices=KNOWN_BACKENDS, help="where to run: local (default), slurm or ray"
    )
    g.add_argument("--gpus", type=int, metavar="N", help="GPUs for the run (default 0)")
    g.add_argument("--cpus", type=int, metavar="N", help="CPUs for the run (default 1)")
    g.add_argument(
        "--nodes",
        type=int,
        metavar="N",
        help="nodes the run spans, one worker each, given its rendezvous (MASTER_ADDR, "
        "NODE_RANK, torchrun's PET_* variables): the local pool's --nodes, Slurm or Ray "
        "(default 1)",
    )
    g.add_argument(
        "--gpus-per-node", type=int, metavar="G", help="with --nodes: GPUs on each node (default 0)"
    )
    g.add_argument(
        "--cpus-per-node", type=int, metavar="C", help="with --nodes: CPUs on each node (default 1)"
    )
    g.add_argument(
        "--mem", type=parse_memory, metavar="SIZE", help="memory, e.g. 16G (Slurm --mem)"
    )
    g.add_argument(
        "--time", type=parse_duration, metavar="DURATION", help="time limit, e.g. 4h (Slurm --time)"
    )
    g.add_argument("--partition", help="Slurm partition")
    g.add_argument(
        "--resource",
        action="append",
        metavar="NAME=AMOUNT",
        help="a Ray custom resource the run holds, e.g. accelerator_type:A100=1 (repeatable)",
    )
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
    g.add_argument(
        "--preempt-grace",
        type=parse_duration,
        metavar="DURATION",
        help="a preempted attempt (tether preempt, pause, a scheduler's warning) has this long to "
        "checkpoint and exit before it is ended (default 60s)",
    )
    g = s.add_argument_group("checkpoints (tether.save_checkpoint)")
    g.add_argument(
        "--keep-checkpoints",
        type=int,
        metavar="K",
        help="keep the run's last K checkpoints (default 3; config key keep_checkpoints); a "
        "retried or resumed attempt starts from the latest",
    )
    g.add_argument(
        "--from-checkpoint",
        metavar="RUN[:STEP]",
        help="start from another run's checkpoint (its latest, or STEP's), restored in "
        "tether.checkpoint_dir() before the program starts, until this run saves its own",
    )
    g = s.add_argument_group("when the program pauses with no IDE attached")
    g.add_argument(
        "--post-mortem",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="an uncaught exception stops the program in its raising frame instead of ending "
        "it, until an IDE lets it go or --on-unattended-stop acts (default: on; config key "
        "post_mortem)",
    )
    g.add_argument(
        "--on-unattended-stop",
        choices=["wait", "continue", "terminate", "suspend"],
        help="wait for an IDE (the run keeps its GPUs meanwhile), or continue / terminate / "
        "suspend (the program's tether.on_suspend saves a checkpoint, the run is suspended and "
        "frees its slot; tether resume continues it) after "
        + (
            "--unattended-timeout (default: terminate on the local pool, whose slots are few; "
            "wait on slurm and ray)"
            if debug
            else "--unattended-timeout (default: continue: the program goes on, or ends as it "
            "would have after an uncaught exception)"
        ),
    )
    g.add_argument(
        "--unattended-fallback",
        choices=["wait", "continue", "terminate"],
        help="what acts when --on-unattended-stop suspend cannot (the program registered no "
        "tether.on_suspend function, or it failed; default wait: nothing is lost; config key "
        "unattended_fallback)",
    )
    g.add_argument(
        "--unattended-timeout",
        type=parse_duration,
        metavar="DURATION",
        help="how long an unattended stop lasts before continue/terminate/suspend act "
        "(e.g. 90s, 30m, 2h; default 5m on the local pool, 30m on slurm and ray)",
    )
    g.add_argument(
        "--webhook",
        metavar="URL",
        help="POST a JSON notice here when the program pauses with no IDE attached",
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


def adapter_options(s: argparse.ArgumentParser) -> None:
    """The local DAP adapter's options (``debug``, ``attach``, ``rerun``)."""
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
    s.add_argument(
        "--json",
        action="store_true",
        help='print one JSON line once the adapter serves, {"run": ID, "port": P}, instead of '
        "the launch.json entry (for editors' extensions and scripts)",
    )


def pool_options(sp: argparse.ArgumentParser) -> None:
    """A worker pool's GPUs and housekeeping (``tether up``, ``tether worker``)."""
    sp.add_argument(
        "--gpus",
        metavar="LIST",
        help="GPU indices the pool hands out, e.g. 0,1,2,3 (default: what nvidia-smi lists)",
    )
    sp.add_argument(
        "--nodes",
        type=int,
        default=1,
        metavar="N",
        help="nodes the pool gives multi-node runs: this host (node 0) and N-1 more, each run "
        "through its --node-via prefix (default 1: single-node runs only)",
    )
    sp.add_argument(
        "--node-via",
        action="append",
        metavar="PREFIX",
        help="the command that runs a node's worker on node 1, then 2, ... (repeatable), e.g. "
        "'ip netns exec tn1' (it gets the attempt's token in its environment); a node without "
        "one runs on this host, in a directory of its own",
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
    sp.add_argument(
        "--no-shell",
        action="store_true",
        help="refuse the users' tether exec, shell and port-forward into the runs here",
    )
    sp.add_argument(
        "--start-delay",
        type=float,
        default=0.0,
        metavar="S",
        help="wait S seconds before starting a claimed run (a stand-in GPU queue)",
    )
    g = sp.add_argument_group(
        "isolation (a root worker runs each program as a uid of its own: SECURITY.md)"
    )
    g.add_argument(
        "--run-uids",
        type=_uids,
        metavar="FIRST-LAST",
        help="the uids a root worker gives programs, one each (default 60000-60999; none may "
        "have an account)",
    )
    g.add_argument(
        "--runs-root",
        metavar="DIR",
        help="where a root worker puts run directories, reachable by those uids (default "
        "$TETHER_RUNS_ROOT, else /var/lib/tether/runs)",
    )
    g.add_argument(
        "--no-isolation",
        action="store_true",
        help="run programs as this worker's own user (root too): it then runs only its own "
        "user's runs, unless --any-user",
    )
    g.add_argument(
        "--any-user",
        action="store_true",
        help="a worker whose programs run as itself runs every user's runs: each program can "
        "read the worker's credentials and the other runs (SECURITY.md)",
    )


def _uids(text: str) -> range:
    from worker_shim.program.identity import parse_uids

    try:
        return parse_uids(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def relay_options(s: argparse.ArgumentParser) -> None:
    """The relay's limits and timers (``tether relay``, ``tether up``)."""
    from relay.config import RelayConfig

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
        "--claim-confirm",
        type=parse_duration,
        default=d.claim_confirm,
        metavar="DURATION",
        help="a run claimed by a worker that does not confirm it holds the claim within this "
        f"long goes back to the queue, same attempt (default {d.claim_confirm:g}s)",
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
        help=f"silence before the relay probes a peer (TCP keepalive; default {d.ping_interval:g}s)",
    )
    g.add_argument(
        "--ping-timeout",
        type=parse_duration,
        default=d.ping_timeout,
        metavar="DURATION",
        help=f"drop a peer whose probes go unanswered this long (default {d.ping_timeout:g}s)",
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
    g.add_argument(
        "--max-sweeps",
        type=int,
        default=d.max_active_sweeps,
        metavar="N",
        help=f"most unfinished sweeps of one user (default {d.max_active_sweeps})",
    )
    g.add_argument(
        "--web",
        action=argparse.BooleanOptionalAction,
        default=d.web,
        help="serve the web view (/ui) on the relay's port (default: on)",
    )
    g.add_argument(
        "--public-url",
        type=public_url,
        default=None,
        metavar="URL",
        help="the relay's address as browsers reach it (https://tether.example.com), when a proxy "
        "stands in front: the web view's links and its same-origin check use it",
    )
