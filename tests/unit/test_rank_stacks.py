"""``tether stacks``: the merge of every process's Python stack into classes and a prefix tree
(``protocol_specs/session/stacks.py``), its text, py-spy's JSON read without the debugger's
frames, and the run record's states laid over the samples (``adapter/cli/rank_stacks.py``)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from adapter.cli.rank_stacks import with_states
from protocol_specs.runs.runs import ProcessRow
from protocol_specs.session.stacks import (
    Frame,
    ProcessStack,
    StackNode,
    ThreadStack,
    compress_ranks,
    merge,
    render_tree,
    threads_from_pyspy,
    user_frames,
)
from protocol_specs.wire.tunnels import TunnelSpec

MAIN = Frame(file="train.py", path="/w/train.py", line=60, function="main")
STEP = Frame(file="train.py", path="/w/train.py", line=40, function="step")
FWD = Frame(file="ddp.py", path="/s/ddp.py", line=88, function="forward")
STEP52 = Frame(file="train.py", path="/w/train.py", line=52, function="step")


def rank(r: int, frames: list[Frame], **kw: Any) -> ProcessStack:
    return ProcessStack(
        pid=100 + r,
        name=f"rank {r} (pid {100 + r})",
        rank=r,
        threads=[ThreadStack(name="MainThread", main=True, frames=frames)],
        **kw,
    )


def test_ranks_in_one_place_are_one_class_and_the_paused_one_its_own() -> None:
    procs = [rank(r, [MAIN, STEP, FWD]) for r in (0, 1, 2, 4, 5, 6, 7)]
    procs.append(rank(3, [MAIN, STEP52], state="paused", why="breakpoint"))
    report = merge(procs, run="6b07a1c3")
    assert [(c.label, c.state) for c in report.classes] == [
        ("ranks 0-2,4-7", "running"),
        ("rank 3", "paused: breakpoint"),
    ]
    assert render_tree(report) == [
        "ranks 0-7: train.py:60 main",
        "  ranks 0-2,4-7 (running): train.py:40 step > ddp.py:88 forward",
        "  rank 3 (paused: breakpoint): train.py:52 step",
    ]
    assert json.loads(report.model_dump_json())["classes"][1]["frames"][-1] == {
        "file": "train.py", "line": 52, "function": "step", "path": "/w/train.py",
    }  # fmt: skip


def test_a_process_whose_stack_ends_where_others_go_on_is_a_leaf_of_its_own() -> None:
    report = merge([rank(0, [MAIN]), rank(1, [MAIN, STEP])])
    assert render_tree(report) == [
        "ranks 0-1: train.py:60 main",
        "  rank 0 (running): (here)",
        "  rank 1 (running): train.py:40 step",
    ]


def test_the_same_place_in_another_state_is_another_class() -> None:
    report = merge([rank(0, [MAIN, STEP]), rank(1, [MAIN, STEP], state="paused", why="pause")])
    assert [c.state for c in report.classes] == ["running", "paused: pause"]
    assert render_tree(report)[1:] == [
        "  rank 0 (running): (here)",
        "  rank 1 (paused: pause): (here)",
    ]


def test_unreadable_stacks_are_listed_with_why_and_no_traceback() -> None:
    bad = "not permitted to read the process (Permission denied)"
    procs = [
        rank(0, [MAIN]),
        ProcessStack(pid=7, name="worker 1 of rank 0 (pid 7)", error=bad),
        ProcessStack(pid=8, name="worker 2 of rank 0 (pid 8)", error=bad),
    ]
    report = merge(procs)
    assert render_tree(report)[-1] == (f"2 workers of rank 0: stack unreadable: {bad}")
    assert [c.pids for c in report.unreadable] == [[7, 8]]


def test_names_without_a_rank_are_listed_then_counted() -> None:
    procs = [ProcessStack(pid=p, name=f"w (pid {p})") for p in range(1, 6)]
    assert merge(procs).classes[0].label == "w (pid 1), w (pid 2), w (pid 3) and 2 more"


def test_the_workers_of_ranks_are_counted_not_listed() -> None:
    """A DataLoader of 2 workers per rank, 4 ranks, all in one place: one short label."""
    ranks = [ProcessStack(pid=10 + r, name=f"rank {r} (pid {10 + r})", rank=r) for r in range(4)]
    workers = [
        ProcessStack(
            pid=20 + 2 * r + w, name=f"worker {w} of rank {r} (pid {20 + 2 * r + w}) on vm"
        )
        for r in range(4)
        for w in range(2)
    ]
    main = ProcessStack(pid=9, name="main process (pid 9)")
    label = merge([*ranks, *workers, main]).classes[0].label
    assert label == "ranks 0-3, 8 workers of ranks 0-3, main process (pid 9)"
    one = merge([ranks[0], workers[0]]).classes[0].label
    assert one == "rank 0, worker 0 of rank 0 (pid 20) on vm"  # one is named


def test_compress_ranks() -> None:
    assert compress_ranks([7, 0, 1, 2, 4, 5, 6]) == "0-2,4-7"
    assert compress_ranks([3]) == "3"
    assert compress_ranks([1, 3, 5, 6]) == "1,3,5-6"
    assert compress_ranks([]) == ""


FRAMES = st.lists(st.sampled_from([MAIN, STEP, FWD, STEP52]), max_size=5)
PROCS = st.lists(
    st.tuples(FRAMES, st.sampled_from(["running", "paused"]), st.booleans()), max_size=12
)


def _leaves(nodes: list[StackNode]) -> list[list[int]]:
    out = []
    for node in nodes:
        out += _leaves(node.children) if node.children else [node.pids]
    return out


@given(PROCS)
def test_every_process_is_in_exactly_one_class_and_one_leaf(spec: list[Any]) -> None:
    procs = [
        ProcessStack(
            pid=i + 1,
            name=f"p{i}",
            rank=i if i % 2 else None,
            state=state,
            threads=[ThreadStack(main=True, frames=frames)],
            error="gone" if bad else "",
        )
        for i, (frames, state, bad) in enumerate(spec)
    ]
    report = merge(procs)
    in_classes = [pid for c in report.classes + report.unreadable for pid in c.pids]
    assert sorted(in_classes) == [p.pid for p in procs]
    readable = {p.pid: p for p in procs if not p.error}
    leaves = _leaves(report.tree)
    assert sorted(pid for leaf in leaves for pid in leaf) == sorted(readable)
    for c in report.classes:  # a class: one place, one state
        assert len({(tuple(readable[p].main_frames()), readable[p].state) for p in c.pids}) == 1

    def paths(nodes: list[StackNode], above: list[Frame]) -> None:
        for node in nodes:
            here = above + node.frames
            for pid in node.pids:  # a node's processes all pass through its frames
                assert readable[pid].main_frames()[: len(here)] == here
            paths(node.children, here)

    paths(report.tree, [])


def pyspy_frame(path: str, line: int, name: str) -> dict[str, Any]:
    return {"name": name, "filename": path, "short_filename": path.rsplit("/", 1)[-1],
            "line": line, "locals": None}  # fmt: skip


def test_a_paused_process_shows_the_users_frame_on_top_without_the_debuggers() -> None:
    deb = "/v/lib/python3.11/site-packages/debugpy/_vendored/pydevd"
    dump = [
        {
            "thread_name": "MainThread",
            "os_thread_id": 42,
            "frames": [  # innermost first, as py-spy gives them
                pyspy_frame("/usr/lib/python3.11/threading.py", 320, "Condition.wait"),
                pyspy_frame(f"{deb}/pydevd.py", 2197, "PyDB._do_wait_suspend"),
                pyspy_frame(f"{deb}/pydevd.py", 2160, "PyDB.do_wait_suspend"),
                pyspy_frame(f"{deb}/_pydevd_bundle/pydevd_frame.py", 990, "trace_dispatch"),
                pyspy_frame("/w/train.py", 52, "step"),
                pyspy_frame("/w/train.py", 60, "main"),
                pyspy_frame("/w/train.py", 70, "<module>"),
                pyspy_frame("<frozen runpy>", 88, "_run_code"),
                pyspy_frame(f"{deb}/../../debugpy/server/cli.py", 300, "run_file"),
                pyspy_frame("/rt/scripts/_tether_debugpy_boot.py", 30, "<module>"),
            ],
        },
        {
            "thread_name": "pydevd.Reader",
            "os_thread_id": 43,
            "frames": [pyspy_frame(f"{deb}/_pydevd_bundle/pydevd_comm.py", 200, "run")],
        },
    ]
    [thread] = threads_from_pyspy(dump, 42)
    assert thread.main
    # the wait in threading.py is pydevd's too: it sits above the first debugger frame
    assert [f.text() for f in thread.frames] == [
        "train.py:70 <module>",
        "train.py:60 main",
        "train.py:52 step",
    ]


def test_frames_above_the_debuggers_wait_are_dropped_too() -> None:
    """What pydevd calls while it holds the thread (``threading``'s wait) is not the user's."""
    deb = "/v/debugpy/_vendored/pydevd"
    frames = user_frames(
        [
            pyspy_frame("/usr/lib/python3.11/threading.py", 320, "Condition.wait"),
            pyspy_frame(f"{deb}/pydevd.py", 2197, "PyDB._do_wait_suspend"),
            pyspy_frame("/w/train.py", 52, "step"),
        ]
    )
    assert [f.text() for f in frames] == ["train.py:52 step"]


def test_tethers_boot_script_is_left_out_when_tether_runs_from_a_source_checkout() -> None:
    """py-spy names a file by its path below the outermost package it is in: from a checkout
    (``worker_shim/inject/__init__.py`` exists) the boot script is
    ``worker_shim/inject/_tether_debugpy_boot.py``, still tether's, not the user's."""
    checkout = "/home/u/tether/worker_shim/inject"
    deb = "/home/u/tether/.venv/lib/python3.11/site-packages/debugpy"
    raw = [
        pyspy_frame("/w/train.py", 52, "step"),
        pyspy_frame("/w/train.py", 70, "<module>"),
        pyspy_frame("<frozen runpy>", 88, "_run_code"),
        pyspy_frame(f"{deb}/server/cli.py", 300, "run_file"),
        {**pyspy_frame(f"{checkout}/_tether_debugpy_boot.py", 30, "<module>"),
         "short_filename": "worker_shim/inject/_tether_debugpy_boot.py"},
        {**pyspy_frame(f"{checkout}/_tether_launch.py", 12, "<module>"),
         "short_filename": "worker_shim/inject/_tether_launch.py"},
    ]  # fmt: skip
    assert [f.text() for f in user_frames(raw)] == ["train.py:70 <module>", "train.py:52 step"]


def test_garbage_from_pyspy_gives_no_threads() -> None:
    assert threads_from_pyspy({"not": "a list"}, 1) == []
    assert threads_from_pyspy([1, {"frames": "x"}], 1) == []


def test_the_records_states_and_names_are_laid_over_the_samples() -> None:
    sampled = [
        ProcessStack(pid=10, name="ranks_launcher.py (pid 10)"),
        ProcessStack(pid=11, name="rank 0 (pid 11)", rank=0),
        ProcessStack(pid=12, name="rank 1 (pid 12)", rank=1),
    ]
    rows = {
        "": ProcessRow(title="main process", state="running"),
        "12": ProcessRow(
            title="rank 1 (pid 12) on gpu-7",
            pid=12,
            rank=1,
            state="paused",
            where="ranks_worker.py:36 in main",
            reason="breakpoint",
        ),
    }
    out = with_states(sampled, rows, program=10)
    assert [(p.name, p.state, p.why) for p in out] == [
        ("ranks_launcher.py (pid 10)", "running", ""),
        ("rank 0 (pid 11)", "running", ""),
        ("rank 1 (pid 12) on gpu-7", "paused", "breakpoint"),
    ]


def test_a_stacks_tunnel_needs_no_command() -> None:
    assert TunnelSpec(kind="stacks").describe() == "stacks"
