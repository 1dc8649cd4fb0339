"""The control RPC's table (``relay/control/dispatch.py``): every request frame of the wire has
one handler, each route is decided by rows of the permissions table, and a frame the table lacks
gets the refusal it always got."""

from __future__ import annotations

from typing import Any, get_args

from protocol_specs.access.auth import Principal, Scope
from protocol_specs.access.permissions import PERMISSIONS, Act
from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode
from relay.control.context import Conn, Rooms
from relay.control.dispatch import ROUTES, Control, Route, gated

#: the control frames that only ever answer a request (a relay never serves them)
ANSWERS = {
    wire.Missing,
    wire.Stored,
    wire.BlobData,
    wire.RunList,
    wire.RunInfo,
    wire.Assigned,
    wire.TokenCreated,
    wire.TokenList,
    wire.AuditLog,
    wire.TunnelOpened,
    wire.WebCode,
    wire.SweepInfo,
    wire.SweepList,
    wire.PauseClaimed,
    wire.CheckpointStored,
    wire.Checkpoints,
    wire.OutputsStored,
    wire.Outputs,
}


def test_every_request_of_the_control_rpc_has_a_route() -> None:
    frames = set(get_args(wire.AnyControlFrame))
    assert ANSWERS <= frames
    assert set(ROUTES) == frames - ANSWERS


def test_every_route_is_decided_by_rows_of_the_permissions_table() -> None:
    for frame, route in ROUTES.items():
        assert route.acts, frame
        assert all(act in PERMISSIONS for act in route.acts), frame
        assert not route.gate or len(route.acts) == 1, frame


class _Peer:
    source = "test"


def _conn(*scopes: Scope) -> Conn:
    who = Principal(token="t1", kind="user", user="alice", scopes=frozenset(scopes))
    return Conn(_Peer(), who)  # type: ignore[arg-type]


async def test_a_frame_the_table_lacks_is_refused_not_allowed() -> None:
    control = Control(rooms=None, routes={})  # type: ignore[arg-type]
    frame = wire.ListRuns(rid=7)
    reply = await control.answer(frame, _conn(Scope.RUNS))
    assert isinstance(reply, wire.Error)
    assert reply.code is ErrorCode.NOT_ALLOWED
    assert reply.rid == 7
    assert reply.message == f"{frame.t!r} frames are not valid on a control connection"
    welcome = await Control(rooms=None).answer(wire.Welcome(server="s", user="u"), _conn())  # type: ignore[arg-type]
    assert isinstance(welcome, wire.Error)
    assert welcome.code is ErrorCode.NOT_ALLOWED


async def test_a_gated_route_is_authorised_before_its_handler_runs() -> None:
    ran: list[object] = []

    async def handler(rooms: Rooms, conn: Conn, frame: Any) -> wire.AnyFrame:
        ran.append(frame)
        return wire.TokenList(rid=frame.rid, tokens=[])

    control = Control(rooms=None, routes={wire.ListTokens: gated(Act.LIST_TOKENS, handler)})  # type: ignore[arg-type]
    worker = Principal(user="alice", token="w1", kind="worker", run="r1", attempt=1)
    refused = await control.answer(wire.ListTokens(rid=3), Conn(_Peer(), worker))  # type: ignore[arg-type]
    assert isinstance(refused, wire.Error)
    assert refused.code is ErrorCode.FORBIDDEN
    assert ran == []
    allowed = await control.answer(wire.ListTokens(rid=4), _conn(Scope.RUNS))
    assert isinstance(allowed, wire.TokenList)
    assert len(ran) == 1


def test_a_route_names_its_handler_once() -> None:
    assert isinstance(ROUTES[wire.Submit], Route)
    assert ROUTES[wire.Submit].handler.__name__ == "submit"
    assert ROUTES[wire.Claim].acts == (Act.CLAIM_RUN, Act.CLAIM_NEXT)
