"""The ``hello`` of a run connection names one legal kind of link (``protocol_specs/wire/link_kind.py``):
every legal kind is built, sent and decoded; every combination that is not a kind is refused
where the frame is decoded, and a hello of another protocol version gets one clear line."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode, LinkKind, Role, WireError

LEGAL: list[tuple[Role, wire.AnyLink | None]] = [
    (Role.IDE, wire.IdeLink()),
    (Role.IDE, wire.IdeLink(history=True)),
    (Role.IDE, wire.IdeLink(early=True)),
    (Role.IDE, wire.IdeLink(history=True, early=True)),
    (Role.WORKER, wire.WorkerLink()),
    (Role.WORKER, wire.WorkerLink(early=True)),
    (Role.WORKER, wire.AfterLink()),
    (Role.WORKER, wire.WorkerTunnelLink(tunnel="ab12")),
    (Role.TUNNEL, wire.TunnelLink(tunnel="ab12")),
    (Role.CONTROL, None),
    (Role.LOGS, None),
]


@pytest.mark.parametrize(("role", "link"), LEGAL)
def test_every_legal_kind_of_link_is_sent_and_decoded_as_it_was(
    role: Role, link: wire.AnyLink | None
) -> None:
    hello = wire.Hello(role=role, run="r1", token="t", link=link)
    decoded = wire.decode_frame(wire.encode_frame(hello))
    assert decoded == hello
    assert isinstance(decoded, wire.Hello) and decoded.link == link


def test_every_kind_is_one_link_of_one_role() -> None:
    kinds = {link.kind: link.role for _role, link in LEGAL if link is not None}
    assert kinds == {
        LinkKind.IDE: Role.IDE,
        LinkKind.WORKER: Role.WORKER,
        LinkKind.AFTER: Role.WORKER,
        LinkKind.TUNNEL: Role.TUNNEL,
        LinkKind.WORKER_TUNNEL: Role.WORKER,
    }


def _raw(role: str, link: dict[str, Any] | None = None, **more: Any) -> bytes:
    hello: dict[str, Any] = {"t": "hello", "v": wire.PROTOCOL_VERSION, "role": role, "run": "r1"}
    if link is not None:
        hello["link"] = link
    return msgpack.packb({**hello, **more})  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("frame", "says"),
    [
        # what version 1's four fields could say and no link is
        (_raw("ide", {"kind": "ide", "tunnel": "t1"}), "link.ide.tunnel"),
        (_raw("tunnel", {"kind": "tunnel"}), "link.tunnel.tunnel: must be given"),
        (_raw("tunnel", {"kind": "tunnel", "tunnel": ""}), "at least 1 characters"),
        (_raw("worker", {"kind": "after", "tunnel": "t1"}), "link.after.tunnel"),
        (_raw("worker", {"kind": "worker_tunnel", "tunnel": "t1", "early": True}), "early"),
        (_raw("worker", {"kind": "worker", "history": True}), "link.worker.history"),
        (_raw("worker", {"kind": "after", "early": True}), "link.after.early"),
        (_raw("tunnel", {"kind": "tunnel", "tunnel": "t1", "history": True}), "history"),
        # a link of another role than the hello's
        (_raw("ide", {"kind": "after"}), "an after link is opened as 'worker', not 'ide'"),
        (_raw("ide", {"kind": "worker"}), "a worker link is opened as 'worker', not 'ide'"),
        (_raw("worker", {"kind": "ide"}), "an ide link is opened as 'ide', not 'worker'"),
        (_raw("tunnel", {"kind": "worker_tunnel", "tunnel": "t1"}), "not 'tunnel'"),
        (_raw("worker", {"kind": "tunnel", "tunnel": "t1"}), "not 'worker'"),
        # a run connection without its link, and a link on another connection
        (_raw("ide"), "an ide connection names its link"),
        (_raw("tunnel"), "a tunnel connection names its link"),
        (_raw("control", {"kind": "ide"}), "a control connection is not a run link"),
        (_raw("logs", {"kind": "worker"}), "a logs connection is not a run link"),
        (_raw("worker", {"kind": "later"}), "link"),
        # version 1's fields are not this version's
        (_raw("worker", {"kind": "worker"}, after=True), "after"),
        (_raw("ide", {"kind": "ide"}, early=True), "early"),
    ],
)
def test_a_hello_that_names_no_legal_link_is_refused_where_it_is_decoded(
    frame: bytes, says: str
) -> None:
    with pytest.raises(WireError) as refused:
        wire.decode_frame(frame)
    assert refused.value.code is ErrorCode.BAD_FRAME
    assert refused.value.message.startswith("invalid 'hello' frame: ")
    assert says in refused.value.message


def test_no_illegal_link_can_be_built_to_be_sent() -> None:
    with pytest.raises(ValueError, match="an after link is opened as 'worker', not 'ide'"):
        wire.Hello(role=Role.IDE, run="r1", link=wire.AfterLink())
    with pytest.raises(ValueError, match="tunnel"):
        wire.TunnelLink(tunnel="")
    with pytest.raises(ValueError, match="early"):
        wire.AfterLink(early=True)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    "fields",
    [
        # an older client's hello (version 1): its link as four fields
        {"v": 1, "role": "worker", "run": "r1", "after": True, "early": False, "tunnel": ""},
        {"v": 1, "role": "ide", "run": "r1", "history": True, "early": True},
        {"v": 1, "role": "ide", "run": "r1"},
        {"v": 99, "role": "ide", "run": "x"},
    ],
)
def test_a_hello_of_another_version_gets_one_clear_line(fields: dict[str, Any]) -> None:
    with pytest.raises(WireError) as refused:
        wire.decode_frame(msgpack.packb({"t": "hello", **fields}))
    assert refused.value.code is ErrorCode.UNSUPPORTED_VERSION
    assert refused.value.message == (
        f"protocol version {fields['v']} is not supported; this relay speaks "
        f"{wire.PROTOCOL_VERSION}"
    )
