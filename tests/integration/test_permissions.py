"""Every cell of the permission table (``protocol_specs/access/permissions.py``, as SECURITY.md shows it),
walked against a live relay on the bundled server over real WebSockets.

For each act and each kind of token (the owner, another user, an admin, a backend, the worker of
the run's current attempt, the worker of another run, the worker of the run's earlier attempt, a
ticket for the run's current attempt), a
fresh scenario is made and the act is performed the way a client does it; what the relay answers
("ok", "scoped": allowed but without the owner's things, or the refusal's code) must be what the
table says.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import msgpack
import pytest
import trio
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import connect

from protocol_specs.access.auth import Scope
from protocol_specs.access.permissions import LINK_ACTS, Act, Holder, expected, permissions_markdown
from protocol_specs.checkpoints.files import FileSet
from protocol_specs.runs.spec import RunSpec
from protocol_specs.snapshots.snapshots import Manifest, ManifestEntry
from protocol_specs.sweeps.sweeps import SweepSpec, parse_param
from protocol_specs.wire import wire
from protocol_specs.wire.tunnels import TunnelSpec
from protocol_specs.wire.wire import Role, WorkerLink
from relay.auth import TokenStore
from relay.client import Endpoint, RelayError, open_control, open_run_link
from relay.config import RelayConfig
from relay.server import serve_relay, server_port
from relay.store import Store, open_store

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Scene:
    url: str
    run: str  #: the owner's run, at its second attempt
    blob: str  #: a blob in that run's snapshot, uploaded by the owner
    spare_token: str  #: the id of a token of the owner's (to revoke)
    holders: dict[Holder, Endpoint]
    owner: Endpoint
    backend: str
    sweep: str = ""  #: a sweep of the owner's (for the sweep acts)
    claim: str = ""  #: the claim of the run's second attempt, by its worker (not yet confirmed)


@pytest.fixture
async def relay(redis_servers: object) -> AsyncIterator[tuple[str, Store]]:
    url = redis_servers.get("bundled").url  # type: ignore[attr-defined]
    async with open_store(url) as store:
        await store.flushall()
        async with trio.open_nursery() as nursery:
            server = await nursery.start(
                lambda task_status: serve_relay(
                    store,
                    port=0,
                    # a sweep of alice's in each of the walk's scenes
                    config=RelayConfig(max_active_sweeps=1000),
                    task_status=task_status,
                )
            )
            yield f"ws://127.0.0.1:{server_port(server)}", store
            nursery.cancel_scope.cancel()


SWEEP_ACTS = frozenset({Act.SUBMIT_SWEEP, Act.GET_SWEEP, Act.CANCEL_SWEEP, Act.LIST_SWEEPS})


def sweep_spec(backend: str) -> SweepSpec:
    """A sweep whose trials queue on ``backend`` (nobody claims them)."""
    run = RunSpec(command=["python", "x.py", "{lr}"], workdir="/w", debug=False, backend=backend)
    return SweepSpec(params=[parse_param("lr=1,2")], trials=2, run=run)


async def scene(url: str, store: Store, *, claimed: bool = True, sweep: bool = False) -> Scene:
    """The owner's run at attempt 2 (attempt 1's job was lost), with a worker token for each
    attempt, and another run of theirs with its own worker token."""
    tokens = TokenStore(store)

    async def user(name: str, *scopes: Scope) -> Endpoint:
        token, _ = await tokens.create(name, scopes=list(scopes))
        return Endpoint(url, token=token)

    owner = await user("alice", Scope.RUNS)
    backend = f"b{secrets.token_hex(4)}"
    data = secrets.token_bytes(64)
    digest = hashlib.sha256(data).hexdigest()
    manifest = Manifest(entries=[ManifestEntry(path="train.py", digest=digest, size=len(data))])
    spec = RunSpec(
        command=["python", "train.py"],
        workdir="/w",
        max_retries=1,
        retry_backoff=0.0,
        backend=backend,
    )
    pool = await user("pool", Scope.BACKEND)
    async with open_control(owner) as control:
        await control.put_blob(digest, data)
        run = (await control.submit(spec, manifest)).id
        other = (await control.submit(spec)).id
        _, spare = await control.create_token(label="spare")
    async with open_control(pool) as control:
        first = await control.dispatch(backend, "sched")
        await control.report(run, 1, "lost", job="1", detail="preempted")
        second = await control.dispatch(backend, "sched")
        third = await control.dispatch(backend, "sched")
        # attempt 2's job runs: its ticket may claim it
        await control.report(run, 2, "job", job="2")
        await control.report(run, 2, "running", job="2")
    assert (first.run.id, second.run.id, second.run.attempt) == (run, other, 1)
    assert (third.run.id, third.run.attempt) == (run, 2)
    holders = {
        Holder.OWNER: owner,
        Holder.OTHER_USER: await user("bob", Scope.RUNS),
        Holder.ADMIN: await user("root", Scope.ADMIN),
        Holder.BACKEND: pool,
        Holder.WORKER: Endpoint(url, token=third.token),
        Holder.OTHER_WORKER: Endpoint(url, token=second.token),
        Holder.STALE_WORKER: Endpoint(url, token=first.token),
        Holder.TICKET: Endpoint(
            url, token=await tokens.mint_worker("alice", run, 2, 3600, kind="ticket")
        ),
    }
    claim = ""
    if claimed:
        async with open_control(holders[Holder.WORKER]) as control:
            claim = (await control.claim("w", run=run, attempt=2)).run.attempts[-1].claim
    made = ""
    if sweep:
        async with open_control(owner) as control:
            made = (await control.submit_sweep(sweep_spec(backend + "s"), manifest)).sweep.id
    return Scene(url, run, digest, spare.id, holders, owner, backend, made, claim)


# --- performing one act -----------------------------------------------------------------------------


def _natural_link(role: Role, tunnel: str) -> wire.AnyLink | None:
    """The link a connection of ``role`` opens (to ``tunnel``: the tunnel's end)."""
    match role:
        case Role.IDE:
            return wire.IdeLink()
        case Role.WORKER:
            return wire.WorkerTunnelLink(tunnel=tunnel) if tunnel else wire.WorkerLink()
        case Role.TUNNEL:
            return wire.TunnelLink(tunnel=tunnel)
    return None


async def _hello(
    ep: Endpoint, role: Role, run: str, attempt: int = 0, tunnel: str = ""
) -> tuple[object, str]:
    """Open a raw link; ``(the open connection, "ok")`` or ``(None, the refusal's code)``."""
    ws_cm = connect(ep.url, compression=None)
    ws = await ws_cm.__aenter__()
    hello = wire.Hello(
        role=role, run=run, token=ep.token, attempt=attempt, link=_natural_link(role, tunnel)
    )
    await ws.send(wire.encode_frame(hello))
    reply = wire.decode_frame(await ws.recv())
    if isinstance(reply, wire.Error):
        await ws_cm.__aexit__(None, None, None)
        return None, reply.code.value
    return (ws_cm, ws), "ok"


async def _link_then(holder: Holder, s: Scene, *frames: bytes, tunnel: str = "") -> str:
    """Open the holder's natural link to the run (to its ``tunnel``: the tunnel's), send
    ``frames``, and say what came back."""
    ep = s.holders[holder]
    worker = holder in (Holder.WORKER, Holder.OTHER_WORKER, Holder.STALE_WORKER)
    role = Role.WORKER if worker else Role.TUNNEL if tunnel else Role.IDE
    opened, code = await _hello(ep, role, s.run, tunnel=tunnel)
    if opened is None:
        return code
    ws_cm, ws = opened  # type: ignore[misc]
    # a publish is answered by the link's storer, in publish order, and other frames as they
    # arrive: wait for the publish's own answer (an ack, or an error naming it, or a fatal one)
    published = any(msgpack.unpackb(frame).get("t") == "publish" for frame in frames)
    try:
        for frame in frames:
            await ws.send(frame)
        await ws.send(b"\xc1")  # never msgpack: its error proves the link still serves
        while True:
            reply = msgpack.unpackb(await ws.recv(), raw=False)
            if reply.get("t") == "ack":
                return "ok"
            if reply.get("t") == "error":
                if published and reply.get("n") is None and not reply.get("fatal"):
                    continue  # the probe's: the publish's own answer is still to come
                return "ok" if reply["code"] == "bad_frame" else str(reply["code"])
    except ConnectionClosed:
        return "closed"
    finally:
        await ws_cm.__aexit__(None, None, None)


def _publish(entry: wire.AnyEntry) -> bytes:
    return wire.encode_frame(wire.Publish(n=1, entry=wire.encode_entry(entry)))


async def _control(holder: Holder, s: Scene, call: Callable[..., Awaitable[str]]) -> str:
    try:
        with trio.fail_after(15):
            async with open_control(s.holders[holder]) as control:
                return await call(control)
    except RelayError as exc:
        return str(exc.code)


async def perform(act: Act, holder: Holder, s: Scene) -> str:
    ep = s.holders[holder]
    match act:
        case Act.OPEN_IDE | Act.OPEN_WORKER | Act.OPEN_LOGS:
            role = {Act.OPEN_IDE: Role.IDE, Act.OPEN_WORKER: Role.WORKER}.get(act, Role.LOGS)
            opened, code = await _hello(ep, role, s.run)
            if opened is not None:
                await opened[0].__aexit__(None, None, None)  # type: ignore[index]
            return code
        case Act.OPEN_CONTROL:
            return await _control(holder, s, _ok)
        case Act.PUBLISH_DAP:
            body = b'{"seq": 1, "type": "event", "event": "output", "body": {}}'
            return await _link_then(holder, s, _publish(wire.DapEntry(origin="t", body=body)))
        case Act.PUBLISH_PRESENCE:
            entry = wire.PresenceEntry(origin="t", epoch=1, attached=True)
            return await _link_then(holder, s, _publish(entry))
        case Act.PUBLISH_STATUS:
            entry = wire.StatusEntry(event="debugger_live")
            return await _link_then(holder, s, _publish(entry))
        case Act.PUBLISH_LOG:
            return await _link_then(
                holder, s, _publish(wire.LogEntry(stream="stdout", data=b"hi\n", attempt=2))
            )
        case Act.PUBLISH_METRIC:
            entry = wire.MetricEntry(points=[(0, 1.0, {"loss": 0.5})], attempt=2)
            return await _link_then(holder, s, _publish(entry))
        case Act.PUBLISH_CONTROL:
            return await _link_then(holder, s, _publish(wire.ControlEntry(action="terminate")))
        case Act.PUBLISH_GROUP:
            entry = wire.GroupEntry(op="stop", node=1, attempt=2, rank=3)
            return await _link_then(holder, s, _publish(entry))
        case Act.HEARTBEAT:
            frames = (wire.encode_frame(wire.Heartbeat()),)
            return await _link_then(holder, s, *frames)
        case Act.OPEN_TUNNEL:
            # asked on a control connection, and the tunnel's link (to one the owner opened)
            tunnel = await _tunnel(s)
            asked = await _control(holder, s, lambda c: _open_tunnel(c, s))
            opened, code = await _hello(ep, Role.TUNNEL, s.run, tunnel=tunnel)
            if opened is not None:
                await opened[0].__aexit__(None, None, None)  # type: ignore[index]
            return asked if asked == code else f"{asked} (open_tunnel), {code} (its link)"
        case Act.PUBLISH_TUNNEL:
            entry = wire.TunnelEntry(op="data", data=b"x")
            return await _link_then(holder, s, _publish(entry), tunnel=await _tunnel(s))
    return await _control(holder, s, lambda control: _control_act(act, control, s))


async def _tunnel(s: Scene) -> str:
    """The run started (its worker says so), and a tunnel the owner opened into it."""
    async with open_run_link(
        s.holders[Holder.WORKER], link=WorkerLink(), run=s.run, attempt=2
    ) as worker:
        await worker.publish(wire.StatusEntry(event="started", data={"pid": 1}))
        await worker.flush()
    async with open_control(s.owner) as control:
        return (await control.open_tunnel(s.run, TunnelSpec(kind="exec", argv=["true"]))).tunnel


async def _open_tunnel(control: object, s: Scene) -> str:
    from relay.client import ControlClient

    assert isinstance(control, ControlClient)
    await control.open_tunnel(s.run, TunnelSpec(kind="shell"))
    return "ok"


async def _empty_set(s: Scene) -> str:
    """The digest of an empty file set, uploaded by the run's owner (a checkpoint of nothing)."""
    data = FileSet().encode()
    async with open_control(s.owner) as owner:
        await owner.put_blob(hashlib.sha256(data).hexdigest(), data)
    return hashlib.sha256(data).hexdigest()


async def _ok(_control: object) -> str:
    return "ok"


async def _control_act(act: Act, c: object, s: Scene) -> str:
    from relay.client import ControlClient

    assert isinstance(c, ControlClient)
    spec = RunSpec(command=["python", "x.py"], workdir="/w", backend=s.backend + "n")
    match act:
        case Act.HAVE_BLOBS:
            return "scoped" if await c.missing_blobs([s.blob]) else "ok"
        case Act.PUT_BLOB:
            data = secrets.token_bytes(16)
            await c.put_blob(hashlib.sha256(data).hexdigest(), data)
        case Act.GET_BLOB:
            await c.read_blob(s.blob)
        case Act.SUBMIT:
            await c.submit(RunSpec(command=["python", "x.py"], workdir="/w"))
        case Act.RERUN:
            await c.rerun(s.run)
        case Act.CANCEL:
            await c.cancel(s.run)
        case Act.PREEMPT:
            await c.preempt(s.run, grace=1.0)
        case Act.RESUME:
            try:
                await c.resume(s.run)
            except RelayError as exc:
                if exc.code == "wrong_state":  # let in: the run is not suspended
                    return "ok"
                raise
        case Act.GET_RUN:
            await c.get_run(s.run)
        case Act.LIST_RUNS:
            return "ok" if s.run in {r.id for r in await c.list_runs()} else "scoped"
        case Act.GET_AUDIT:
            await c.audit(s.run)
        case Act.CLAIM_NEXT | Act.DISPATCH:
            async with open_control(s.owner) as owner:
                await owner.submit(spec)
            if act is Act.CLAIM_NEXT:
                await c.claim("w-next", backend=spec.backend)
            else:
                await c.dispatch(spec.backend, "sched")
        case Act.CLAIM_RUN:
            await c.claim("w", run=s.run, attempt=2)
        case Act.CONFIRM:
            await c.confirm(s.run, 2, s.claim)
        case Act.REPORT:
            await c.report(s.run, 2, "job", job="9", detail="submitted")
        case Act.CREATE_TOKEN:
            await c.create_token(label="mine")
        case Act.CREATE_ANY_TOKEN:
            await c.create_token(user="carol")
        case Act.LIST_TOKENS:
            return "ok" if s.spare_token in {t.id for t in await c.list_tokens()} else "scoped"
        case Act.WEB_LOGIN:
            await c.web_login()
        case Act.SUBMIT_SWEEP:
            await c.submit_sweep(sweep_spec(s.backend + "s"))
        case Act.GET_SWEEP:
            await c.get_sweep(s.sweep)
        case Act.CANCEL_SWEEP:
            await c.cancel_sweep(s.sweep)
        case Act.CLAIM_PAUSE:
            await c.claim_pause(s.run, 2, 3, {"loss": 1.0})
        case Act.LIST_SWEEPS:
            return "ok" if s.sweep in {x.id for x in await c.list_sweeps()} else "scoped"
        case Act.REVOKE_TOKEN:
            try:
                await c.revoke_token(s.spare_token)
            except RelayError as exc:
                if exc.code == "no_such_token":
                    return "scoped"
                raise
        case Act.PUT_CHECKPOINT | Act.PUT_OUTPUTS:
            digest = await _empty_set(s)
            if act is Act.PUT_CHECKPOINT:
                await c.put_checkpoint(s.run, 2, 1, digest)
            else:
                await c.put_outputs(s.run, 2, digest)
        case Act.GET_CHECKPOINTS:
            await c.checkpoints(s.run)
        case Act.GET_OUTPUTS:
            await c.outputs(s.run)
        case Act.GET_RUN_BLOB:
            digest = await _empty_set(s)
            async with open_control(s.holders[Holder.WORKER]) as worker:
                await worker.put_outputs(s.run, 2, digest)
            await c.read_blob(digest, run=s.run)
        case _:
            raise AssertionError(f"no way to perform {act}")
    return "ok"


# --- the walk ---------------------------------------------------------------------------------------


#: the acts that name the scene's run: a refusal of one is in its audit trail
RUN_ACTS = frozenset(
    {
        Act.OPEN_IDE,
        Act.OPEN_WORKER,
        Act.OPEN_LOGS,
        Act.OPEN_TUNNEL,
        Act.RERUN,
        Act.CANCEL,
        Act.PREEMPT,
        Act.RESUME,
        Act.GET_RUN,
        Act.GET_AUDIT,
        Act.CLAIM_RUN,
        Act.REPORT,
        Act.CLAIM_PAUSE,
        Act.GET_RUN_BLOB,
        Act.PUT_CHECKPOINT,
        Act.GET_CHECKPOINTS,
        Act.PUT_OUTPUTS,
        Act.GET_OUTPUTS,
        *LINK_ACTS,
    }
)


async def unaudited(act: Act, holder: Holder, s: Scene, got: str) -> str:
    """Why the refusal ``got`` of ``act`` is not in the run's audit trail as it should be
    (``""``: it is, or it is no refusal of the run): the holder's token id, and the code."""
    if got in ("ok", "scoped") or act not in RUN_ACTS:
        return ""
    token_id = s.holders[holder].token.split("_")[1]
    async with open_control(s.owner) as control:
        trail = await control.audit(s.run)
    refused = [e for e in trail if e.event == "refused" and e.token == token_id]
    codes = got.split(", ")  # an open_tunnel asked, and its link: both refused
    if any(not any(f": {c.split(' ')[0]}: " in e.detail for e in refused) for c in codes):
        return f"{act.value} by {holder.value}: {got}, not in the audit trail {refused}"
    return ""


async def test_every_cell_of_the_permission_table_holds_on_a_live_relay(
    relay: tuple[str, Store],
) -> None:
    """And every refusal of an act on the run is in the run's audit trail."""
    url, store = relay
    wrong = []
    for act in Act:
        for holder in Holder:
            s = await scene(url, store, claimed=act is not Act.CLAIM_RUN, sweep=act in SWEEP_ACTS)
            got = await perform(act, holder, s)
            if got != expected(act, holder):
                wrong.append(f"{act.value} by {holder.value}: {got}, not {expected(act, holder)}")
            elif why := await unaudited(act, holder, s, got):
                wrong.append(why)
    assert not wrong, "\n".join(wrong)


def test_security_md_shows_the_table_as_it_is() -> None:
    text = (REPO / "SECURITY.md").read_text()
    assert permissions_markdown() in text, (
        "SECURITY.md's table of who may do what is out of date: paste "
        "`python -c 'from protocol_specs.access.permissions import permissions_markdown as m; print(m())'`"
    )
