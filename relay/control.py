"""Control connections: the CLI, worker pools and scheduler backends, one request at a time.

Every request is authorised by :func:`protocol_specs.permissions.authorize` (one table) before
anything is read or written; a user asking about another user's run hears it does not exist.
``claim`` and ``dispatch`` may wait for hours: they are cancelled the moment their connection
closes, and a run claimed for a connection that closed before the answer reached it is released
(queued again for the same attempt), so a dead worker never holds a run. A claim whose answer was
lost anyway (this relay died before sending it, or the link with the answer in a buffer) counts
only once its worker confirms it (``confirm``); any relay releases it otherwise
(``relay/runs/claiming.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import msgpack
import trio
from websockets.exceptions import ConnectionClosed

from protocol_specs import wire
from protocol_specs.auth import Principal, Scope, check_token
from protocol_specs.permissions import Act, authorize
from protocol_specs.runs import RunRecord
from protocol_specs.snapshots import Manifest
from protocol_specs.submits import run_id_for
from protocol_specs.trees import TreeError
from protocol_specs.tunnels import TunnelSpec
from protocol_specs.web import CODE_TTL
from protocol_specs.wire import AuditEvent, ErrorCode, WireError

from .auth import TokenStore
from .config import SERVER_NAME, RelayConfig
from .gate import Peer
from .runs import claiming
from .runs.audit import AuditTrail
from .runs.claims import Claims
from .runs.queue_wait import explain
from .runs.registry import Registry
from .runs.run_names import Ambiguous, named_run
from .runs.tunnels import Tunnels
from .snapshots.blobs import BlobError, BlobStore, Upload
from .snapshots.trees import CheckedTrees, Rooted, check_tree
from .store import keys
from .sweeps import Sweeps
from .web.sessions import WebSessions, may_log_in

__all__ = ["Control"]

log = logging.getLogger("tether.relay")

_T = TypeVar("_T")

#: digests looked up in one call
_BATCH = 5000


@dataclass(eq=False)
class _Conn:
    peer: Peer
    who: Principal
    token: str = field(default="", repr=False)
    #: what the peer said it is (its ``hello``), for the audit trail
    client: str = ""
    #: when the token was last looked at (a revoked or expired token ends the connection)
    checked: float = field(default_factory=trio.current_time)
    uploads: dict[str, Upload] = field(default_factory=dict)
    #: worker tokens: the digests of their run's snapshot
    digests: frozenset[str] | None = None
    #: what to do if the reply being sent never reaches the peer (a claim to release)
    undo: Callable[[], Awaitable[object]] | None = None


class Control:
    def __init__(
        self,
        registry: Registry,
        claims: Claims,
        blobs: BlobStore,
        tokens: TokenStore,
        audit: AuditTrail,
        config: RelayConfig,
        *,
        tunnels: Tunnels,
        sweeps: Sweeps,
    ) -> None:
        self.tunnels = tunnels
        self.sweeps = sweeps
        self.registry = registry
        self.store = registry.store
        self.claims = claims
        self.blobs = blobs
        self.tokens = tokens
        self.audit = audit
        self.config = config
        #: the subtrees each user had checked lately: a second submit reads what changed
        self.checked = CheckedTrees(config.blob_grace / 2, registry.clock)
        self.sessions = WebSessions(registry.store, tokens, clock=registry.clock)

    async def serve(self, peer: Peer, hello: wire.Hello, who: Principal) -> None:
        conn = _Conn(peer, who, hello.token or "", client=hello.client)
        await peer.ws.send(wire.encode_frame(wire.Welcome(server=SERVER_NAME, user=who.user)))
        try:
            while True:
                data = await peer.ws.recv()
                if not await self._still_good(conn):
                    return
                try:
                    frame = wire.decode_frame(data)
                except WireError as exc:
                    await peer.error(exc.code, exc.message, rid=_rid_of(data))
                    continue
                conn.undo = None
                reply = await self.answer(frame, conn)
                if isinstance(reply, wire.Error):
                    log.info("error to %s: %s: %s", peer.source, reply.code.value, reply.message)
                try:
                    await peer.ws.send(_encoded(reply))
                except ConnectionClosed:
                    if conn.undo is not None:
                        with trio.CancelScope(shield=True), trio.move_on_after(10):
                            await conn.undo()
                    raise
        finally:
            for upload in conn.uploads.values():
                with trio.CancelScope(shield=True):
                    await upload.abort()

    async def answer(self, frame: wire.AnyFrame, conn: _Conn) -> wire.AnyFrame:
        """The reply to one control frame. A refusal that names a run that exists is in that
        run's audit trail (the reply is the same as for one that does not)."""
        rid = getattr(frame, "rid", None)
        assert rid is None or isinstance(rid, int)
        try:
            return await self._answer(frame, conn, rid)
        except _Refused as refused:
            run = refused.run
            if run is None and isinstance(frame, wire.Report):  # refused before its run was read
                run = await self.registry.load(frame.run)
            if run is not None:
                request, what = _request(frame)
                await self.audit.refused(
                    run,
                    conn.who,
                    request=request,
                    code=refused.code.value,
                    message=refused.message,
                    source=conn.peer.source,
                    role="control",
                    client=conn.client,
                    what=what,
                )
            return wire.Error(code=refused.code, message=refused.message, rid=rid)

    async def _answer(self, frame: wire.AnyFrame, conn: _Conn, rid: int | None) -> wire.AnyFrame:
        who = conn.who
        match frame:
            case wire.HaveBlobs():
                self._allow(who, Act.HAVE_BLOBS)
                return wire.Missing(rid=frame.rid, digests=await self._missing(who, frame.digests))
            case wire.PutBlob():
                self._allow(who, Act.PUT_BLOB)
                return await self._put_blob(frame, conn)
            case wire.GetBlob():
                return await self._get_blob(frame, conn)
            case wire.Submit():
                self._allow(who, Act.SUBMIT)
                snapshot = await self._snapshot(who, frame)
                missing = [] if frame.tree else await self._missing(who, frame.manifest.digests)
                if missing:
                    return wire.Error(
                        code=ErrorCode.MISSING_BLOBS,
                        message=f"the relay lacks {len(missing)} of the snapshot's blobs "
                        f"(first: {missing[0][:12]}); upload them before submitting",
                        rid=rid,
                    )
                run_id = run_id_for(who.user, frame.key) if frame.key else ""
                got = await self.registry.submit(
                    frame.spec, snapshot, owner=who.user, run_id=run_id
                )
                if isinstance(got, RunRecord):
                    await self._audit(got.id, AuditEvent.SUBMIT, conn)
                return _run_info(got, rid)
            case wire.SubmitSweep():
                self._allow(who, Act.SUBMIT_SWEEP)
                snapshot = await self._snapshot(who, frame)
                missing = [] if frame.tree else await self._missing(who, frame.manifest.digests)
                if missing:
                    return wire.Error(
                        code=ErrorCode.MISSING_BLOBS,
                        message=f"the relay lacks {len(missing)} of the snapshot's blobs",
                        rid=rid,
                    )
                sweep = await self.sweeps.create(frame.spec, snapshot, who.user)
                if isinstance(sweep, wire.Error):
                    return sweep.model_copy(update={"rid": rid})
                return await self.sweeps.answer(wire.GetSweep(rid=frame.rid, sweep=sweep.id), who)
            case wire.GetSweep() | wire.CancelSweep() | wire.ListSweeps():
                return await self.sweeps.answer(frame, who)
            case wire.ClaimPause():
                record = await self.registry.load(frame.run)
                self._allow(
                    who, Act.CLAIM_PAUSE, record, about_run=frame.run, attempt=frame.attempt
                )
                assert record is not None
                return await self.sweeps.claim_pause(record, frame)
            case wire.Rerun():
                record = await self._run(who, Act.RERUN, frame.run)
                got = await self.rerun(record, who, source=conn.peer.source, role="control")
                return _run_info(got, rid)
            case wire.Cancel():
                record = await self._run(who, Act.CANCEL, frame.run)
                cancelled = await self.cancel_run(
                    record, who, source=conn.peer.source, role="control", detail=frame.detail
                )
                return _run_info(cancelled, rid)
            case wire.GetRun():
                record = await self._run(who, Act.GET_RUN, frame.run)
                [shown] = await self._explained([await self.registry.with_liveness(record)], who)
                return _run_info(shown, rid)
            case wire.OpenTunnel():
                record = await self._run(who, Act.OPEN_TUNNEL, frame.run)
                noting = partial(self._audit_tunnel, record.id, conn, frame.spec)
                return await self.tunnels.open(
                    record, frame.spec, frame.rid, user=who.user, key=frame.key, noting=noting
                )
            case wire.GetAudit():
                record = await self._run(who, Act.GET_AUDIT, frame.run)
                entries = await self.audit.read(record.id)
                return wire.AuditLog(rid=frame.rid, run=record.id, entries=entries)
            case wire.ListRuns():
                self._allow(who, Act.LIST_RUNS)
                runs = await self.registry.list_runs(frame.limit, "" if who.admin else who.user)
                runs = await self._explained(runs, who)
                return wire.RunList(rid=frame.rid, runs=[r.redacted() for r in runs])
            case wire.Report():
                self._allow(who, Act.REPORT)
                return _run_info(await self.registry.report(frame), rid)
            case wire.Claim() if frame.run:
                target = await self.registry.load(frame.run)
                self._allow(who, Act.CLAIM_RUN, target, about_run=frame.run, attempt=frame.attempt)
                if who.kind == "ticket" and target is not None and not target.job_running:
                    raise _Refused(
                        ErrorCode.JOB_NOT_RUNNING,
                        f"run {frame.run}'s scheduler backend has not yet seen this attempt's job "
                        "running: a ticket claims only then (ask again)",
                        run=target,
                    )
                taken = await claiming.claim_run(
                    self.registry, frame.worker, frame.run, frame.attempt, mint=who.kind != "worker"
                )
                if isinstance(taken, wire.Error):
                    return taken.model_copy(update={"rid": rid})
                claimed = taken.record
                conn.undo = lambda: self.registry.release(claimed, "its worker is gone")
                return await self._assigned(frame.rid, conn, claimed, taken.token)
            case wire.Claim():
                self._allow(who, Act.CLAIM_NEXT)
                backend, worker = frame.backend, frame.worker
                log.info("%s (%s) waits for a run of %s", worker, conn.peer.source, backend)
                next_run = await _while_open(
                    conn.peer, lambda: self.claims.claim(backend, worker, lambda: conn.peer.open)
                )
                if next_run is None:
                    raise ConnectionClosed(None, None)
                conn.undo = lambda: self.registry.release(next_run.record, "its worker is gone")
                return await self._assigned(frame.rid, conn, next_run.record, next_run.token)
            case wire.Confirm():
                target = await self.registry.load(frame.run)
                self._allow(who, Act.CONFIRM, target, about_run=frame.run, attempt=frame.attempt)
                got = await claiming.confirm(self.registry, frame.run, frame.attempt, frame.claim)
                return _run_info(got, rid)
            case wire.Dispatch():
                self._allow(who, Act.DISPATCH)
                backend = frame.backend
                handed = await _while_open(
                    conn.peer, lambda: self.claims.dispatch(backend, lambda: conn.peer.open)
                )
                if handed is None:
                    raise ConnectionClosed(None, None)
                conn.undo = lambda: self.registry.enqueue(handed)
                token = await self.tokens.mint_worker(
                    handed.owner,
                    handed.id,
                    handed.attempt,
                    self.config.retention + self.config.lease,
                    kind="ticket" if frame.ticket else "worker",
                )
                return await self._assigned(frame.rid, conn, handed, token, manifest=False)
            case wire.CreateToken():
                user = frame.user or who.user
                others = user != who.user or bool(set(frame.scopes) - {Scope.RUNS})
                self._allow(who, Act.CREATE_ANY_TOKEN if others else Act.CREATE_TOKEN)
                token, made = await self.tokens.create(
                    user,
                    scopes=sorted(set(frame.scopes)),
                    label=frame.label,
                    expires_in=frame.expires_in,
                    created_by=who.user,
                )
                log.info("token %s for %s created by %s", made.id, user, who)
                return wire.TokenCreated(rid=frame.rid, token=token, info=made.info())
            case wire.WebLogin():
                self._allow(who, Act.WEB_LOGIN)
                held = await self.tokens.get(who.token)
                why = "no such token" if held is None else may_log_in(held)
                if held is None or why:
                    return wire.Error(code=ErrorCode.FORBIDDEN, message=why, rid=rid)
                code = await self.sessions.new_code(held)
                log.info("web login code for %s (token %s)", who.user, who.token)
                return wire.WebCode(
                    rid=frame.rid, code=code, expires_in=CODE_TTL, base=self.config.public_url
                )
            case wire.ListTokens():
                self._allow(who, Act.LIST_TOKENS)
                records = await self.tokens.list(frame.user if who.admin else who.user)
                return wire.TokenList(rid=frame.rid, tokens=[r.info() for r in records])
            case wire.RevokeToken():
                self._allow(who, Act.REVOKE_TOKEN)
                held = await self.tokens.get(frame.id)
                if held is None or held.kind != "user" or not (who.admin or held.user == who.user):
                    return wire.Error(
                        code=ErrorCode.NO_SUCH_TOKEN,
                        message=f"no token {frame.id!r} (or not yours)",
                        rid=rid,
                    )
                revoked = await self.tokens.revoke(frame.id)
                assert revoked is not None
                log.info("token %s of %s revoked by %s", frame.id, held.user, who)
                return wire.TokenList(rid=frame.rid, tokens=[revoked.info()])
        return wire.Error(
            code=ErrorCode.NOT_ALLOWED,
            message=f"{frame.t!r} frames are not valid on a control connection",
            rid=rid,
        )

    # --- what the web view does too ---------------------------------------------------------------

    async def rerun(
        self, record: RunRecord, who: Principal, *, source: str, role: str
    ) -> RunRecord | wire.Error:
        """Submit ``record``'s run again, on its snapshot, as ``who`` (authorised already)."""
        again: Manifest | Rooted = (
            Rooted.of(record) if record.tree else await self.registry.manifest_of(record.id)
        )
        got = await self.registry.submit(record.spec, again, owner=who.user, rerun_of=record.id)
        if isinstance(got, RunRecord):
            said = {"source": source, "role": role}
            submit, rerun = AuditEvent.SUBMIT, AuditEvent.RERUN
            await self.audit.record(got.id, submit, who, detail=f"rerun of {record.id}", **said)
            await self.audit.record(record.id, rerun, who, detail=f"as {got.id}", **said)
        return got

    async def cancel_run(
        self, record: RunRecord, who: Principal, *, source: str, role: str, detail: str
    ) -> RunRecord:
        """Cancel ``record``'s run as ``who`` (authorised already); the record after."""
        await self.audit.record(
            record.id, AuditEvent.CANCEL, who, source=source, role=role, detail=detail
        )
        return await self.registry.cancel(record.id, detail) or record

    # --- decisions --------------------------------------------------------------------------------

    async def _explained(self, runs: list[RunRecord], who: Principal) -> list[RunRecord]:
        """``runs`` as answered to ``who``: a queued one says what holds its pool's slots."""
        viewer = None if who.admin else who.user
        return await explain(self.registry, runs, free=self.claims.waiting, viewer=viewer)

    async def _still_good(self, conn: _Conn) -> bool:
        """Whether the connection's token is still good, looked at again before a request once
        ``config.recheck`` s passed (the gate also closes idle holders); else it is closed."""
        now = trio.current_time()
        if now - conn.checked < self.config.recheck:
            return True
        conn.checked = now
        got = check_token(conn.token, await self.tokens.lookup(conn.token), self.tokens.clock())
        if isinstance(got, Principal):
            return True
        await conn.peer.refuse(got)
        return False

    @staticmethod
    def _allow(
        who: Principal,
        act: Act,
        run: RunRecord | None = None,
        *,
        about_run: str = "",
        attempt: int | None = None,
    ) -> None:
        refusal = authorize(who, act, run, about_run=about_run, attempt=attempt)
        if refusal is not None:
            raise _Refused(ErrorCode(refusal.code), refusal.message, run=run)

    async def _run(self, who: Principal, act: Act, run_id: str) -> RunRecord:
        """``run_id``'s record if ``who`` may do ``act`` on it (``relay/runs/run_names.py``: an id,
        a prefix or a name); a user cannot tell another's run from none."""
        try:
            record = await named_run(self.registry, who, run_id)
        except Ambiguous as exc:
            raise _Refused(ErrorCode.NO_SUCH_RUN, str(exc)) from None
        self._allow(who, act, record, about_run=run_id or "?")
        if record is None:
            raise _Refused(ErrorCode.NO_SUCH_RUN, f"no run {run_id!r} (or not yours)")
        return record

    async def _snapshot(
        self, who: Principal, frame: wire.Submit | wire.SubmitSweep
    ) -> Manifest | Rooted:
        """The submit's snapshot: the manifest as sent, or the root tree it names, checked
        reading only what changed since ``who`` last submitted it (``relay/snapshots/trees.py``)."""
        if not frame.tree:
            return frame.manifest
        try:
            lacking = partial(self._missing, who)
            checked = await check_tree(self.blobs, frame.tree, lacking, self.checked, who.user)
            return Rooted.checked(frame.tree, checked)
        except BlobError as exc:
            raise _Refused(
                ErrorCode.MISSING_BLOBS, f"the relay lacks {exc}; upload them before submitting"
            ) from None
        except TreeError as exc:
            raise _Refused(ErrorCode.BAD_FRAME, f"the snapshot's tree is refused: {exc}") from None

    async def _missing(self, who: Principal, digests: list[str]) -> list[str]:
        """Which of ``digests`` the relay lacks, as far as ``who`` may know: a user is told of the
        blobs they uploaded themselves (nobody learns whether another user's file is here)."""
        missing = await self.blobs.missing(digests)
        if who.admin:
            return missing
        lacking = set(missing)
        key = keys.user_blobs(who.user)
        for i in range(0, len(digests), _BATCH):
            batch = digests[i : i + _BATCH]
            held = await self.store.sismember(key, batch)
            lacking.update(d for d, ok in zip(batch, held, strict=True) if not ok)
        return [d for d in dict.fromkeys(digests) if d in lacking]

    # --- blobs ------------------------------------------------------------------------------------

    async def _get_blob(self, frame: wire.GetBlob, conn: _Conn) -> wire.AnyFrame:
        who = conn.who
        if who.kind == "worker":
            record = await self.registry.load(who.run)
            self._allow(who, Act.GET_BLOB, record, about_run=who.run)
            if conn.digests is None:
                conn.digests = frozenset((await self.registry.manifest_of(who.run)).digests)
            if frame.digest not in conn.digests:
                raise _Refused(
                    ErrorCode.FORBIDDEN,
                    f"blob {frame.digest[:12]} is not in run {who.run}'s snapshot",
                    run=record,
                )
        else:
            self._allow(who, Act.GET_BLOB)
        try:
            size, chunk = await self.blobs.read(frame.digest, frame.offset, frame.length)
        except BlobError as exc:
            return wire.Error(code=ErrorCode.NO_SUCH_BLOB, message=str(exc), rid=frame.rid)
        return wire.BlobData(rid=frame.rid, size=size, offset=frame.offset, data=chunk)

    async def _put_blob(self, frame: wire.PutBlob, conn: _Conn) -> wire.AnyFrame:
        uploads = conn.uploads
        upload = uploads.get(frame.digest)
        try:
            if frame.offset == 0 and len(frame.data) == frame.size and upload is None:
                await self.blobs.put(frame.digest, frame.data)  # whole in one piece
                await self.store.sadd(keys.user_blobs(conn.who.user), [frame.digest])
                return wire.Stored(rid=frame.rid, received=frame.size, complete=True)
            if frame.offset == 0:
                if upload is not None:
                    await upload.abort()
                upload = uploads[frame.digest] = await self.blobs.begin(frame.digest, frame.size)
            elif upload is None or upload.received != frame.offset or upload.size != frame.size:
                expected = upload.received if upload else 0
                raise BlobError(
                    f"blob {frame.digest[:12]}: expected a piece at offset {expected}, "
                    f"got {frame.offset}; restart the upload from 0"
                )
            await upload.write(frame.data)
            if upload.received < upload.size:
                return wire.Stored(rid=frame.rid, received=upload.received)
            del uploads[frame.digest]
            await upload.commit()
            await self.store.sadd(keys.user_blobs(conn.who.user), [frame.digest])
            return wire.Stored(rid=frame.rid, received=upload.received, complete=True)
        except BlobError as exc:
            dropped = uploads.pop(frame.digest, None)
            if dropped is not None:
                await dropped.abort()
            return wire.Error(code=ErrorCode.BAD_BLOB, message=str(exc), rid=frame.rid)

    # --- answers ----------------------------------------------------------------------------------

    async def _assigned(
        self, rid: int, conn: _Conn, record: RunRecord, token: str, *, manifest: bool = True
    ) -> wire.AnyFrame:
        """A claimed or dispatched attempt, with its manifest (a dispatch to a scheduler: none)
        and the credential minted for it: a worker token (``""`` when the requester is that
        attempt's worker already; a ticket's claim gets one: that is what tickets are for), or a
        dispatch's ticket. A snapshot the relay lost part of since the submit (its blobs deleted
        by hand) fails the attempt's start, saying so."""
        try:
            snapshot = await self.registry.manifest_of(record.id) if manifest else Manifest()
        except (BlobError, TreeError) as exc:
            conn.undo = None
            detail = f"the relay lost part of the run's snapshot: {exc}"
            await self.registry.snapshot_lost(record, detail)
            return wire.Error(code=ErrorCode.NO_SUCH_BLOB, message=detail, rid=rid)
        await self._audit(
            record.id,
            AuditEvent.CLAIM,
            conn,
            detail=f"attempt {record.attempt} to {record.worker or 'a scheduler job'}",
        )
        return wire.Assigned(rid=rid, run=record, manifest=snapshot, token=token)

    async def _audit(
        self, run_id: str, event: AuditEvent, conn: _Conn, *, detail: str = ""
    ) -> None:
        await self.audit.record(
            run_id,
            event,
            conn.who,
            source=conn.peer.source,
            role="control",
            client=conn.client,
            detail=detail,
        )

    async def _audit_tunnel(self, run_id: str, conn: _Conn, spec: TunnelSpec, tunnel: str) -> None:
        await self._audit(run_id, AuditEvent.TUNNEL, conn, detail=f"{tunnel}: {spec.describe()}")


class _Refused(Exception):
    def __init__(self, code: ErrorCode, message: str, *, run: RunRecord | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        #: the run the refused request names, if it exists (its audit trail records it)
        self.run = run


def _request(frame: wire.AnyFrame) -> tuple[str, str]:
    """What a refused control request asked, as its run's audit trail says it: the request
    (``cancel``, ``open_tunnel exec``...), and more about it (a tunnel's command)."""
    if isinstance(frame, wire.OpenTunnel):
        return f"{frame.t.value} {frame.spec.kind}", frame.spec.describe()
    return frame.t.value, ""


def _encoded(reply: wire.AnyFrame) -> bytes:
    """The reply as a frame; one that holds what msgpack cannot carry (a number beyond 64 bits
    in a sweep a relay stored before its space was checked) is answered ``internal`` instead of
    ending the connection."""
    try:
        return wire.encode_frame(reply)
    except (OverflowError, ValueError, TypeError) as exc:
        log.warning("cannot send a %r answer: %s", reply.t, exc)
        message = f"the relay cannot send its {reply.t!r} answer: {exc}"
        rid = getattr(reply, "rid", None)
        return wire.encode_frame(wire.Error(code=ErrorCode.INTERNAL, message=message, rid=rid))


def _run_info(got: RunRecord | wire.Error, rid: int | None) -> wire.AnyFrame:
    if isinstance(got, wire.Error):
        return got.model_copy(update={"rid": rid})
    return wire.RunInfo(rid=rid or 0, run=got.redacted())


async def _while_open(peer: Peer, wait: Callable[[], Awaitable[_T]]) -> _T | None:
    """``wait()``'s result, or ``None`` if the peer's connection closed first (``wait`` is then
    cancelled)."""
    result: _T | None = None

    async def watch(cancel: trio.CancelScope) -> None:
        await peer.ws.wait_closed()
        cancel.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, nursery.cancel_scope)
        result = await wait()
        nursery.cancel_scope.cancel()
    return result


def _rid_of(data: bytes | str) -> int | None:
    try:
        raw = msgpack.unpackb(data, raw=False) if isinstance(data, bytes) else None
        rid = raw.get("rid") if isinstance(raw, dict) else None
        return rid if isinstance(rid, int) else None
    except Exception:
        return None
