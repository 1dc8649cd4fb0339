"""Opening a tunnel exactly once (``protocol_specs/wire/tunnel_open.py``): the relay's verdict on a
request it may have seen before, and the user's side's decision after each failed try, stepped
with a hand clock."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from protocol_specs.runs.runs import RunRecord, RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.wire import wire
from protocol_specs.wire.tunnel_open import (
    Answer,
    Create,
    DidNotRun,
    Known,
    MayHaveRun,
    Refuse,
    Retry,
    TunnelOpening,
    new_key,
    open_verdict,
    tunnel_id,
)
from protocol_specs.wire.tunnels import MAX_TUNNELS, TunnelSpec

SPEC = RunSpec(command=["python", "train.py"], workdir="/w")
NVIDIA = TunnelSpec(kind="exec", argv=["nvidia-smi"])


def record(state: RunState = RunState.RUNNING, attempt: int = 1) -> RunRecord:
    return RunRecord(id="r1", spec=SPEC, state=state, attempt=attempt)


# --- naming -------------------------------------------------------------------------------------


def test_a_request_names_one_tunnel_and_no_other_request_names_it() -> None:
    key = new_key()
    assert len(key) == 32 and new_key() != key
    first = tunnel_id("ann", key, NVIDIA)
    assert tunnel_id("ann", key, TunnelSpec(kind="exec", argv=["nvidia-smi"])) == first
    others = {
        tunnel_id("bob", key, NVIDIA),  # another user with the same key
        tunnel_id("ann", new_key(), NVIDIA),  # another request
        tunnel_id("ann", key, TunnelSpec(kind="exec", argv=["nvidia-smi", "-L"])),
        tunnel_id("ann", key, TunnelSpec(kind="shell")),
    }
    assert first not in others and len(others) == 4
    assert len(first) == 24 and int(first, 16) >= 0


# --- the relay's verdict ------------------------------------------------------------------------


def test_a_tunnel_the_attempt_knows_is_answered_again_whatever_the_run_is_now() -> None:
    for state in (RunState.RUNNING, RunState.SUCCEEDED, RunState.CANCELLED):
        # still open: its steps again (a relay may have died before the last)
        assert open_verdict(record(state), known=Known.OPEN) == Answer(complete=True)
        # its command ended: its output and exit code wait in its streams
        assert open_verdict(record(state), known=Known.CLOSED) == Answer(complete=False)
    # not counted against the limit: it is open already
    assert open_verdict(record(), known=Known.OPEN, open_now=MAX_TUNNELS) == Answer(True)


def test_a_tunnel_only_an_earlier_attempt_knew_is_refused_saying_it_may_have_run() -> None:
    verdict = open_verdict(record(attempt=3), known=Known.NO, earlier=2)
    assert isinstance(verdict, Refuse) and verdict.code is wire.ErrorCode.NO_SUCH_TUNNEL
    assert "reached attempt 2 of run r1, which ended since" in verdict.message


@pytest.mark.parametrize(
    ("run", "held", "open_now", "code", "said"),
    [
        (RunState.QUEUED, False, 0, wire.ErrorCode.NOT_ALLOWED, "is queued: nothing runs it yet"),
        (
            RunState.SUCCEEDED,
            False,
            0,
            wire.ErrorCode.RUN_FINISHED,
            "no worker keeps its directory",
        ),
        (
            RunState.RUNNING,
            False,
            MAX_TUNNELS,
            wire.ErrorCode.TOO_MANY_CONNECTIONS,
            "16 tunnels open",
        ),
    ],
)
def test_a_new_tunnel_meets_the_usual_checks(
    run: RunState, held: bool, open_now: int, code: wire.ErrorCode, said: str
) -> None:
    verdict = open_verdict(record(run), known=Known.NO, held=held, open_now=open_now)
    assert isinstance(verdict, Refuse) and verdict.code is code and said in verdict.message


def test_a_new_tunnel_goes_to_a_running_run_or_the_pool_that_keeps_an_ended_ones_directory() -> (
    None
):
    assert open_verdict(record(RunState.RUNNING), known=Known.NO) == Create()
    assert open_verdict(record(RunState.PAUSED), known=Known.NO, open_now=15) == Create()
    assert open_verdict(record(RunState.FAILED), known=Known.NO, held=True) == Create()


# --- the user's side ----------------------------------------------------------------------------


def opening(**options: float) -> TunnelOpening:
    return TunnelOpening(key="ab" * 16, jitter=lambda bound: bound, **options)


def test_a_relay_never_reached_ran_nothing_and_says_so_at_once() -> None:
    o = opening()
    step = o.failed(
        wire.ErrorCode.UNREACHABLE, "cannot reach the relay at ws://r", 0.0, answered=False
    )
    assert step == DidNotRun("cannot reach the relay at ws://r")
    # refused at the handshake before anything was asked: the same
    step = opening().failed(wire.ErrorCode.UNAUTHORIZED, "bad token", 0.0, answered=False)
    assert step == DidNotRun("bad token")


def test_a_refusal_that_answers_the_request_is_final() -> None:
    o = opening()
    o.asking()
    assert o.failed(
        wire.ErrorCode.NOT_ALLOWED, "run r1 is queued", 1.0, answered=True
    ) == DidNotRun("run r1 is queued")
    # even after retries: the relay looked the request up, and started nothing
    o = opening()
    o.asking()
    assert isinstance(o.failed(wire.ErrorCode.UNREACHABLE, "lost", 1.0, answered=False), Retry)
    o.asking()
    step = o.failed(wire.ErrorCode.TOO_MANY_CONNECTIONS, "16 tunnels open", 2.0, answered=True)
    assert step == DidNotRun("16 tunnels open")
    # but one that reached an attempt that ended since may have run there
    o.asking()
    step = o.failed(wire.ErrorCode.NO_SUCH_TUNNEL, "reached attempt 1", 3.0, answered=True)
    assert step == MayHaveRun("reached attempt 1")


def test_a_lost_answer_is_asked_for_again_with_the_same_key_backing_off() -> None:
    o = opening(give_up_after=10.0)
    delays = []
    for now in (0.0, 0.5, 1.0, 2.0, 4.0, 6.0, 9.9):
        o.asking()
        step = o.failed(wire.ErrorCode.UNREACHABLE, "lost the relay", now, answered=False)
        assert isinstance(step, Retry), now
        delays.append(step.delay)
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert o.key == "ab" * 16 and o.retries == 7
    # the relay turning us away for a while, or losing its store, is no answer either
    o.asking()
    assert isinstance(
        o.failed(wire.ErrorCode.TOO_MANY_CONNECTIONS, "cap", 9.9, answered=False), Retry
    )
    assert isinstance(
        o.failed(wire.ErrorCode.INTERNAL, "lost its store", 9.9, answered=True), Retry
    )
    # a retry that cannot even connect is still a retry: the first request may be running
    assert isinstance(o.failed(wire.ErrorCode.UNREACHABLE, "refused", 9.95, answered=False), Retry)
    step = o.failed(wire.ErrorCode.UNREACHABLE, "refused", 10.0, answered=False)
    assert step == MayHaveRun("no relay for 10 s: refused")


def test_after_asking_a_relay_that_turns_us_away_for_good_leaves_it_unknown() -> None:
    o = opening()
    o.asking()
    assert isinstance(o.failed(wire.ErrorCode.UNREACHABLE, "lost", 0.0, answered=False), Retry)
    step = o.failed(wire.ErrorCode.UNAUTHORIZED, "token revoked", 0.3, answered=False)
    assert step == MayHaveRun("token revoked")
    assert "asked" in repr(o) and "retries=1" in repr(o)


def test_a_key_is_hex_of_16_to_64_digits_or_none() -> None:
    shell = TunnelSpec(kind="shell")
    assert wire.OpenTunnel(rid=1, run="r1", spec=shell).key == ""
    assert wire.OpenTunnel(rid=1, run="r1", spec=shell, key=new_key()).key
    for bad in ("ab" * 7, "AB" * 16, "g" * 32, "ab" * 33, "ab" * 16 + "\n"):
        with pytest.raises(ValidationError):
            wire.OpenTunnel(rid=1, run="r1", spec=shell, key=bad)
