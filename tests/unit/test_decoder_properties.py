"""Every decoder of bytes from an untrusted peer, against structured garbage (hypothesis).

Random bytes rarely get past msgpack or JSON, so these properties start from well-formed input
(every relay frame, every stream entry, a real manifest and run spec) and damage it: a field
replaced by a value of another shape, dropped, an unknown field added, the encoded bytes cut or
flipped. Whatever arrives, a decoder returns a valid value or raises its one documented error
(``WireError``, ``ValidationError``, ``DapFramingError``); a value it accepts survives a round
trip, and a run spec it accepts never shows a secret. The byte-level properties (arbitrary bytes,
chunking) are in ``test_dap_framing.py``, ``test_wire.py`` and ``test_snapshot.py``.
"""

from __future__ import annotations

from typing import Any

import msgpack
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from protocol_specs.access.auth import Scope, TokenInfo
from protocol_specs.checkpoints.checkpoints import Checkpoint
from protocol_specs.checkpoints.files import FileSet, StoredFile
from protocol_specs.dap.framing import DapFramer, DapFramingError, encode_message
from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import REDACTED, RunSpec
from protocol_specs.snapshots.snapshots import Manifest, ManifestEntry
from protocol_specs.sweeps.sweeps import SweepRecord, SweepSpec, Trial, parse_objective, parse_param
from protocol_specs.wire import wire
from protocol_specs.wire.tunnels import TunnelSpec
from protocol_specs.wire.wire import ErrorCode, Role, StreamName, WireError

DIGEST = "ab" * 32
SPEC = RunSpec(
    command=["python", "train.py", "--lr", "3e-4"],
    workdir="/home/me/project",
    env={"MODE": "fast", "WANDB_API_KEY": "k-123"},
    secret_env=["WANDB_API_KEY"],
    tags=["exp"],
)
MANIFEST = Manifest(
    entries=[
        ManifestEntry(path="train.py", digest=DIGEST, size=3),
        ManifestEntry(path="pkg/model.py", digest="cd" * 32, size=9, mode=0o755),
        ManifestEntry(path="latest.py", kind="symlink", target="train.py"),
    ]
)
RECORD = RunRecord(id="r1", spec=SPEC, worker="w-0")
_D = "ab" * 32
_CHECKPOINT = Checkpoint(step=400, attempt=2, at=1.5, files=_D, count=1, size=5, sent=5)
_SET = FileSet(files=[StoredFile(path="ckpt/model.pt", size=5, attempt=2, chunks=[_D])])
INFO = TokenInfo(id="0123456789abcdef", kind="user", user="me", scopes=[Scope.RUNS])

#: one well-formed instance of every frame the relay or a client decodes
_SWEEP = SweepSpec(
    params=[parse_param("lr=1,2")],
    run=RunSpec(command=["python", "t.py", "{lr}"], workdir="/w"),
    objective=parse_objective("loss:min"),
    early_stop="asha",
)
FRAMES: list[wire.AnyFrame] = [
    wire.Hello(
        role=Role.IDE,
        link=wire.IdeLink(history=True),
        run="r1",
        token="tthu_x",
        cursor="5-0",
        attempt=2,
    ),
    wire.Welcome(run=RECORD, tails={"to_ide": "1-0"}, heartbeat=5.0, user="me"),
    wire.Publish(n=3, entry=b"\x81\xa1k\xa3dap"),
    wire.Ack(n=3, cursor="1-1", duplicate=True),
    wire.Received(stream=StreamName.TO_IDE, cursor="1-2"),
    wire.Heartbeat(),
    wire.Deliver(stream=StreamName.TO_WORKER, cursor="1-2", entry=b"x"),
    wire.Deliver(stream=StreamName.TO_IDE, cursor="", entry=b"x", producer="ide-1", n=4),
    wire.Commit(stream=StreamName.TO_IDE, cursor="1-3", producer="ide-1", n=4),
    wire.Submit(rid=1, spec=SPEC, manifest=MANIFEST),
    wire.Rerun(rid=2, run="r1"),
    wire.HaveBlobs(rid=3, digests=[DIGEST]),
    wire.Missing(rid=3, digests=[DIGEST]),
    wire.PutBlob(rid=4, digest=DIGEST, size=10, offset=4, data=b"abcdef"),
    wire.Stored(rid=4, received=10, complete=True),
    wire.GetBlob(rid=5, digest=DIGEST, offset=8, length=100),
    wire.BlobData(rid=5, size=10, offset=8, data=b"ab"),
    wire.ListRuns(rid=6, limit=5),
    wire.RunList(rid=6, runs=[RECORD]),
    wire.Report(rid=7, run="r1", attempt=1, event="lost", job="12", detail="preempted"),
    wire.Cancel(rid=8, run="r1"),
    wire.GetRun(rid=9, run="r1"),
    wire.Claim(rid=10, worker="w-0", backend="slurm", run="r1", attempt=2),
    wire.Confirm(rid=10, run="r1", attempt=2, claim="0123456789abcdef"),
    wire.Dispatch(rid=11, backend="slurm", dispatcher="d"),
    wire.RunInfo(rid=9, run=RECORD),
    wire.Assigned(rid=10, run=RECORD, manifest=MANIFEST, token="tthw_x"),
    wire.CreateToken(rid=12, user="you", scopes=[Scope.RUNS, Scope.ADMIN], expires_in=60),
    wire.TokenCreated(rid=12, token="tthu_x", info=INFO),
    wire.WebLogin(rid=13),
    wire.WebCode(rid=13, code="c" * 43, expires_in=120.0, base="https://tether.example.com"),
    wire.SubmitSweep(rid=17, spec=_SWEEP, tree="ab" * 32),
    wire.GetSweep(rid=17, sweep="s6b08"),
    wire.CancelSweep(rid=17, sweep="s6b08"),
    wire.ListSweeps(rid=17, limit=5),
    wire.SweepInfo(
        rid=17,
        sweep=SweepRecord(id="s6b08", spec=_SWEEP, owner="alice", launched=1, best=0),
        trials=[Trial(n=0, run="s6b08-0", params={"lr": 1}, values=[(1, 0.5)], value=0.5)],
    ),
    wire.SweepList(rid=17, sweeps=[SweepRecord(id="s6b08", spec=_SWEEP)]),
    wire.ClaimPause(rid=18, run="s6b08-3", attempt=1, step=120, values={"loss": 1e30}),
    wire.PauseClaimed(rid=18, pause=False, detail="s6b08-1 paused first"),
    wire.PutCheckpoint(rid=19, run="r1", attempt=2, node=1, step=400, files=_D, sent=1024),
    wire.CheckpointStored(rid=19, checkpoint=_CHECKPOINT, complete=False),
    wire.GetCheckpoints(rid=20, run="r1", step=400, with_files=True),
    wire.Checkpoints(
        rid=20, run="r2", source="r1", checkpoints=[_CHECKPOINT], files=_SET, limit=2**34
    ),
    wire.PutOutputs(rid=21, run="r1", attempt=1, files=_D),
    wire.OutputsStored(rid=21, count=1, size=5),
    wire.GetOutputs(rid=22, run="r1"),
    wire.Outputs(rid=22, run="r1", files=_SET),
    wire.Preempt(rid=23, run="r1", grace=30.0, suspend=True, detail="slurm: time limit in 90 s"),
    wire.Resume(rid=24, run="r1", from_start=True),
    wire.ListTokens(rid=13, user="you"),
    wire.TokenList(rid=13, tokens=[INFO]),
    wire.RevokeToken(rid=14, id="0123456789abcdef"),
    wire.GetAudit(rid=15, run="r1"),
    wire.AuditLog(rid=15, run="r1", entries=[wire.AuditEntry(at=1.0, event="attach")]),
    wire.OpenTunnel(rid=16, run="r1", spec=TunnelSpec(kind="exec", argv=["nvidia-smi"])),
    wire.OpenTunnel(rid=16, run="r1", spec=TunnelSpec(kind="shell"), key="0123abcd" * 4),
    wire.TunnelOpened(rid=16, run="r1", tunnel="ab12"),
    wire.Error(code=ErrorCode.FORBIDDEN, message="no", fatal=True, rid=3),
]
ENTRIES: list[wire.AnyEntry] = [
    wire.DapEntry(origin="a", body=b'{"seq":1}', local=True, bp_ids=[1, 2], transient=True),
    wire.StatusEntry(event="exited", state="succeeded", exit_code=0, data={"pid": 3}),
    wire.ControlEntry(action="terminate", detail="user", attempt=2),
    wire.ControlEntry(action="suspend", detail="debugging", attempt=1),
    wire.LogEntry(stream="stderr", data=b"Traceback...\n", attempt=2),
    wire.MetricEntry(
        points=[(0, 1.5, {"loss": 0.42}), (1, 2.5, {"loss": float("inf"), "acc": 0.9})]
    ),
    wire.TunnelEntry(op="data", fd=1, data=b"GPU 0", transient=True),
    wire.ControlEntry(action="tunnel", detail="ab12", attempt=2, data={"kind": "shell"}),
    wire.PresenceEntry(origin="a", epoch=3, attached=True),
    wire.GroupEntry(
        op="move",
        node=1,
        attempt=2,
        rank=5,
        command="next",
        at=1.5,
        arguments={"granularity": "line"},
    ),
]

# values of every shape msgpack can carry, nested a little
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=True)
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.sampled_from(["", "0", "-1", "r1", "hello", "dap", "../x", "\x00", DIGEST, "1-0"])
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def damaged(
    draw: st.DrawFn,
    base: dict[str, Any],
    *,
    keep: tuple[str, ...] = (),
    pool: st.SearchStrategy[Any] = values,
) -> dict[str, Any]:
    """``base`` with some fields replaced by arbitrary values from ``pool``, dropped, or joined by
    new ones (the fields in ``keep``, such as the frame tag, stay as they are)."""
    out = dict(base)
    for name in sorted(base):
        if name in keep:
            continue
        how = draw(st.sampled_from(["keep", "keep", "replace", "drop"]))
        if how == "replace":
            out[name] = draw(pool)
        elif how == "drop":
            del out[name]
    for name in draw(st.lists(st.text(max_size=8), max_size=2)):
        if name not in keep:
            out[name] = draw(pool)
    return out


def as_dict(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="python")


def pack(raw: object) -> bytes:
    return msgpack.packb(raw, use_bin_type=True)  # type: ignore[no-any-return]


def decodes_or_refuses(data: bytes) -> wire.AnyFrame | None:
    """``decode_frame``: a frame that round-trips, or a WireError with a message; nothing else."""
    try:
        frame = wire.decode_frame(data)
    except WireError as exc:
        refused = exc
    else:
        assert wire.decode_frame(wire.encode_frame(frame)) == frame
        return frame
    assert isinstance(refused.code, ErrorCode) and refused.message
    return None


def entry_or_refused(data: bytes) -> wire.AnyEntry | None:
    """``decode_entry``: an entry that round-trips, or a WireError ``bad_entry``; nothing else."""
    try:
        entry = wire.decode_entry(data)
    except WireError as exc:
        refused = exc
    else:
        assert wire.decode_entry(wire.encode_entry(entry)) == entry
        return entry
    assert refused.code is ErrorCode.BAD_ENTRY and refused.message
    return None


def test_the_samples_cover_every_frame_and_entry() -> None:
    """A frame added to the protocol without a sample here would escape these properties."""
    assert {type(f) for f in FRAMES} == set(wire.AnyFrame.__args__)  # type: ignore[attr-defined]
    assert {type(e) for e in ENTRIES} == set(wire.AnyEntry.__args__)  # type: ignore[attr-defined]
    for frame in FRAMES:
        assert decodes_or_refuses(wire.encode_frame(frame)) == frame
    for entry in ENTRIES:
        assert entry_or_refused(wire.encode_entry(entry)) == entry


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_damaged_frames_decode_or_are_refused(data: st.DataObject) -> None:
    sample = data.draw(st.sampled_from(FRAMES))
    raw = data.draw(damaged(as_dict(sample), keep=("t",)))
    decodes_or_refuses(pack(raw))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(FRAMES), values)
def test_a_frame_with_any_tag_decodes_or_is_refused(sample: wire.AnyFrame, tag: object) -> None:
    raw = {**as_dict(sample), "t": tag}
    try:
        data = pack(raw)
    except (TypeError, ValueError):
        return  # msgpack cannot carry it (a dict key that is not hashable): no peer can send it
    decodes_or_refuses(data)


@settings(max_examples=200, deadline=None)
@given(values)
def test_any_msgpack_value_decodes_or_is_refused(raw: object) -> None:
    decodes_or_refuses(pack(raw))
    entry_or_refused(pack(raw))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(FRAMES), st.data())
def test_cut_or_flipped_frames_decode_or_are_refused(
    sample: wire.AnyFrame, data: st.DataObject
) -> None:
    encoded = bytearray(wire.encode_frame(sample))
    if data.draw(st.booleans()):
        del encoded[data.draw(st.integers(0, len(encoded))) :]
    for _ in range(data.draw(st.integers(0, 4)) if encoded else 0):
        encoded[data.draw(st.integers(0, len(encoded) - 1))] = data.draw(st.integers(0, 255))
    decodes_or_refuses(bytes(encoded))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_damaged_entries_decode_or_are_refused(data: st.DataObject) -> None:
    sample = data.draw(st.sampled_from(ENTRIES))
    raw = data.draw(damaged(as_dict(sample), keep=("k",)))
    entry_or_refused(pack(raw))


# --- manifests: what a worker materialises on the GPU node ----------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_damaged_manifests_are_valid_or_refused(data: st.DataObject) -> None:
    entries = [
        data.draw(damaged(as_dict(e), pool=json_values))
        for e in data.draw(st.lists(st.sampled_from(MANIFEST.entries), max_size=5))
    ]
    raw = orjson.dumps({"entries": entries})
    try:
        manifest = Manifest.model_validate_json(raw)
    except ValidationError:
        return
    assert Manifest.model_validate_json(manifest.model_dump_json()) == manifest
    for entry in manifest.entries:
        assert not entry.path.startswith("/") and ".." not in entry.path.split("/")


@given(json_values)
def test_any_json_is_a_manifest_or_refused(raw: object) -> None:
    try:
        Manifest.model_validate_json(orjson.dumps(raw))
    except ValidationError:
        pass


@given(st.binary(max_size=200))
def test_any_bytes_are_a_manifest_or_refused(raw: bytes) -> None:
    try:
        Manifest.model_validate_json(raw)
    except ValidationError:
        pass


# --- run specs: what a worker runs, and what `tether ls` shows ------------------------------------


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_damaged_run_specs_are_valid_or_refused_and_never_show_a_secret(
    data: st.DataObject,
) -> None:
    raw = data.draw(damaged(SPEC.model_dump(mode="json"), pool=json_values))
    try:
        spec = RunSpec.model_validate(raw)
    except ValidationError:
        return
    assert RunSpec.model_validate_json(spec.model_dump_json()) == spec
    shown = spec.redacted()
    for name in spec.secret_env:
        assert shown.env[name] == REDACTED
    assert shown.model_dump(exclude={"env"}) == spec.model_dump(exclude={"env"})
    assert {k: v for k, v in shown.env.items() if k not in spec.secret_env} == {
        k: v for k, v in spec.env.items() if k not in spec.secret_env
    }


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_any_json_is_a_run_spec_or_refused(raw: object) -> None:
    try:
        RunSpec.model_validate_json(orjson.dumps(raw))
    except ValidationError:
        pass


# --- DAP framing: good messages survive the bad ones between them ---------------------------------

dap_messages = st.fixed_dictionaries(
    {
        "seq": st.integers(1, 10**6),
        "type": st.sampled_from(["request", "response", "event"]),
        "command": st.text(max_size=10),
        "arguments": json_values,
    }
)
bad_bodies = st.one_of(
    json_values.map(orjson.dumps).filter(lambda b: not b.startswith(b"{")),
    st.binary(max_size=30),
    st.just(b'{"seq": 1}'),
    st.just(b'{"type": "nonsense"}'),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), dap_messages, bad_bodies), max_size=8), st.data())
def test_framed_garbage_between_messages_loses_none_of_them(
    items: list[tuple[bool, dict[str, Any], bytes]], data: st.DataObject
) -> None:
    """A body that is not a DAP message (but is framed) costs one error, never a neighbour."""
    stream = b""
    good: list[dict[str, Any]] = []
    for is_good, message, body in items:
        if is_good:
            stream += encode_message(message)
            good.append(message)
        else:
            stream += encode_message(body)
    framer = DapFramer()
    size = data.draw(st.integers(1, 64))
    got: list[dict[str, Any]] = []
    errors: list[DapFramingError] = []
    for i in range(0, len(stream), size):
        framer.receive_data(stream[i : i + size])
        while True:
            try:
                message = framer.next_message()
            except DapFramingError as exc:
                errors.append(exc)
                continue
            if message is None:
                break
            got.append(message)
    framer.receive_data(b"")
    assert framer.at_eof
    assert got == good
    assert len(errors) == len(items) - len(good) and not any(e.fatal for e in errors)
