"""Relay wire frames: round trips and precise refusals."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol_specs.runs.runs import RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.session.session import StatusEvent
from protocol_specs.snapshots.snapshots import Manifest, ManifestEntry
from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode, WireError

SPEC = RunSpec(command=["python", "train.py"], workdir="/w")


@pytest.mark.parametrize(
    "frame",
    [
        wire.Hello(role=wire.Role.IDE, link=wire.IdeLink(history=True), run="r1", cursor="5-0"),
        wire.Publish(n=3, entry=b"\x81\xa1k\xa3dap"),
        wire.Ack(n=3, cursor="1-1"),
        wire.Deliver(stream=wire.StreamName.TO_IDE, cursor="1-2", entry=b"x"),
        wire.Submit(
            rid=1,
            spec=SPEC,
            manifest=Manifest(entries=[ManifestEntry(path="a.py", digest="ab" * 32, size=3)]),
        ),
        wire.Cancel(rid=2, run="r1"),
        wire.Claim(rid=3, worker="w-0"),
        wire.Claim(rid=3, worker="w-0", backend="slurm", run="r1", attempt=2),
        wire.Dispatch(rid=4, backend="slurm", dispatcher="d"),
        wire.HaveBlobs(rid=5, digests=["ab" * 32]),
        wire.PutBlob(rid=6, digest="ab" * 32, size=10, offset=4, data=b"abcdef"),
        wire.GetBlob(rid=7, digest="ab" * 32, offset=8),
        wire.Report(rid=8, run="r1", attempt=1, event="lost", job="12", detail="preempted"),
        wire.Rerun(rid=9, run="r1"),
        wire.ListRuns(rid=10, limit=5),
        wire.Error(code=ErrorCode.BAD_FRAME, message="nope", fatal=True),
    ],
)
def test_frames_round_trip(frame: wire.AnyFrame) -> None:
    assert wire.decode_frame(wire.encode_frame(frame)) == frame


@pytest.mark.parametrize(
    "entry",
    [
        wire.DapEntry(origin="a", body=b'{"seq":1}', local=True, bp_ids=[1, 2]),
        wire.StatusEntry(event="exited", state="succeeded", exit_code=0, data={"pid": 3}),
        wire.ControlEntry(action="terminate", detail="user"),
        wire.ControlEntry(action="terminate", detail="user", attempt=2),
        wire.LogEntry(stream="stderr", data=b"Traceback...\n", attempt=2),
        wire.MetricEntry(points=[(3, 1.0, {"loss": 0.1, "lr/group.0": 3e-4})], attempt=2),
    ],
)
def test_entries_round_trip(entry: wire.DapEntry | wire.StatusEntry | wire.ControlEntry) -> None:
    assert wire.decode_entry(wire.encode_entry(entry)) == entry


@pytest.mark.parametrize(
    ("data", "code", "needle"),
    [
        ("text", ErrorCode.BAD_FRAME, "binary"),
        (b"\xc1", ErrorCode.BAD_FRAME, "not msgpack"),
        (msgpack.packb([1, 2]), ErrorCode.BAD_FRAME, "map"),
        (msgpack.packb({"t": "launch_missiles"}), ErrorCode.BAD_FRAME, "invalid"),
        (msgpack.packb({"t": "publish", "n": "x", "entry": b""}), ErrorCode.BAD_FRAME, "n"),
        (
            msgpack.packb({"t": "submit", "rid": 1, "spec": {"command": [], "workdir": "/w"}}),
            ErrorCode.BAD_SPEC,
            "command",
        ),
        (b"\x00" * (wire.MAX_FRAME_BYTES + 1), ErrorCode.TOO_LARGE, "exceeds"),
        (
            msgpack.packb(
                {
                    "t": "submit",
                    "rid": 1,
                    "spec": {"command": ["x"], "workdir": "/w"},
                    "manifest": {"entries": [{"path": "../x", "digest": "ab" * 32}]},
                }
            ),
            ErrorCode.BAD_SPEC,
            "'..' component",
        ),
        (
            msgpack.packb({"t": "have_blobs", "rid": 1, "digests": ["../../etc/passwd"]}),
            ErrorCode.BAD_FRAME,
            "SHA-256",
        ),
    ],
)
def test_bad_frames_get_a_code_and_a_reason(
    data: bytes | str, code: ErrorCode, needle: str
) -> None:
    with pytest.raises(WireError) as info:
        wire.decode_frame(data)
    assert info.value.code is code
    assert needle in info.value.message


def test_oversized_dap_body_is_refused() -> None:
    entry = msgpack.packb({"k": "dap", "body": b"x" * (wire.MAX_DAP_BODY_BYTES + 1)})
    with pytest.raises(WireError) as info:
        wire.decode_entry(entry)
    assert info.value.code is ErrorCode.BAD_ENTRY


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_crash_the_decoders(data: bytes) -> None:
    for decode in (wire.decode_frame, wire.decode_entry):
        try:
            decode(data)
        except WireError:
            pass


def test_wire_names_are_str_enums_and_travel_as_plain_strings() -> None:
    entry = wire.StatusEntry(event="exited", state="succeeded", exit_code=0)
    assert entry.event is StatusEvent.EXITED and entry.state is RunState.SUCCEEDED
    assert entry.k is wire.EntryKind.STATUS
    raw = msgpack.unpackb(wire.encode_entry(entry))
    assert (raw["k"], raw["event"], raw["state"]) == ("status", "exited", "succeeded")
    assert all(type(v) is str for v in (raw["k"], raw["event"], raw["state"]))
    frame = msgpack.unpackb(wire.encode_frame(wire.Report(rid=1, run="r", attempt=1, event="job")))
    assert (frame["t"], frame["event"]) == ("report", "job")
    decoded = wire.decode_frame(wire.encode_frame(wire.Ack(n=1, cursor="1-1")))
    assert decoded.t is wire.FrameType.ACK


def test_unknown_status_and_audit_names_still_decode() -> None:
    """A newer peer's status event, or an audit trail a newer relay wrote, is kept as text."""
    data = msgpack.packb({"k": "status", "event": "teleported", "state": "elsewhere"})
    entry = wire.decode_entry(data)
    assert isinstance(entry, wire.StatusEntry)
    assert (entry.event, entry.state) == ("teleported", "elsewhere")
    assert type(entry.event) is str and type(entry.state) is str
    audit = wire.AuditEntry.model_validate({"at": 1.0, "event": "beamed"})
    assert audit.event == "beamed"
    assert wire.AuditEntry(at=1.0, event="attach").event is wire.AuditEvent.ATTACH


def test_every_name_of_the_split_modules_is_reachable_through_wire() -> None:
    from protocol_specs.wire import base as wire_base
    from protocol_specs.wire import control_frames, link_kind, stream_entries

    for module in (control_frames, link_kind, stream_entries, wire_base):
        public = set(module.__all__) - {"FROZEN", "short_reason", "RUN_ROLES", "link_problem"}
        assert public <= set(wire.__all__), module.__name__
        for name in public:
            assert getattr(wire, name) is getattr(module, name)
