"""Runs that span nodes, the user's side: ``--nodes`` and the per-node flags at submit, the
refusals (``--gpus`` with several nodes), Slurm and Ray taking them, the local pool's nodes
(``NodePool``, the node worker's command line, ``--node-via``), and what ``tether status`` and
``tether logs`` show of each node."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio
import trio.testing

from adapter.cli.parser import build_parser
from adapter.cli.service import node_isolation
from adapter.show.render import Terminal, node_lines, node_rows, status_text
from protocol_specs.runs.resources import Resources
from protocol_specs.runs.runs import Attempt, RunRecord
from protocol_specs.runs.spec import RunSpec
from relay.client import Endpoint
from worker_shim.backends.nodes import NodePool, check_nodes, node_argv
from worker_shim.program.identity import Isolation


def _args(tmp_path: Path, *flags: str, command: str = "run") -> argparse.Namespace:
    from adapter.cli.parser import build_parser

    return build_parser().parse_args(
        [command, "--workdir", str(tmp_path), *flags, "--", "python", "t.py"]
    )


def _spec(tmp_path: Path, *flags: str, command: str = "run") -> RunSpec:
    from adapter.cli.submission import build_spec

    return build_spec(_args(tmp_path, *flags, command=command), debug=command == "debug")


@pytest.mark.parametrize("command", ["run", "debug", "sweep"])
def test_nodes_and_the_per_node_resources_reach_the_spec(tmp_path: Path, command: str) -> None:
    (tmp_path / "t.py").write_text("")
    flags = ("--nodes", "2", "--gpus-per-node", "4", "--cpus-per-node", "8")
    resources = _spec(tmp_path, *flags, command=command).resources
    assert (resources.nodes, resources.gpus, resources.cpus) == (2, 4, 8)
    one = _spec(tmp_path, command=command).resources
    assert (one.nodes, one.gpus, one.cpus) == (1, 0, 1)
    # one node: per node is the run's own
    assert _spec(tmp_path, "--gpus-per-node", "2", command=command).resources.gpus == 2


@pytest.mark.parametrize("what", ["gpus", "cpus"])
def test_gpus_and_cpus_with_several_nodes_are_refused_pointing_at_the_per_node_flags(
    tmp_path: Path, what: str
) -> None:
    with pytest.raises(
        SystemExit, match=f"with --nodes 2, --{what} is ambiguous: give --{what}-per-node"
    ):
        _spec(tmp_path, "--nodes", "2", f"--{what}", "2")
    with pytest.raises(SystemExit, match=f"give --{what} or --{what}-per-node, not both"):
        _spec(tmp_path, f"--{what}", "1", f"--{what}-per-node", "2")
    with pytest.raises(SystemExit, match=r"--nodes 0: .*at least 1"):
        _spec(tmp_path, "--nodes", "0")


@pytest.mark.parametrize("backend", ["slurm", "ray"])
def test_a_multi_node_run_on_a_scheduler_is_taken(tmp_path: Path, backend: str) -> None:
    (tmp_path / "t.py").write_text("")
    spec = _spec(tmp_path, "--nodes", "2", "--backend", backend, "--gpus-per-node", "2")
    assert (spec.backend, spec.resources.nodes, spec.resources.gpus) == (backend, 2, 2)
    # the relay checks the spec where it enters: taken there too
    again = RunSpec(command=["python", "t.py"], workdir="/w", backend=backend,
                    resources=Resources(nodes=2))  # fmt: skip
    assert again.resources.nodes == 2


def test_the_pool_flags_are_checked_and_split_as_a_shell_would(tmp_path: Path) -> None:
    from adapter.cli.parser import build_parser
    from adapter.cli.service import nodes_of

    parser = build_parser()
    args = parser.parse_args(["worker", "--nodes", "3", "--node-via", "ip netns exec 'tn 1'"])
    assert nodes_of(args, "tether worker") == [["ip", "netns", "exec", "tn 1"]]
    args = parser.parse_args(["up", "--nodes", "2", "--node-via", "a", "--node-via", "b"])
    with pytest.raises(SystemExit, match="tether up: --node-via given 2 times for --nodes 2"):
        nodes_of(args, "tether up")
    with pytest.raises(ValueError, match="a pool has 1 to 64 nodes"):
        check_nodes(0, [])
    assert parser.parse_args(["up"]).nodes == 1


async def test_a_run_takes_its_nodes_at_once_and_waits_until_they_are_free(tmp_path: Path) -> None:
    pool = NodePool(3, [["ip", "netns", "exec", "tn1"]], tmp_path)
    assert await pool.take(1) == []  # a single-node run: this host only
    first = await pool.take(2)
    assert [(n.index, n.prefix) for n in first] == [(1, ("ip", "netns", "exec", "tn1"))]
    assert first[0].work_dir == tmp_path / "nodes" / "node1"
    got: list[list[int]] = []

    async def second() -> None:
        got.append([n.index for n in await pool.take(3)])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(second)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # one of its two nodes is free: it waits, holding none
        assert [n.index for n in pool.free] == [2]
        await pool.give_back(first)
    assert got == [[1, 2]]
    assert pool.nodes[1].prefix == ()  # no --node-via for it: this host


async def test_more_nodes_than_the_pool_has_fails_at_once(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"asks for 3 nodes; this worker pool has 1 \(tether up"):
        await NodePool(1, [], tmp_path).take(3)


def test_a_node_worker_joins_with_its_token_in_the_environment_not_its_command_line(
    tmp_path: Path,
) -> None:
    node = NodePool(2, [["ip", "netns", "exec", "tn1"]], tmp_path).nodes[0]
    relay = Endpoint("ws://10.0.0.1:8765", token="secret-token", ca_file="/ca.pem")
    argv = node_argv(node, 1, "6b04", 2, relay, python="/py", allow_tunnels=False)
    assert argv == [
        "ip", "netns", "exec", "tn1", "/py", "-m", "adapter.cli", "worker", "--run", "6b04",
        "--attempt", "2", "--node", "1", "--work-dir", str(tmp_path / "nodes" / "node1"),
        "--relay", "ws://10.0.0.1:8765", "--ca-file", "/ca.pem", "--no-shell", "--no-isolation",
    ]  # fmt: skip
    assert "secret-token" not in " ".join(argv)


@pytest.mark.parametrize(
    "isolation",
    [
        Isolation(uids=range(61000, 61100), runs_root=Path("/srv/tether/runs")),
        Isolation(),
        Isolation(own_only=True),
    ],
)
def test_a_node_worker_houses_its_program_as_the_pool_does(
    tmp_path: Path, isolation: Isolation
) -> None:
    """The node's worker, parsing the options the pool passes it, gets the pool's isolation: a
    root pool's uids and runs root (its node's program under a leased uid too), else none (its
    program runs as the worker's user)."""
    node = NodePool(2, [], tmp_path).nodes[0]
    argv = node_argv(node, 1, "6b04", 2, Endpoint("ws://h:1"), python="/py", isolation=isolation)
    args = build_parser().parse_args(argv[3:])
    assert args.node == 1
    got = node_isolation(args)
    if isolation.isolating:
        assert (got.uids, got.runs_root) == (isolation.uids, isolation.runs_root)
        assert argv[-4:] == ["--run-uids", "61000-61099", "--runs-root", "/srv/tether/runs"]
    else:
        assert not got.isolating
        assert argv[-1] == "--no-isolation"


def _record(**fields: object) -> RunRecord:
    spec = RunSpec(command=["torchrun", "t.py"], workdir="/w", resources=Resources(nodes=2, gpus=1))
    return RunRecord(id="6b0400000000aa", spec=spec, created_at=0.0, updated_at=0.0, **fields)  # type: ignore[arg-type]


def test_status_shows_each_node_of_an_attempt_and_the_resources_per_node() -> None:
    rows = [
        SimpleNamespace(node=1, host="gpu2", state="exited", exit_code=1),
        SimpleNamespace(node=0, host="gpu1-long-name", state="running", exit_code=None),
    ]
    assert node_rows(rows) == [
        "     node 0  gpu1-long-name  running",
        "     node 1  gpu2            exited (exit 1)",
    ]
    assert node_rows(rows[:1]) == []  # a single-node run: no rows
    text = status_text(_record(attempts=[Attempt(n=1, queued_at=0.0)]), now=1.0)
    assert "resources  nodes=2 gpus=1 cpus=1 (per node)" in text
    fields = set(Attempt.model_fields)
    if "nodes" in fields:  # part A's record: the rows come from it
        attempt = Attempt.model_validate(
            {"n": 1, "queued_at": 0.0, "nodes": [vars(row) for row in rows]}
        )
        assert "     node 1  gpu2            exited (exit 1)" in status_text(
            _record(attempts=[attempt]), now=1.0
        )


def test_logs_put_node_k_before_each_line_of_nodes_after_the_first(
    capfdbinary: pytest.CaptureFixture[bytes],
) -> None:
    assert node_lines(1, b"a\nb", True) == (b"[node 1] a\n[node 1] b", False)
    assert node_lines(1, b"c\n\nd\n", False) == (b"c\n[node 1]\n[node 1] d\n", True)
    terminal = Terminal()
    terminal.write("stdout", b"rank 0 ", 0)
    terminal.write("stdout", b"rank 2 st", 1)
    terminal.write("stdout", b"ep\nrank 3\n", 1)
    terminal.write("stdout", b"up\n", 0)
    terminal.end()
    out = capfdbinary.readouterr().out
    # node 0's open line is ended before node 1's; each node's lines whole, node 1's marked
    assert out == b"rank 0 \n[node 1] rank 2 step\n[node 1] rank 3\nup\n"


async def test_what_node_0_raises_comes_out_of_the_node_workers_as_itself(tmp_path: Path) -> None:
    """The pool's slot tells a lost relay (it serves on) from a failure by the exception's type:
    the node workers' block must not wrap it in a group (it ended the whole pool once)."""
    from protocol_specs.wire.wire import ErrorCode
    from relay.client import RelayError
    from worker_shim.backends.nodes import node_workers

    relay = Endpoint("ws://127.0.0.1:1", token="t")
    with pytest.raises(RelayError):
        async with node_workers([], "r1", 1, relay, mark="m", say=lambda _t: None):
            raise RelayError(ErrorCode.STALE_ATTEMPT, "run r1 is at attempt 2")


def test_a_relay_error_nested_in_trio_s_groups_is_found_and_nothing_else_is() -> None:
    """The shim's nurseries nest the error that ends an attempt in groups: the pool's slot must
    still see it as the relay's (it serves on), and anything else as a failure."""
    from protocol_specs.wire.wire import ErrorCode
    from relay.client import RelayError, relay_error_of

    error = RelayError(ErrorCode.STALE_ATTEMPT, "run r1 is at attempt 2")
    nested = ExceptionGroup("a", [ExceptionGroup("b", [error])])
    assert relay_error_of(nested) is error
    assert relay_error_of(ExceptionGroup("c", [error, ValueError("x")])) is None
    assert relay_error_of(ValueError("x")) is None
