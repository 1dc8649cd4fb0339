"""The ``control`` role: request/reply calls to the relay, correlated by ``rid``.

:func:`open_control` gives a :class:`ControlClient`: snapshot blobs (upload, check, read), submit,
rerun, cancel, list and get runs, claim (and confirm) and dispatch queued runs, tokens, audit,
scheduler reports.
A call that loses its connection raises :class:`~relay.client.connect.RelayError` (``unreachable``);
nothing is retried here (a retried ``submit`` would queue a second run).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import trio
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import ClientConnection

from protocol_specs.access.auth import Scope, TokenInfo
from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import RunSpec
from protocol_specs.snapshots.snapshots import BLOB_CHUNK, Manifest
from protocol_specs.sweeps.sweeps import SweepRecord, SweepSpec
from protocol_specs.wire import wire
from protocol_specs.wire.tunnels import TunnelSpec
from protocol_specs.wire.wire import ErrorCode, Role

from .connect import RelayError, Target, open_connection

__all__ = ["PUT_WINDOW", "ControlClient", "open_control"]

#: how many blob uploads :meth:`ControlClient.put_small_blobs` keeps on their way at once
PUT_WINDOW = 64

_R = TypeVar("_R")


def _lost(exc: BaseException) -> RelayError:
    """A lost connection, as a call reports it: like a relay that cannot be reached at all."""
    return RelayError(ErrorCode.UNREACHABLE, f"lost the relay: {exc}")


class ControlClient:
    def __init__(self, ws: ClientConnection, user: str = "") -> None:
        self._ws = ws
        self.user = user  #: who the relay took us to be
        self._rid = 0
        self._lock = trio.Lock()
        self.bytes_sent = 0  #: of the frames this client sent (what a benchmark counts)

    async def _call(self, frame_type: type, expect: type[_R], **fields: object) -> _R:
        """One request and its reply; a lost connection is a :class:`RelayError`
        (``unreachable``), like a relay that cannot be reached at all."""
        try:
            return await self._exchange(frame_type, expect, **fields)
        except (ConnectionClosed, trio.BrokenResourceError, OSError) as exc:
            raise _lost(exc) from exc

    async def _exchange(self, frame_type: type, expect: type[_R], **fields: object) -> _R:
        async with self._lock:
            self._rid += 1
            data = wire.encode_frame(frame_type(rid=self._rid, **fields))
            self.bytes_sent += len(data)
            await self._ws.send(data)
            while True:
                reply = wire.decode_frame(await self._ws.recv())
                if isinstance(reply, wire.Error) and reply.fatal:
                    raise RelayError(reply.code, reply.message)  # the relay closes: why
                if getattr(reply, "rid", None) != self._rid:
                    continue
                if isinstance(reply, wire.Error):
                    raise RelayError(reply.code, reply.message)
                if isinstance(reply, expect):
                    return reply
                raise RelayError(ErrorCode.BAD_FRAME, f"unexpected reply {reply.t!r}")

    async def _run(self, frame_type: type, **fields: object) -> RunRecord:
        return (await self._call(frame_type, wire.RunInfo, **fields)).run

    async def missing_blobs(self, digests: list[str]) -> list[str]:
        """Which of ``digests`` the relay lacks (asked in batches)."""
        out: list[str] = []
        for i in range(0, len(digests), 5000):
            reply = await self._call(wire.HaveBlobs, wire.Missing, digests=digests[i : i + 5000])
            out += reply.digests
        return out

    async def put_blob(
        self,
        digest: str,
        data: bytes | tuple[int, Callable[[int, int], Awaitable[bytes]]],
        on_bytes: Callable[[int], None] = lambda _n: None,
    ) -> None:
        """Upload one blob in :data:`~protocol_specs.snapshots.snapshots.BLOB_CHUNK` pieces: ``data`` is
        its bytes, or ``(size, read(offset, length))``."""
        if isinstance(data, bytes):
            size, read = len(data), _reader(data)
        else:
            size, read = data
        offset = 0
        while True:
            piece = await read(offset, BLOB_CHUNK)
            reply = await self._call(
                wire.PutBlob, wire.Stored, digest=digest, size=size, offset=offset, data=piece
            )
            offset += len(piece)
            on_bytes(len(piece))
            if reply.complete:
                return
            if not piece:
                raise RelayError(ErrorCode.BAD_BLOB, f"blob {digest[:12]}: upload incomplete")

    async def put_small_blobs(
        self,
        blobs: AsyncIterator[tuple[str, bytes]],
        on_blob: Callable[[str, int], None] = lambda _digest, _n: None,
        *,
        window: int = PUT_WINDOW,
    ) -> None:
        """Upload whole blobs of at most :data:`~protocol_specs.snapshots.snapshots.BLOB_CHUNK` bytes each,
        up to ``window`` of them on their way at once (the relay answers a connection's requests
        in order): a tree of twenty thousand small files costs a few round trips, not twenty
        thousand. ``on_blob(digest, size)`` as each is stored; a refusal raises
        :class:`RelayError` (``bad_blob`` with the digest in its message)."""
        try:
            async with self._lock:
                waiting: deque[tuple[int, str, int]] = deque()
                async for digest, data in blobs:
                    self._rid += 1
                    frame = wire.PutBlob(
                        rid=self._rid, digest=digest, size=len(data), offset=0, data=data
                    )
                    encoded = wire.encode_frame(frame)
                    self.bytes_sent += len(encoded)
                    await self._ws.send(encoded)
                    waiting.append((self._rid, digest, len(data)))
                    if len(waiting) >= window:
                        await self._stored(waiting.popleft(), on_blob)
                while waiting:
                    await self._stored(waiting.popleft(), on_blob)
        except (ConnectionClosed, trio.BrokenResourceError, OSError) as exc:
            raise _lost(exc) from exc

    async def _stored(
        self, sent: tuple[int, str, int], on_blob: Callable[[str, int], None]
    ) -> None:
        rid, digest, size = sent
        while True:
            reply = wire.decode_frame(await self._ws.recv())
            if isinstance(reply, wire.Error) and (reply.fatal or reply.rid == rid):
                raise RelayError(reply.code, reply.message)
            if getattr(reply, "rid", None) != rid:
                continue
            if not isinstance(reply, wire.Stored) or not reply.complete:
                raise RelayError(ErrorCode.BAD_FRAME, f"blob {digest[:12]}: not stored whole")
            on_blob(digest, size)
            return

    async def read_blob(self, digest: str, offset: int = 0, *, run: str = "") -> tuple[int, bytes]:
        """``(blob size, up to one chunk of bytes from offset)``; ``run``: a user's run whose
        checkpoints or outputs name the blob."""
        reply = await self._call(wire.GetBlob, wire.BlobData, digest=digest, offset=offset, run=run)
        return reply.size, reply.data

    async def read_small_blobs(
        self,
        digests: list[str],
        on_blob: Callable[[str, int, bytes], Awaitable[None]],
        *,
        run: str = "",
        window: int = PUT_WINDOW,
    ) -> None:
        """Read each of ``digests`` (blobs of at most one
        :data:`~protocol_specs.snapshots.snapshots.BLOB_CHUNK`: one read each), up to ``window``
        requests on their way at once; ``await on_blob(digest, blob size, bytes)`` for each, in
        order (the replies wait while it does). A refusal raises :class:`RelayError`: the blob
        it names is the first not handed to ``on_blob``."""
        try:
            async with self._lock:
                waiting: deque[tuple[int, str]] = deque()
                for digest in digests:
                    await self._ask_blob(waiting, digest, run)
                    if len(waiting) >= window:
                        await self._blob_read(waiting.popleft(), on_blob)
                while waiting:
                    await self._blob_read(waiting.popleft(), on_blob)
        except (ConnectionClosed, trio.BrokenResourceError, OSError) as exc:
            raise _lost(exc) from exc

    async def _ask_blob(self, waiting: deque[tuple[int, str]], digest: str, run: str) -> None:
        self._rid += 1
        encoded = wire.encode_frame(wire.GetBlob(rid=self._rid, digest=digest, run=run))
        self.bytes_sent += len(encoded)
        await self._ws.send(encoded)
        waiting.append((self._rid, digest))

    async def _blob_read(
        self, asked: tuple[int, str], on_blob: Callable[[str, int, bytes], Awaitable[None]]
    ) -> None:
        rid, digest = asked
        while True:
            reply = wire.decode_frame(await self._ws.recv())
            if isinstance(reply, wire.Error) and (reply.fatal or reply.rid == rid):
                raise RelayError(reply.code, reply.message)
            if getattr(reply, "rid", None) != rid:
                continue
            if not isinstance(reply, wire.BlobData):
                raise RelayError(ErrorCode.BAD_FRAME, f"unexpected reply {reply.t!r}")
            await on_blob(digest, reply.size, reply.data)
            return

    async def get_blob(self, digest: str, *, run: str = "") -> bytes:
        parts: list[bytes] = []
        offset = 0
        while True:
            reply = await self._call(
                wire.GetBlob, wire.BlobData, digest=digest, offset=offset, run=run
            )
            parts.append(reply.data)
            offset += len(reply.data)
            if offset >= reply.size or not reply.data:
                return b"".join(parts)

    async def submit(
        self, spec: RunSpec, manifest: Manifest | None = None, *, tree: str = "", key: str = ""
    ) -> RunRecord:
        """Queue a run on the snapshot ``manifest``, or on the one the root ``tree`` names.
        ``key``: this request's name, the same when it is asked again (the same run is
        answered: ``protocol_specs/runs/submits.py``)."""
        return await self._run(
            wire.Submit, spec=spec, manifest=manifest or Manifest(), tree=tree, key=key
        )

    async def rerun(self, run: str) -> RunRecord:
        return await self._run(wire.Rerun, run=run)

    async def cancel(self, run: str, detail: str = "cancelled by the user") -> RunRecord:
        return await self._run(wire.Cancel, run=run, detail=detail)

    async def get_run(self, run: str) -> RunRecord:
        return await self._run(wire.GetRun, run=run)

    async def open_tunnel(self, run: str, spec: TunnelSpec, *, key: str = "") -> wire.TunnelOpened:
        """Open a tunnel into ``run``'s worker (``protocol_specs/wire/tunnels.py``): its id. ``key``:
        the request's name; asked again with it, the same tunnel is answered, never a second
        (``protocol_specs/wire/tunnel_open.py``); "": not to be retried."""
        return await self._call(wire.OpenTunnel, wire.TunnelOpened, run=run, spec=spec, key=key)

    async def list_runs(self, limit: int = 50) -> list[RunRecord]:
        return (await self._call(wire.ListRuns, wire.RunList, limit=limit)).runs

    async def put_checkpoint(
        self, run: str, attempt: int, step: int, files: str, *, node: int = 0, sent: int = 0
    ) -> wire.CheckpointStored:
        """Record a checkpoint whose file set blob ``files`` (and every chunk) is uploaded."""
        return await self._call(
            wire.PutCheckpoint, wire.CheckpointStored, run=run, attempt=attempt, node=node,
            step=step, files=files, sent=sent,
        )  # fmt: skip

    async def checkpoints(
        self, run: str, *, step: int | None = None, with_files: bool = False
    ) -> wire.Checkpoints:
        """The run's complete checkpoints (its seed's while it has none); with ``with_files``,
        the file set of ``step`` (None: the latest)."""
        return await self._call(
            wire.GetCheckpoints, wire.Checkpoints, run=run, step=step, with_files=with_files
        )

    async def put_outputs(
        self, run: str, attempt: int, files: str, *, node: int = 0
    ) -> wire.OutputsStored:
        """Merge the file set blob ``files`` (uploaded, with its chunks) into the run's outputs."""
        return await self._call(
            wire.PutOutputs, wire.OutputsStored, run=run, attempt=attempt, node=node, files=files
        )

    async def outputs(self, run: str) -> wire.Outputs:
        return await self._call(wire.GetOutputs, wire.Outputs, run=run)

    async def preempt(
        self, run: str, *, grace: float | None = None, suspend: bool = False, detail: str = ""
    ) -> RunRecord:
        """Preempt the run's attempt (``suspend``: then hold it ``suspended``)."""
        return await self._run(wire.Preempt, run=run, grace=grace, suspend=suspend, detail=detail)

    async def resume(self, run: str, *, from_start: bool = False) -> RunRecord:
        """Queue a suspended run's next attempt."""
        return await self._run(wire.Resume, run=run, from_start=from_start)

    async def submit_sweep(
        self, spec: SweepSpec, manifest: Manifest | None = None, *, tree: str = ""
    ) -> wire.SweepInfo:
        """Start a sweep (``protocol_specs/sweeps/sweeps.py``) on a snapshot, as :meth:`submit` does."""
        manifest = manifest or Manifest()
        return await self._call(
            wire.SubmitSweep, wire.SweepInfo, spec=spec, manifest=manifest, tree=tree
        )

    async def get_sweep(self, sweep: str) -> wire.SweepInfo:
        return await self._call(wire.GetSweep, wire.SweepInfo, sweep=sweep)

    async def cancel_sweep(self, sweep: str) -> wire.SweepInfo:
        return await self._call(wire.CancelSweep, wire.SweepInfo, sweep=sweep)

    async def claim_pause(
        self, run: str, attempt: int, step: int, values: dict[str, float]
    ) -> wire.PauseClaimed:
        """A worker's: may the program pause where it met ``--debug-when``?"""
        return await self._call(
            wire.ClaimPause, wire.PauseClaimed, run=run, attempt=attempt, step=step, values=values
        )

    async def list_sweeps(self, limit: int = 30) -> list[SweepRecord]:
        return (await self._call(wire.ListSweeps, wire.SweepList, limit=limit)).sweeps

    async def claim(
        self,
        worker: str,
        *,
        backend: str = "local",
        run: str = "",
        attempt: int = 0,
        node: int = 0,
    ) -> wire.Assigned:
        """The next queued run of ``backend`` (blocks), or with ``run``: that run's ``attempt``;
        with the worker token for the attempt (``token``). With ``node`` >= 1 too: join that node
        of the attempt node 0 claimed (token ``""``; ``job_not_running`` until node 0 did)."""
        return await self._call(
            wire.Claim,
            wire.Assigned,
            worker=worker,
            backend=backend,
            run=run,
            attempt=attempt,
            node=node,
        )

    async def confirm(self, run: str, attempt: int, claim: str) -> RunRecord:
        """Say that this worker holds the answer to claim ``claim`` (``protocol_specs/runs/claims.py``):
        the claim counts. Refused (``stale_attempt``) once it went back to the queue; asking again
        after a lost answer is answered the same."""
        return await self._run(wire.Confirm, run=run, attempt=attempt, claim=claim)

    async def dispatch(
        self, backend: str, dispatcher: str, *, ticket: bool = False
    ) -> wire.Assigned:
        """The next run queued for ``backend``, and a worker token for its attempt (``ticket``: a
        ticket instead, good only to claim the attempt, which answers with the worker token)."""
        return await self._call(
            wire.Dispatch, wire.Assigned, backend=backend, dispatcher=dispatcher, ticket=ticket
        )

    async def create_token(
        self,
        *,
        user: str = "",
        scopes: list[Scope] | None = None,
        label: str = "",
        expires_in: float = 0.0,
    ) -> tuple[str, TokenInfo]:
        reply = await self._call(
            wire.CreateToken,
            wire.TokenCreated,
            user=user,
            scopes=scopes or [Scope.RUNS],
            label=label,
            expires_in=expires_in,
        )
        return reply.token, reply.info

    async def web_login(self) -> wire.WebCode:
        """A one-time code that opens a web view session as this connection's user."""
        return await self._call(wire.WebLogin, wire.WebCode)

    async def list_tokens(self, user: str = "") -> list[TokenInfo]:
        return (await self._call(wire.ListTokens, wire.TokenList, user=user)).tokens

    async def revoke_token(self, token_id: str) -> TokenInfo:
        return (await self._call(wire.RevokeToken, wire.TokenList, id=token_id)).tokens[0]

    async def audit(self, run: str) -> list[wire.AuditEntry]:
        return (await self._call(wire.GetAudit, wire.AuditLog, run=run)).entries

    async def report(
        self, run: str, attempt: int, event: str, *, job: str = "", detail: str = ""
    ) -> RunRecord:
        return await self._run(
            wire.Report, run=run, attempt=attempt, event=event, job=job, detail=detail
        )


def _reader(data: bytes) -> Callable[[int, int], Awaitable[bytes]]:
    async def read(offset: int, length: int) -> bytes:
        return data[offset : offset + length]

    return read


@asynccontextmanager
async def open_control(target: Target, *, client: str = "") -> AsyncIterator[ControlClient]:
    async with open_connection(target, wire.Hello(role=Role.CONTROL, client=client)) as (
        ws,
        welcome,
    ):
        yield ControlClient(ws, welcome.user)
