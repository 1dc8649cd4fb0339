"""How a run reads in every view (``protocol_specs/runs/text.py``): text cut with an ellipsis, one
state for one run wherever it shows, what holds a pool's slots, how a served run ended, and
what the submit says happens if nobody comes."""

from __future__ import annotations

import pytest

from adapter.show.render import ended_text, runs_table, status_text, sweep_text, unattended_text
from protocol_specs.access.auth import Principal, Scope
from protocol_specs.runs.runs import Attempt, ProcessRow, RunEvent, RunRecord, RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.runs.text import shown_state, slots_text
from protocol_specs.sweeps.sweeps import SweepRecord, SweepSpec, Trial, parse_param
from protocol_specs.text_width import clip
from relay.web.experiments import sweep_page
from relay.web.pages import run_page, run_row

ALICE = Principal(token="t1", kind="user", user="alice", scopes=frozenset({Scope.RUNS}))


def record(run_id: str = "6b0400000000aa", owner: str = "alice", **fields: object) -> RunRecord:
    spec = RunSpec(command=["python", "x.py"], workdir="/w")
    base = {"id": run_id, "spec": spec, "owner": owner, "attempts": [Attempt(n=1)]}
    return RunRecord.model_validate({**base, **fields})


# --- text cut with an ellipsis -------------------------------------------------------------------


def test_text_that_fits_is_whole_and_text_that_does_not_ends_in_an_ellipsis() -> None:
    assert clip("exit 1", 40) == "exit 1"
    cut = clip("the program could not start: no such file or directory", 30)
    assert cut.endswith("\u2026") and len(cut) <= 30
    assert cut == "the program could not start\u2026"  # at the end of a word
    assert clip("abcdefghijklmnopqrstuvwxyz", 10) == "abcdefghi\u2026"  # one long word: cut in it
    assert clip("学習" * 10, 9) == "学習学習\u2026"  # wide characters take two columns


def test_a_finished_runs_reason_in_ls_and_the_web_list_is_cut_with_an_ellipsis() -> None:
    why = "the worker could not fetch the snapshot: relay unreachable after 8 tries"
    failed = record(state=RunState.FAILED, detail=why)
    assert failed.where() == clip(why, 40) and failed.where().endswith("\u2026")
    assert failed.where().removesuffix("\u2026") in why
    assert clip(why, 40) in runs_table([failed], now=0.0)
    row = run_row(failed.model_copy(update={"exit_code": 2, "detail": why * 3}), now=0.0)
    assert f"exit 2: {clip(why * 3, 80)}" in row and why * 2 not in row


# --- one state for one run -----------------------------------------------------------------------


def test_the_web_attempts_table_shows_a_paused_runs_attempt_paused() -> None:
    paused = record(
        state=RunState.PAUSED, paused_at="x.py:3 in f", attempts=[Attempt(n=1, started_at=5.0)]
    )
    html = run_page(paused, "", [], ALICE, "c", 10.0, logs_cursor="0")
    attempts = html[html.index('<table class="attempts">') :]
    assert ">paused</span>" in attempts and ">running</span>" not in attempts
    waiting = record(state=RunState.RUNNING, waiting_for_ide=True)
    html = run_page(waiting, "", [], ALICE, "c", 10.0, logs_cursor="0")
    assert ">waiting for an IDE</span>" in html[html.index('<table class="attempts">') :]


def test_a_paused_run_of_several_ranks_says_how_many_are_paused_in_ls_and_status() -> None:
    rows = {
        "": ProcessRow(title="main process (pid 5)", pid=5),
        **{
            str(10 + r): ProcessRow(
                title=f"rank {r} (pid {10 + r})",
                pid=10 + r,
                rank=r,
                state="running" if r == 3 else "paused",
                where="w.py:9 in main",
            )
            for r in range(4)
        },
        # a DataLoader worker of rank 0 inherits RANK: not a rank
        "20": ProcessRow(title="worker 1 of rank 0 (pid 20)", pid=20, rank=0, state="paused"),
    }
    paused = record(state=RunState.PAUSED, paused_at="rank 0: w.py:9 in main", processes=rows)
    assert shown_state(paused) == "paused (3 of 4 ranks)"
    assert "paused (3 of 4 ranks)" in runs_table([paused], now=30.0)
    assert "state      paused (3 of 4 ranks)" in status_text(paused, now=30.0)
    # a run that is not paused, or has one rank left, says its state alone
    assert shown_state(record(state=RunState.RUNNING, processes=rows)) == "running"
    one = {
        **rows,
        **{str(10 + r): rows["10"].model_copy(update={"state": "exited"}) for r in (1, 2, 3)},
    }
    assert shown_state(record(state=RunState.PAUSED, processes=one)) == "paused"


def test_a_finished_run_lists_no_process_as_paused() -> None:
    rows = {
        "": ProcessRow(title="main", state="paused", where="x.py:3 in f"),
        "c1": ProcessRow(title="worker 1 (pid 7)", pid=7, state="paused", where="x.py:9 in g"),
        "c2": ProcessRow(title="worker 2 (pid 8)", pid=8, state="exited", exit_code=0),
    }
    paused = record(state=RunState.PAUSED, paused_at="x.py:3 in f", processes=rows)
    done = paused.advance(RunEvent.EXIT_OK, at=20.0, exit_code=0)
    assert {row.state for row in done.processes.values()} == {"exited"}
    text = status_text(done, now=30.0)
    assert "paused" not in text and "worker 1 (pid 7): exited" in text


def test_sweep_status_shows_each_trials_run_in_the_state_ls_shows() -> None:
    spec = SweepSpec(run=RunSpec(command=["python", "t.py"], workdir="/w"),
                     params=[parse_param("lr=0.1,0.2,0.3")], search="grid")  # fmt: skip
    sweep = SweepRecord(id="S1", spec=spec, owner="alice")
    queued = record("r1", state=RunState.QUEUED)
    waiting = record("r2", state=RunState.RUNNING, waiting_for_ide=True)
    trials = [
        Trial(n=1, run="r1", params={"lr": 0.1}, run_state=shown_state(queued)),
        Trial(n=2, run="r2", params={"lr": 0.2}, run_state=shown_state(waiting)),
        Trial(n=3, run="r3", params={"lr": 0.3}, state="complete", ended=True, outcome="ok"),
    ]
    rows = sweep_text(sweep, trials, now=0.0).splitlines()[-3:]
    assert " queued " in rows[0] and "running" not in rows[0]
    assert " waiting for an IDE " in rows[1]
    assert " complete " in rows[2]
    assert runs_table([queued], now=0.0).splitlines()[1].split()[2] == "queued"
    page = sweep_page(sweep, trials, ALICE, "c", 0.0)
    assert ">queued</span>" in page and ">waiting for an IDE</span>" in page


# --- what holds a pool's slots -------------------------------------------------------------------


def test_a_queued_run_says_what_holds_the_slots_paused_and_waiting_runs_first() -> None:
    busy = record("r1", state=RunState.RUNNING)
    crashed = record("r2", state=RunState.PAUSED, paused_at="uncaught ValueError at t.py:8 in f")
    held = record("r3", state=RunState.RUNNING, waiting_for_ide=True)
    stopped = record("r4", state=RunState.PAUSED, paused_at="t.py:3 in g", owner="bob")
    text = slots_text([busy, crashed, held, stopped], free=0, viewer="alice")
    assert text == (
        "4 of 4 slots held: run r2 paused on uncaught ValueError at t.py:8 in f, "
        "a run of another user (paused at t.py:3 in g), run r3 waiting for an IDE, run r1 running"
    )
    assert "run r4 paused at t.py:3 in g" in slots_text([stopped], free=0, viewer=None)  # admin
    assert slots_text([busy], free=1, viewer="alice") == ""  # a free slot: it goes next
    assert slots_text([], free=0, viewer="alice") == ""  # nothing known holds one


def test_ls_and_status_show_why_a_queued_run_waits() -> None:
    why = "2 of 2 slots held: run r2 paused at t.py:3 in g, run r3 waiting for an IDE"
    queued = record(queued_why=why)
    assert queued.where() == why
    assert f"waiting    {why}" in status_text(queued, now=0.0)
    row = runs_table([queued], now=0.0).splitlines()[1]
    assert "2 of 2 slots held: run r2 paused at t.py:3 in g" in row


# --- messages --------------------------------------------------------------------------------------


def test_a_served_run_that_ended_without_an_exit_code_never_says_none() -> None:
    assert ended_text("r1", "exited", 3) == "run r1 ended (exited, exit code 3)"
    text = ended_text("r1", "start_failed", None, "no such file: x.py")
    assert text == "run r1 ended (start_failed: no such file: x.py)"
    assert "None" not in ended_text("r1", None, None)


@pytest.mark.parametrize(
    ("debug", "policy", "timeout", "said"),
    [
        (True, "terminate", 300, "waits for an IDE or pauses with none attached, it ends 5m "
         "later, freeing its slot (--on-unattended-stop terminate --unattended-timeout 5m)"),
        (False, "continue", 90, "pauses with no IDE attached (a crash, post-mortem), it goes on "
         "90s later (--on-unattended-stop continue --unattended-timeout 90s)"),
        (True, "wait", 1800, "it stays so until an IDE attaches, keeping its slot and GPUs "
         "(--on-unattended-stop wait)"),
    ],
)  # fmt: skip
def test_the_submit_says_what_happens_if_nobody_comes(
    debug: bool, policy: str, timeout: float, said: str
) -> None:
    spec = RunSpec(command=["python", "x.py"], workdir="/w", debug=debug,
                   on_unattended_stop=policy, unattended_timeout=timeout)  # fmt: skip
    text = unattended_text(spec)
    assert text.startswith("if nobody comes: when the run ") and text.endswith(said)
