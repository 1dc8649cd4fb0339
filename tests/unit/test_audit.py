"""Refusals in a run's audit trail (``protocol_specs/access/audit.py``): what an entry says, whose repeats
are coalesced together, and the window that bounds how many entries a refuser adds; and how
``tether audit`` shows what a refused party wrote."""

from __future__ import annotations

from adapter.show.render import audit_lines
from protocol_specs.access.audit import WINDOW, Repeats, coalesce, refused_entry, refuser, repeated
from protocol_specs.access.auth import Principal, Scope
from protocol_specs.wire.wire import AuditEntry, AuditEvent

BOB = Principal(token="b1", kind="user", user="bob", scopes=frozenset({Scope.RUNS}))
BOBS_OTHER_TOKEN = Principal(token="b2", kind="user", user="bob", scopes=frozenset({Scope.RUNS}))
WORKER = Principal(token="w1", kind="worker", user="alice", run="r1", attempt=1)


def bobs(at: float, request: str = "cancel", who: Principal = BOB) -> AuditEntry:
    return refused_entry(
        at,
        who,
        request=request,
        code="no_such_run",
        message="no run 'r1' (or not yours)",
        source="10.0.0.2:5000",
        role="control",
        client="tether-cli",
    )


def test_a_refusal_names_who_from_where_with_what_and_the_code() -> None:
    entry = refused_entry(
        7.0,
        BOB,
        request="open_tunnel exec",
        code="no_such_run",
        message="no run 'r1' (or not yours)",
        source="10.0.0.2:5000",
        role="control",
        client="tether-cli " + "x" * 300,
        what="exec: cat ~/.ssh/id_rsa",
    )
    assert (entry.at, entry.event, entry.user, entry.token, entry.role, entry.source) == (
        7.0, AuditEvent.REFUSED, "bob", "b1", "control", "10.0.0.2:5000",
    )  # fmt: skip
    assert entry.detail == (
        "open_tunnel exec (exec: cat ~/.ssh/id_rsa): no_such_run: no run 'r1' (or not yours)"
    )
    assert len(entry.client) == 200
    nobody = refused_entry(
        1.0, None, request="open ide", code="unauthorized", message="m", source="s", role="ide"
    )
    assert (nobody.user, nobody.token) == ("", "")


def test_a_users_refusals_are_coalesced_whatever_token_and_per_request() -> None:
    assert refuser(BOB, "cancel") == refuser(BOBS_OTHER_TOKEN, "cancel")  # tokens are cheap
    assert refuser(BOB, "cancel") != refuser(BOB, "get_run")
    assert refuser(WORKER, "publish status") == "worker:w1 publish status"
    assert refuser(None, "open ide") == "- open ide"  # every holder of no valid token together


def test_the_first_refusal_of_a_window_is_written_and_the_rest_counted() -> None:
    written, kept = coalesce(None, bobs(100.0))
    assert written == [bobs(100.0)] and kept == Repeats(since=100.0)
    for n, at in enumerate((101.0, 130.0, 159.0), start=1):
        written, kept = coalesce(kept, bobs(at))
        assert written == [] and kept.count == n and kept.since == 100.0
    assert kept.last == bobs(159.0)
    said = repeated(kept)  # what a trail read now shows for them
    assert said is not None and said.at == 159.0
    assert said.detail.endswith("(the last of 3 more like it, in the 59 s after the first)")
    written, kept = coalesce(kept, bobs(100.0 + WINDOW))  # the next window: the count, then it
    assert written == [said, bobs(160.0)] and kept == Repeats(since=160.0)
    written, kept = coalesce(kept, bobs(500.0))  # nothing counted in between: just it
    assert written == [bobs(500.0)]


def test_one_repeat_is_shown_as_it_was() -> None:
    _, kept = coalesce(coalesce(None, bobs(0.0))[1], bobs(1.0))
    assert repeated(kept) == bobs(1.0)
    assert repeated(Repeats(since=0.0)) is None


def test_a_refusal_stamped_before_its_window_opens_a_new_one() -> None:
    """Another relay's clock behind this one's: never counted into a window it precedes."""
    _, kept = coalesce(None, bobs(100.0))
    written, kept = coalesce(kept, bobs(99.0))
    assert written == [bobs(99.0)] and kept.since == 99.0


def test_a_flood_adds_at_most_two_entries_per_window() -> None:
    kept: Repeats | None = None
    entries: list[AuditEntry] = []
    for i in range(10_000):  # one a second for close to three hours
        written, kept = coalesce(kept, bobs(float(i)))
        entries += written
    assert len(entries) <= 2 * (10_000 / WINDOW + 1)


def test_the_audit_shows_what_a_refused_party_wrote_without_its_escapes() -> None:
    entry = refused_entry(
        0.0,
        BOB,
        request="open ide",
        code="no_such_run",
        message="no run 'r1' (or not yours)",
        source="10.0.0.2:5000",
        role="ide",
        client="evil\x1b]0;pwned\x07\nnext line",
    )
    [line] = audit_lines([entry])
    assert "\x1b" not in line and "\n" not in line and "\x07" not in line
    assert "[evil\\x1b]0;pwned\\x07\\nnext line]" in line
