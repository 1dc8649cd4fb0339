"""Issue 43's "Done when": a run over two nodes, each a network namespace of its own, debugged as
one from a real DAP client (node's ``@vscode/debugadapter-testsupport``).

Each node has its own loopback (``tests/netns.py``): a process on node 1 cannot reach node 0's
``127.0.0.1``, as on two machines. The relay (``tether up``) lives in this namespace; the nodes
reach it through a bridge. The pool runs on node 0 and starts node 1's worker there through
``--node-via 'ip netns exec NODE1'``. The program is ``torchrun --nnodes 2 --nproc-per-node 2
--rdzv-backend c10d train_nodes.py`` with real PyTorch (CPU, gloo): tether gives torchrun its
rendezvous endpoint, so the launch line names none.

A breakpoint set while the run is queued, in a function only node 1's ranks run, is hit in a rank
of node 1 and inspected in its own session; node 1's worker is then SIGKILLed: the attempt ends
on node 0 too, the retry starts both nodes again and stops at the breakpoint again; a continue
there runs the job to its end, exit code 0.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import trio
from direct_debugpy import copy_programs
from faults.proxy import FaultProxy
from netns import open_nodes
from node_harness import open_vscode_session, scenario
from stack import Proc, debug_run, local_token, relay_stack, tether
from test_pytorch_e2e import torch_python  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(600)]

PROGRAM = Path(__file__).resolve().parent / "programs" / "train_nodes.py"
#: node_one_check(): the line only node 1's ranks run
NODE_LINE = next(
    n for n, line in enumerate(PROGRAM.read_text().splitlines(), 1) if "# the breakpoint" in line
)
#: a lost node is noticed within this (the relay's lease); short, so the test is
LEASE = "6"


def node_worker_pids(namespace: str) -> list[int]:
    """The pids of the node workers (``tether worker ... --node K``) running in ``namespace``."""
    import subprocess

    listed = subprocess.run(
        ["ip", "netns", "pids", namespace], capture_output=True, text=True, check=False
    ).stdout.split()
    found = []
    for pid in listed:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"worker" in argv and b"--node" in argv:
            found.append(int(pid))
    return found


async def say_what_happened(home: Path, run_id: str, pool: Proc) -> None:
    """The pool's output and the run's logs, printed (pytest shows them when the test fails)."""
    with trio.CancelScope(shield=True):
        async with tether("logs", run_id, home=home) as logs:
            with trio.move_on_after(10):
                await logs.process.wait()
    print("the pool said:", pool.output, "logs:", logs.output, sep="\n")


def stopped_on_node_1(label: str, session: str) -> list[dict[str, Any]]:
    return [
        {
            "op": "wait_session",
            "label": session,
            "stopped": True,
            "name": r"^rank \d \(pid \d+\) on node 1 ",
            "timeoutMs": 120_000,
        },
        {
            "op": "wait_stopped",
            "session": session,
            "label": label,
            "reason": "breakpoint",
            "path": "train_nodes.py",
            "line": NODE_LINE,
            "function": "node_one_check",
            "timeoutMs": 240_000,
        },
    ]


async def test_issue_43_torchrun_over_two_nodes_is_debugged_and_a_lost_node_retried(
    tmp_path: Path,
    torch_python: str,  # noqa: F811 (the fixture)
    netns_ok: None,
) -> None:
    ws = copy_programs(tmp_path / "ws")
    home = tmp_path / "home"
    steps: list[dict[str, Any]] = [
        {"op": "mark", "name": "configured", "wait": True},
        *stopped_on_node_1("hit", "first"),
        {
            "op": "evaluate",
            "session": "first",
            "label": "node",
            "expression": "__import__('os').environ['TETHER_NODE']",
        },
        {"op": "variables", "session": "first", "label": "locals", "scope": "Locals"},
        {"op": "mark", "name": "kill", "wait": True},
        *stopped_on_node_1("again", "second"),
        {"op": "continue", "session": "second"},
        {"op": "wait_terminated", "label": "end", "timeoutMs": 240_000},
        {"op": "disconnect"},
    ]
    command = [
        "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
        "--rdzv-backend", "c10d", "train_nodes.py",
    ]  # fmt: skip
    extra = ("--nodes", "2", "--env", "GLOO_SOCKET_IFNAME=eth0", "--max-retries", "1")
    with open_nodes(2) as nodes:
        async with (
            relay_stack(home, isolated=False, flags=("--lease", LEASE)) as (_up, relay),
            trio.open_nursery() as nursery,
        ):
            port = int(relay.rsplit(":", 1)[1])
            proxy = FaultProxy("127.0.0.1", port, listen=nodes.bridge_address)
            await nursery.start(proxy.run)
            async with debug_run(home, relay, ws, torch_python, *command, extra=extra) as (
                debug,
                run_id,
                adapter,
            ):
                spec = scenario(
                    adapter, ws, steps, breakpoints={"train_nodes.py": [NODE_LINE]},
                    timeout_ms=300_000,
                )  # fmt: skip
                async with open_vscode_session(spec, timeout=540) as session:
                    await session.wait_mark("configured")
                    async with tether(
                        "worker", "--relay", proxy.url_for(), "--slots", "1",
                        "--work-dir", str(home / "worker"), "--no-isolation",
                        "--nodes", "2", "--node-via", " ".join(nodes.prefix(1)),
                        home=home, name="pool", prefix=nodes.prefix(0),
                        extra_env={"TETHER_TOKEN": local_token(home)},
                    ) as pool:  # fmt: skip
                        await session.release("configured")
                        try:
                            await session.wait_mark("kill", timeout=300)
                            victims = node_worker_pids(nodes.names[1])
                            assert len(victims) == 1, victims
                            os.kill(victims[0], signal.SIGKILL)
                            await session.release("kill")
                            result, _messages = await session.result()
                            await debug.wait_line(r"ended \(exited, exit code 0\)", timeout=120)
                            await pool.wait_line(rf"claimed run {run_id} \(attempt 2\)", timeout=10)
                        except BaseException:
                            await say_what_happened(home, run_id, pool)
                            raise
            nursery.cancel_scope.cancel()
    labels = result["labels"]
    assert labels["node"]["result"] == "'1'"
    values = labels["locals"]["values"]
    assert values["step"] == "2", values
    assert labels["end"]["exitCode"] == 0
