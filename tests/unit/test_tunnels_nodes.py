"""Tunnels of a run that spans nodes (issue 43): each names the node whose worker serves it, the
relay refuses a node the run lacks, and ``tether stacks`` / ``tether eval`` merge every node's
answer by rank."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from adapter.cli.parser import build_parser
from adapter.cli.tunnel import _options_before_the_command
from protocol_specs.runs.resources import Resources
from protocol_specs.runs.runs import ProcessRow, RunRecord, RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.session.rank_values import RankValue, console_answer, merge_values
from protocol_specs.session.stack_report import report_of, report_of_nodes
from protocol_specs.session.stacks import (
    Frame,
    ProcessStack,
    ThreadStack,
    as_workdir,
    merge,
    render_tree,
)
from protocol_specs.wire import wire
from protocol_specs.wire.tunnel_open import Create, Known, Refuse, open_verdict, tunnel_id
from protocol_specs.wire.tunnels import TunnelSpec
from worker_shim.program.tunnels import Tunnels


def record(nodes: int = 2, state: RunState = RunState.RUNNING, **kw: Any) -> RunRecord:
    spec = RunSpec(command=["torchrun", "t.py"], workdir="/w", resources=Resources(nodes=nodes))
    return RunRecord(id="r1", spec=spec, state=state, attempt=1, **kw)


# --- the spec and the relay's verdict -----------------------------------------------------------


def test_a_tunnel_names_its_node_and_another_node_is_another_tunnel() -> None:
    on1 = TunnelSpec(kind="exec", argv=["hostname"], node=1)
    assert on1.describe() == "exec: hostname on node 1"
    assert TunnelSpec(kind="shell").describe() == "shell"  # node 0: as ever
    assert tunnel_id("ann", "k" * 16, on1) != tunnel_id(
        "ann", "k" * 16, on1.model_copy(update={"node": 0})
    )
    with pytest.raises(ValidationError):
        TunnelSpec(kind="shell", node=64)


def test_the_relay_refuses_a_node_the_run_does_not_have_at_once() -> None:
    verdict = open_verdict(record(nodes=2), known=Known.NO, node=2)
    assert isinstance(verdict, Refuse) and verdict.code is wire.ErrorCode.BAD_SPEC
    assert verdict.message == "run r1 has no node 2: it runs on nodes 0-1"
    one = open_verdict(record(nodes=1), known=Known.NO, node=1)
    assert isinstance(one, Refuse) and "runs on one node (node 0)" in one.message
    # before the run's state is looked at: queued, it says the node, not the queue
    queued = open_verdict(record(nodes=2, state=RunState.QUEUED), known=Known.NO, node=5)
    assert isinstance(queued, Refuse) and "no node 5" in queued.message
    assert open_verdict(record(nodes=2), known=Known.NO, node=1) == Create()


def test_an_ended_runs_node_k_is_refused_its_worker_ended_with_it() -> None:
    verdict = open_verdict(record(state=RunState.FAILED), known=Known.NO, held=True, node=1)
    assert isinstance(verdict, Refuse) and verdict.code is wire.ErrorCode.RUN_FINISHED
    assert "node 1's worker ended with it" in verdict.message
    # node 0's directory is still kept by its pool
    assert open_verdict(record(state=RunState.FAILED), known=Known.NO, held=True) == Create()


# --- the worker serves its own node's tunnels only ----------------------------------------------


class _Nursery:
    def __init__(self) -> None:
        self.started: list[tuple[Any, ...]] = []

    def start_soon(self, fn: Any, *args: Any) -> None:
        self.started.append(args)


def _request(tunnel: str, spec: TunnelSpec) -> wire.ControlEntry:
    return wire.ControlEntry(action="tunnel", detail=tunnel, attempt=1, data=spec.model_dump())


@pytest.mark.parametrize("node", [0, 1])
def test_each_nodes_worker_serves_the_tunnels_of_its_node_and_ignores_the_others(node: int) -> None:
    nursery = _Nursery()
    tunnels = Tunnels("ws://relay", record(), Path("/w"), {}, nursery, node=node)  # type: ignore[arg-type]
    for k in (0, 1):
        served = tunnels.open(_request(f"t{k}", TunnelSpec(kind="stacks", node=k)))
        assert served is (k == node)
    assert [args[0] for args in nursery.started] == [f"t{node}"]


# --- the CLI's flag -----------------------------------------------------------------------------


def test_node_flag_of_exec_shell_and_port_forward() -> None:
    parser = build_parser()
    assert parser.parse_args(["shell", "--node", "1", "r1"]).node == 1
    assert parser.parse_args(["port-forward", "--node", "3", "r1", "6006"]).node == 3
    assert parser.parse_args(["shell", "r1"]).node == 0
    # exec: before RUN, or between RUN and --; neither forgets the other
    args = parser.parse_args(["exec", "--node", "1", "r1", "--", "hostname"])
    assert _options_before_the_command(args) == ["hostname"] and args.node == 1
    args = parser.parse_args(["exec", "r1", "--node", "2", "--", "env"])
    assert _options_before_the_command(args) == ["env"] and args.node == 2
    with pytest.raises(SystemExit):
        parser.parse_args(["shell", "--node", "x", "r1"])


# --- stacks across nodes ------------------------------------------------------------------------


def _sample(program: int, *procs: tuple[int, int | None, str]) -> bytes:
    """A node's ``stacks`` answer: (pid, rank, the innermost function) per process."""
    out = []
    for pid, rank, function in procs:
        frames = [
            Frame(file="t.py", line=1, function="main"),
            Frame(file="t.py", line=9, function=function),
        ]
        out.append(
            ProcessStack(
                pid=pid,
                name=f"rank {rank} (pid {pid})",
                rank=rank,
                threads=[ThreadStack(main=True, frames=frames)],
            ).model_dump()
        )
    return json.dumps({"program": program, "processes": out}).encode()


def test_the_stacks_of_every_node_merge_by_rank_even_where_pids_are_equal() -> None:
    rows = {
        "": ProcessRow(title="main process", state="running"),
        "n1": ProcessRow(title="main process (pid 10) on node 1 (b)", pid=10, node=1, state="running"),
        "n1:12": ProcessRow(
            title="rank 3 (pid 12) on node 1 (b)", pid=12, rank=3, node=1, state="paused",
            reason="breakpoint", where="t.py:9 in step",
        ),
    }  # fmt: skip
    run = record(processes=rows)
    node0 = _sample(10, (11, 0, "step"), (12, 1, "step"))
    node1 = _sample(10, (11, 2, "step"), (12, 3, "step"))  # the same pids, on another host
    report = report_of_nodes({0: node0, 1: node1}, run)
    assert [(p.node, p.pid, p.rank) for p in report.processes] == [
        (0, 11, 0), (0, 12, 1), (1, 11, 2), (1, 12, 3),
    ]  # fmt: skip
    named = {p.rank: (p.name, p.state) for p in report.processes}
    # node 1's rank 3 is the one paused (its row is n1:12), node 0's pid 12 is not
    assert named[1] == ("rank 1 (pid 12)", "running")
    assert named[3] == ("rank 3 (pid 12) on node 1 (b)", "paused")
    assert named[2] == ("rank 2 (pid 11) on node 1", "running")  # no row: its node said
    assert render_tree(report) == [
        "ranks 0-3: t.py:1 main > t.py:9 step",
        "  ranks 0-2 (running): (here)",
        "  rank 3 (paused: breakpoint): (here)",
    ]
    # one node's answer: as before
    assert [p.pid for p in report_of(node0, run).processes] == [11, 12]
    # merging keeps one process per (node, pid), not per pid
    assert len(merge(report.processes).processes) == 4


# --- eval across nodes --------------------------------------------------------------------------


def test_values_of_every_node_merge_by_rank_the_one_that_says_most_kept() -> None:
    node0 = [RankValue(rank=0, repr="1.0", number=1.0), RankValue(rank=1, state="running"),
             RankValue(rank=3, state="absent"), RankValue(rank=9, state="absent")]  # fmt: skip
    node1 = [RankValue(rank=0, state="absent"), RankValue(rank=3, repr="2.0", number=2.0),
             RankValue(rank=9, state="absent")]  # fmt: skip
    merged = merge_values([node0, node1])
    assert [(v.rank, v.state, v.repr) for v in merged] == [
        (0, "value", "1.0"), (1, "running", ""), (3, "value", "2.0"), (9, "absent", ""),
    ]  # fmt: skip


def test_an_at_all_answer_of_a_node_says_the_other_nodes_ranks_are_not_included() -> None:
    values = [RankValue(rank=2, repr="7", number=7.0), RankValue(rank=3, repr="7", number=7.0)]
    result, error = console_answer(values, "r1", nodes=2, node=1)
    assert not error and result.splitlines()[0] == "ranks 2-3: 7"
    assert result.splitlines()[-1] == (
        "(node 1's ranks only: the other nodes' ranks are not included here; "
        "tether eval r1 EXPR evaluates every node's)"
    )
    result, error = console_answer([RankValue(rank=2, state="running")], "r1", nodes=2, node=1)
    assert not result and error.startswith("no rank is paused") and "tether eval r1" in error
    # a run of one node: as before
    result, _ = console_answer(values, "r1")
    assert "node" not in result


def test_the_parser_is_unchanged_for_a_run_of_one_node() -> None:
    args = build_parser().parse_args(["exec", "r1", "--", "nvidia-smi"])
    assert isinstance(args, argparse.Namespace) and args.node == 0


def test_the_same_file_in_two_nodes_directories_is_one_place() -> None:
    def thread(root: str) -> ThreadStack:
        frames = [Frame(file="t.py", path=f"{root}/t.py", line=9, function="step"),
                  Frame(file="x.py", path="/usr/lib/x.py", line=1, function="f")]  # fmt: skip
        return ThreadStack(main=True, frames=frames)

    on0 = as_workdir([thread("/pool/runs/r1-1")], ["/pool/runs/r1-1", ""], "/home/me/w")
    on1 = as_workdir([thread("/real/n1/r1-1")], ["/n1/r1-1", "/real/n1/r1-1"], "/home/me/w/")
    assert [f.path for f in on0[0].frames] == ["/home/me/w/t.py", "/usr/lib/x.py"]
    assert on0 == on1
    report = merge([ProcessStack(pid=5, name="a", rank=0, threads=on0),
                    ProcessStack(pid=5, name="b", rank=1, threads=on1, node=1)])  # fmt: skip
    assert [c.label for c in report.classes] == ["ranks 0-1"]
