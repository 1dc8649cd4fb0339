"""The long-running commands: ``tether up`` (the embedded stack), ``tether relay``, ``tether
worker`` (a pool, or the one attempt a scheduler job was made for) and ``tether backend`` (a
scheduler backend). Each runs until it is stopped."""

from __future__ import annotations

import argparse
import errno
import getpass
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from adapter.config import ConfigError, check_config, profile_token
from adapter.show.render import Clock
from relay.client import Endpoint, RelayError

from .errors import leaves, store_at

if TYPE_CHECKING:
    from worker_shim.program.identity import Isolation
from .settings import (
    is_loopback,
    pairs,
    read_credentials,
    redact_url,
    relay_config,
    resolve_relay,
    tether_home,
    tls_context,
    web_url,
)

__all__ = ["cmd_backend", "cmd_relay", "cmd_up", "cmd_worker"]


async def cmd_relay(args: argparse.Namespace) -> int:
    from relay.server import serve_relay, server_port
    from relay.snapshots.blobs import FileBlobStore

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
    async with store_at(args.redis) as store, trio.open_nursery() as nursery:
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
            first = leaves(exc)[0]
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
        if args.web:
            own = f"{scheme}://{args.host}:{server_port(server)}"
            page = f"{args.public_url}/ui" if args.public_url else web_url(own)
            print(f"tether relay: web view at {page} (log in: tether ui)", flush=True)
        if tls is None and not is_loopback(args.host):
            print("tether relay: warning: serving without TLS (--insecure)", flush=True)
    return 0


async def cmd_worker(args: argparse.Namespace) -> int:
    from worker_shim.backends.pool import run_node, run_one, run_pool

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
    if args.scheduler and not run_id:
        raise SystemExit("tether: --scheduler is for a scheduler job's worker (--run RUN)")
    if args.node and not run_id:
        raise SystemExit("tether: --node K needs --run RUN --attempt N (the attempt it joins)")
    if not 0 <= args.node <= 63:
        raise SystemExit("tether: --node K is a node of the run: 0 to 63")
    if run_id:
        if not attempt:
            raise SystemExit("tether: --run needs --attempt N (the attempt this job runs)")
        import socket

        worker = f"{socket.gethostname()}-{os.getpid()}"
        try:
            if args.node:
                code = await run_node(
                    relay, run_id, attempt, args.node, work_dir=work_dir, worker=worker,
                    on_event=clock.say, allow_tunnels=not args.no_shell,
                    isolation=node_isolation(args),
                )  # fmt: skip
            else:
                code = await run_one(
                    relay,
                    run_id,
                    attempt,
                    work_dir=work_dir,
                    worker=worker,
                    on_event=clock.say,
                    allow_tunnels=not args.no_shell,
                    scheduler=args.scheduler or "",
                    term_wait=term_wait_of(args),
                )
        except RelayError as exc:
            raise SystemExit(f"tether worker: {exc.message}") from None
        return code if code is not None and code >= 0 else 1
    gpus = [g for g in args.gpus.split(",") if g] if args.gpus is not None else None
    node_via = nodes_of(args, "tether worker")
    isolation = isolation_of(args, "tether worker")
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
                allow_tunnels=not args.no_shell,
                isolation=isolation,
                nodes=args.nodes,
                node_via=node_via,
                task_status=task_status,
            )
        )
        print(
            f"tether worker: ready relay={relay.url} slots={args.slots} work_dir={work_dir}\n"
            f"  {isolation.describe()}",
            flush=True,
        )
    return 0


def term_wait_of(args: argparse.Namespace) -> float:
    """The job's scheduler's wait between SIGTERM and SIGKILL (``--kill-wait``, else its own)."""
    from worker_shim.program.sched_warnings import RAY_STOP_WAIT, SLURM_KILL_WAIT, ray_stop_wait

    if args.kill_wait is not None:
        return float(args.kill_wait)
    if args.scheduler == "ray":
        return ray_stop_wait(os.environ)
    return SLURM_KILL_WAIT if args.scheduler == "slurm" else RAY_STOP_WAIT


def nodes_of(args: argparse.Namespace, who: str) -> list[list[str]]:
    """The pool's ``--node-via`` prefixes, split as a shell would, checked against ``--nodes``."""
    import shlex

    from worker_shim.backends.nodes import check_nodes

    try:
        via = [shlex.split(prefix) for prefix in args.node_via or []]
        check_nodes(args.nodes, via)
    except ValueError as exc:
        raise SystemExit(f"{who}: {exc}") from None
    return via


def node_isolation(args: argparse.Namespace) -> Isolation:
    """A node's worker's isolation: a pool's, as its options pass it on (``--run-uids``,
    ``--runs-root``: isolated as a root pool isolates); without them its program runs as the
    worker's user, as a scheduler job's does (the job's user)."""
    from worker_shim.program.identity import Isolation

    if args.no_isolation or not (args.run_uids or args.runs_root):
        return Isolation()
    return isolation_of(args, "tether worker")


def isolation_of(args: argparse.Namespace, who: str, user: str = "") -> Isolation:
    """The pool's isolation as its options say (``user``: whose runs it serves when it cannot
    isolate; ``""``: its token's user)."""
    from worker_shim.program.identity import Isolation

    try:
        return Isolation.decide(
            user=user,
            uids=args.run_uids,
            runs_root=Path(args.runs_root).resolve() if args.runs_root else None,
            isolate=False if args.no_isolation else None,
            any_user=args.any_user,
        )
    except ValueError as exc:
        raise SystemExit(f"{who}: {exc}") from None


async def cmd_up(args: argparse.Namespace) -> int:
    try:  # every other command would refuse it: said now, not after the stack started
        check_config()
    except ConfigError as exc:
        raise SystemExit(f"tether up: {exc}") from None
    data_dir = Path(args.data_dir or tether_home() / "data").resolve()  # noqa: ASYNC240 (startup)
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # the store, blobs, logs: ours only
    clock = Clock("")
    nodes_of(args, "tether up")
    try:
        return await _up(args, data_dir, clock)
    except* (RuntimeError, OSError) as group:  # the stack could not start: say why, no traceback
        if _UP_READY:
            raise
        first = leaves(group)[0]
        if isinstance(first, OSError) and first.errno == errno.EADDRINUSE:
            raise SystemExit(
                f"tether up: the relay's port {args.relay_port} is in use (another tether up?); "
                "stop that one, or choose another with --relay-port N"
            ) from None
        raise SystemExit(f"tether up: {first}") from None


#: whether ``tether up`` got as far as serving (failures after that are not start-up failures)
_UP_READY: list[bool] = []


async def _up(args: argparse.Namespace, data_dir: Path, clock: Clock) -> int:
    from .local_stack import open_local_stack
    from .stacks import live_stacks, read_token, record_stack, unrecord_stack, write_token

    home = tether_home()
    async with open_local_stack(
        data_dir,
        # this data directory's token from its last start (an older tether kept it in the config)
        token=os.environ.get("TETHER_TOKEN") or read_token(data_dir) or profile_token(),
        redis=args.redis,
        relay_config=relay_config(args),
        relay_port=args.relay_port,
        workers=args.workers,
        start_delay=args.start_delay,
        gpus=[g for g in args.gpus.split(",") if g] if args.gpus is not None else None,
        on_worker_event=clock.say,
        pool_bounds=(args.keep_runs, args.cache_max * 2**20),
        allow_tunnels=not args.no_shell,
        isolation=isolation_of(args, "tether up", getpass.getuser()) if args.workers else None,
        nodes=args.nodes,
        node_via=nodes_of(args, "tether up"),
    ) as stack:
        relay, redis_url = stack.relay, stack.redis
        if stack.minted or read_token(data_dir) != stack.token:
            try:
                where = write_token(data_dir, stack.token)
            except OSError as exc:
                raise SystemExit(f"tether up: cannot save the token: {exc}") from None
            print(f"tether up: a token for {stack.user} is in {where} (mode 0600)", flush=True)
        else:
            print(f"tether up: using {stack.user}'s token in {data_dir / 'token'}", flush=True)
        others = [s for s in live_stacks(home) if s.data_dir != data_dir]
        record_stack(home, relay, data_dir)
        since = time.time()  # a run its pool loses from now on is lost by this stack's stop
        print(f"tether up: ready relay={relay} data={data_dir}", flush=True)
        if stack.isolation is not None:
            print(f"  {stack.isolation.describe()}", flush=True)
        _UP_READY.append(True)
        print(
            f"  redis: {redis_url}\n  workers: {args.workers} (start delay {args.start_delay:g} s)\n"
            + (f"  web view: {web_url(relay)} (log in: tether ui)\n" if args.web else "")
            + "".join(f"  another tether up runs: {other.describe()}\n" for other in others)
            + (
                f"  commands choose this one with --stack {data_dir} (or TETHER_STACK)\n"
                if others
                else ""
            )
            + "  in another terminal: tether debug -- python your_script.py",
            flush=True,
        )
        try:
            await trio.sleep_forever()
        finally:
            unrecord_stack(home, data_dir)
            await _say_what_stops(stack.endpoint, since)
    return 0


async def _say_what_stops(relay: Endpoint, since: float) -> None:
    """Before the pool stops (Ctrl-C, SIGTERM): which runs end lost with it, or that none ran."""
    from relay.client import open_control

    from .local_stack import pool_name, stopping_text

    said = "its runs could not be listed; `tether ls` after the next `tether up` shows them"
    with trio.CancelScope(shield=True), trio.move_on_after(3):
        try:
            async with open_control(relay, client="tether-up") as control:
                said = stopping_text(await control.list_runs(1000), pool_name(), since)
        except (RelayError, OSError):
            pass
    print(f"\ntether up: stopping: {said}", flush=True)


async def cmd_backend(args: argparse.Namespace) -> int:
    from worker_shim.backends.scheduler import SchedulerBackend, SchedulerError

    relay = resolve_relay(args.relay, args)
    clock = Clock(f"{args.kind}: ")
    state_dir = Path(args.state_dir or tether_home() / args.kind).resolve()  # noqa: ASYNC240 (startup)
    common: dict[str, Any] = {
        "state_dir": state_dir,
        "worker_relay": args.worker_relay or relay.url,
        "python": args.python,
        "poll": args.poll,
        "on_event": clock.say,
        "allow_tunnels": not args.no_shell,
    }
    backend: SchedulerBackend
    where = ""
    if args.kind == "ray":
        from worker_shim.backends.ray_jobs import RayBackend, RayJobs

        address = args.address or os.environ.get("RAY_ADDRESS", "")
        if not address:
            raise SystemExit("tether backend ray: give the dashboard: --address http://HEAD:8265")
        jobs = RayJobs(address, pairs(args.header, "--header", {}))
        try:
            where = f" ray={await jobs.version()} at {jobs.address}"
        except SchedulerError as exc:
            raise SystemExit(f"tether backend ray: {exc}") from None
        backend = RayBackend(relay, jobs=jobs, work_dir=args.work_dir or "", **common)
    else:
        from worker_shim.backends.slurm import SlurmBackend

        backend = SlurmBackend(relay, sbatch_args=args.sbatch_arg or [], **common)
    print(
        f"tether backend {args.kind}: ready relay={relay} state_dir={state_dir}{where}", flush=True
    )
    await backend.serve()
    return 0
