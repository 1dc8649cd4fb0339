"""The access-control decisions, the failed-authentication throttle and secret blanking, stepped
without sockets."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapter.config import ConfigError, load_profile, profile_token, save_token
from protocol_specs.access.auth import (
    TOKEN_PATTERN,
    AuthThrottle,
    Principal,
    Refusal,
    Scope,
    TokenRecord,
    check_token,
    describe,
    hash_secret,
    new_token,
    parse_token,
)
from protocol_specs.access.permissions import Act, authorize
from protocol_specs.access.redact import Redactor
from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import REDACTED, RunSpec

SPEC = RunSpec(command=["python", "app.py"], workdir="/w")


def record_of(token: str, **changes: object) -> TokenRecord:
    parsed = parse_token(token)
    assert parsed is not None
    base = {"id": parsed[0], "kind": "user", "user": "alice", "hash": hash_secret(parsed[1])}
    return TokenRecord.model_validate({**base, "scopes": [Scope.RUNS], **changes})


def test_a_new_token_parses_matches_the_leak_pattern_and_checks() -> None:
    token, token_id, digest = new_token("user")
    assert TOKEN_PATTERN.fullmatch(token) and parse_token(token) is not None
    assert describe(token) == f"token {token_id}" and token.split("_", 2)[2] not in describe(token)
    who = check_token(token, record_of(token), now=0)
    assert isinstance(who, Principal) and who.user == "alice" and who.token == token_id
    assert token not in str(who) and token not in repr(who)
    assert digest == hash_secret(token.split("_", 2)[2])


def test_check_token_refusals() -> None:
    token, _, _ = new_token("user")
    other, _, _ = new_token("user")
    record = record_of(token)
    assert isinstance(check_token(None, record, 0), Refusal)
    for bad in ("", "garbage", other, token[:-1] + ("A" if token[-1] != "A" else "B")):
        got = check_token(bad, record, 0)
        assert isinstance(got, Refusal) and got.code == "unauthorized"
    assert isinstance(check_token(token, None, 0), Refusal)
    revoked = check_token(token, record_of(token, revoked_at=5.0), 10)
    assert isinstance(revoked, Refusal) and "revoked" in revoked.message
    expired = check_token(token, record_of(token, expires_at=5.0), 5.0)
    assert isinstance(expired, Refusal) and "expired" in expired.message
    assert isinstance(check_token(token, record_of(token, expires_at=5.0), 4.9), Principal)


def run(owner: str = "alice", attempt: int = 1) -> RunRecord:
    return RunRecord(id="r1", spec=SPEC, owner=owner, attempt=attempt)


ALICE = Principal(token="a", kind="user", user="alice", scopes=frozenset({Scope.RUNS}))
BOB = Principal(token="b", kind="user", user="bob", scopes=frozenset({Scope.RUNS}))
ADMIN = Principal(token="c", kind="user", user="root", scopes=frozenset({Scope.ADMIN}))
POOL = Principal(token="d", kind="user", user="pool", scopes=frozenset({Scope.BACKEND}))
WORKER = Principal(token="e", kind="worker", user="alice", run="r1", attempt=1)


@pytest.mark.parametrize(
    ("who", "role", "record", "attempt", "code"),
    [
        (ALICE, "ide", run(), 0, None),
        (ALICE, "logs", run(), 0, None),
        (ADMIN, "ide", run(), 0, None),
        (BOB, "ide", run(), 0, "no_such_run"),
        (BOB, "logs", run(), 0, "no_such_run"),
        (ALICE, "ide", run(owner=""), 0, "no_such_run"),  # a run of nobody's: admins only
        (POOL, "ide", run(), 0, "forbidden"),
        (WORKER, "ide", run(), 0, "forbidden"),
        (ALICE, "worker", run(), 0, "forbidden"),
        (WORKER, "worker", run(), 0, None),
        (WORKER, "worker", run(), 1, None),
        (WORKER, "worker", run(attempt=2), 0, "stale_attempt"),
        (WORKER, "worker", run(), 2, "stale_attempt"),
        (WORKER, "worker", RunRecord(id="r2", spec=SPEC, owner="alice"), 0, "forbidden"),
        (WORKER, "worker", None, 0, "forbidden"),
        (BOB, "control", None, 0, None),
    ],
)
def test_who_may_open_what(
    who: Principal, role: str, record: RunRecord | None, attempt: int, code: str | None
) -> None:
    act = {"ide": Act.OPEN_IDE, "logs": Act.OPEN_LOGS, "worker": Act.OPEN_WORKER}.get(
        role, Act.OPEN_CONTROL
    )
    about = record.id if record is not None else ""
    got = authorize(who, act, record, about_run=about, attempt=attempt or None)
    assert (got.code if got else None) == code


@pytest.mark.parametrize(
    ("who", "act", "allowed"),
    [
        (ALICE, Act.SUBMIT, True),
        (ALICE, Act.CLAIM_NEXT, False),
        (ALICE, Act.DISPATCH, False),
        (ALICE, Act.GET_BLOB, False),
        (POOL, Act.CLAIM_NEXT, True),
        (POOL, Act.SUBMIT, False),
        (ADMIN, Act.CLAIM_NEXT, True),
        (WORKER, Act.CLAIM_NEXT, False),  # a worker token claims its own attempt, nothing else
        (WORKER, Act.CLAIM_RUN, True),
        (WORKER, Act.GET_BLOB, True),
        (WORKER, Act.SUBMIT, False),
        (WORKER, Act.LIST_RUNS, False),
        (WORKER, Act.CREATE_TOKEN, False),
    ],
)
def test_who_may_send_which_control_frame(who: Principal, act: Act, allowed: bool) -> None:
    assert (authorize(who, act, run(), about_run="r1") is None) is allowed


def test_the_throttle_slows_failures_down_and_forgets_them_after_the_window() -> None:
    throttle = AuthThrottle(free=2, window=60, base=0.1, cap=1.0)
    delays = [throttle.failed("10.0.0.1", now=float(i)) for i in range(6)]
    assert [d for d, _ in delays] == [0.1, 0.1, 0.2, 0.4, 0.8, 1.0]
    assert [throttle.throttled(n) for _, n in delays] == [False, False, True, True, True, True]
    assert throttle.failed("10.0.0.2", now=6.0) == (0.1, 1)  # another address is not affected
    assert throttle.failed("10.0.0.1", now=200.0) == (0.1, 1)  # the window passed


def test_the_throttle_remembers_a_bounded_number_of_sources() -> None:
    throttle = AuthThrottle(max_sources=100)
    for i in range(1000):
        throttle.failed(f"10.0.{i // 256}.{i % 256}", now=0.0)
    assert len(throttle._failures) == 100


def test_secret_env_is_redacted_in_what_users_see() -> None:
    spec = SPEC.model_copy(update={"env": {"KEY": "hunter2", "A": "b"}, "secret_env": ["KEY"]})
    record = RunRecord(id="r", spec=spec).redacted()
    assert record.spec.env == {"KEY": REDACTED, "A": "b"}
    assert spec.secrets() == ["hunter2"]
    with pytest.raises(ValueError, match="not in env"):
        RunSpec(command=["x"], workdir="/w", secret_env=["NOPE"])
    with pytest.raises(ValueError, match="invalid environment variable name"):
        RunSpec(command=["x"], workdir="/w", env={"A=B": "c"})


def test_the_redactor_blanks_secrets_split_across_chunks() -> None:
    r = Redactor(["hunter2", "swordfish"])
    out = r.feed(b"pass=hun") + r.feed(b"ter2 and sword") + r.feed(b"fish!\n") + r.flush()
    assert out == b"pass=<secret> and <secret>!\n"
    assert r.feed(b"plain\n") == b"plain\n"  # nothing held back that cannot be a secret
    assert r.feed(b"hunt") == b"" and r.flush() == b"hunt"  # the stream ended: not a secret


@given(
    st.lists(st.binary(max_size=12), max_size=12),
    st.lists(st.text(alphabet="ab\n", min_size=1, max_size=5), min_size=1, max_size=3),
)
def test_no_chunking_lets_a_secret_through(chunks: list[bytes], secrets: list[str]) -> None:
    r = Redactor(secrets)
    joined = b"".join(chunks)
    out = b"".join(r.feed(c) for c in chunks) + r.flush()
    whole = Redactor(secrets)
    assert out == whole.feed(joined) + whole.flush()
    for secret in secrets:
        assert secret.encode() not in out.replace(REDACTED.encode(), b"|")


def test_save_token_keeps_the_file_and_makes_it_private(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('# mine\n[default]\nrelay = "ws://x:1"\n\n[profiles.gpu]\ngpus = 2\n')
    path.chmod(0o644)
    token, _, _ = new_token("user")
    save_token(token, path=path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().startswith('# mine\n[default]\ntoken = "tthu_')
    assert load_profile(path=path).relay == "ws://x:1" and profile_token(path=path) == token
    assert load_profile("gpu", path=path).gpus == 2
    other, _, _ = new_token("user")
    save_token(other, "gpu", path=path)
    assert profile_token("gpu", path=path) == other and profile_token(path=path) == token
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        load_profile(path=path)


def test_save_token_creates_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "config.toml"
    save_token("tthu_x", path=path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert profile_token(path=path) == "tthu_x"


def test_the_leak_scan_sees_tokens_and_marked_secrets_in_log_lines() -> None:
    from leaks import MARKER, leaked

    token, _, _ = new_token("worker")
    lines = [f"tether.relay INFO hello {token}", f"env X={MARKER}-1", token, "all fine"]
    assert leaked(lines) == lines[:2]  # a line that is only a token is `tether token create`
