"""The run page's "Ranks" section: every process's Python stack, merged into classes, as
``tether stacks RUN`` prints them (``protocol_specs/session/stacks.py``).

The stacks live on the worker: the relay opens a ``stacks`` tunnel into the run itself, as the CLI
does (``relay/runs/tunnels.py``; the worker's ``worker_shim/program/sampler.py`` runs py-spy on
the program's processes without stopping them), and reads the tunnel's ``down`` stream from the
store until the worker's ``exit``. Who may see the run's page may see its stacks: the page's
``POST /ui/runs/RUN/stacks`` is authorised as the page is (``get_run``) and, as every tunnel,
recorded in the run's audit trail (role ``web``). It answers JSON, ``{header, lines, report}``;
the page's script sets the lines as text, never as HTML.

A run that spans nodes is read on every node at once (a tunnel per node's worker:
``TunnelSpec.node``) and merged as ``tether stacks`` merges it; a node whose stacks could not be
read is left out and named in the header.

The relay answers a web request within its handshake's time (``websockets``' ``open_timeout``,
10 s): a worker slower than :data:`WAIT` is said so, the tunnel ends on its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from protocol_specs.runs.runs import RunRecord, RunState
from protocol_specs.session.stack_report import NoStacks, header, report_of_nodes
from protocol_specs.session.stacks import StackReport, render_tree
from protocol_specs.wire import wire
from protocol_specs.wire.tunnels import TunnelSpec
from protocol_specs.wire.wire import WireError

from ..runs.tunnels import Tunnels
from ..store import Store, keys
from .pages import h

__all__ = ["WAIT", "read_stacks", "stacks_answer", "stacks_section"]

#: how long the relay waits for the worker's stacks (under the handshake's 10 s)
WAIT = 8.0
#: the most bytes of stacks read (the worker's answer for a few hundred processes is far less)
MAX_BYTES = 16 * 1024 * 1024
#: states whose processes can be sampled
_SAMPLED = (RunState.RUNNING, RunState.PAUSED)


async def read_stacks(
    tunnels: Tunnels,
    store: Store,
    record: RunRecord,
    user: str,
    *,
    noting: Callable[[str], Awaitable[None]],
    reload: Callable[[], Awaitable[RunRecord | None]],
    wait: float = WAIT,
) -> StackReport | str:
    """The merged stacks of ``record``'s run (``user`` may see it: checked before), or one line
    saying why not. ``noting(tunnel)`` records the tunnel in the audit trail; ``reload()`` reads
    the run's record again once the stacks are in (which processes are paused, as fresh)."""
    if record.finished or record.state not in _SAMPLED:
        return (
            f"run {record.id} is {record.state.value}: its stacks can be read while it runs "
            "(or is paused)"
        )
    got: dict[int, bytes | str] = {}

    async def one(node: int) -> None:
        spec = TunnelSpec(kind="stacks", node=node)
        got[node] = await _read_node(tunnels, store, record, spec, user, noting, wait)

    async with trio.open_nursery() as nursery:
        for node in range(record.spec.resources.nodes):
            nursery.start_soon(one, node)
    read = {node: out for node, out in got.items() if isinstance(out, bytes)}
    failed = {node: why for node, why in got.items() if isinstance(why, str)}
    if not read:
        return failed[min(failed)]
    fresh = await reload() or record
    try:
        report = report_of_nodes(read, fresh)
    except NoStacks as exc:
        return f"{exc} (is it an older tether?)"
    if failed:  # the other nodes' are shown
        report.missing = [f"node {node}: {why}" for node, why in sorted(failed.items())]
    return report


async def _read_node(
    tunnels: Tunnels,
    store: Store,
    record: RunRecord,
    spec: TunnelSpec,
    user: str,
    noting: Callable[[str], Awaitable[None]],
    wait: float,
) -> bytes | str:
    """What one node's ``stacks`` tunnel printed, or why it was not read (one line)."""
    opened = await tunnels.open(record, spec, 0, user=user, noting=noting)
    if not isinstance(opened, wire.TunnelOpened):
        assert isinstance(opened, wire.Error)
        return f"the stacks were not read: {opened.message}"
    down = keys.tunnel_stream(record.id, opened.tunnel, "down")
    out = bytearray()
    end: wire.TunnelEntry | None = None
    with trio.move_on_after(wait):
        async with store.blocking_reader() as reader:
            cursor = "0"
            while end is None:
                for entry_id, payload in await reader.read(down, cursor, block_ms=500):
                    cursor = entry_id
                    try:
                        step = wire.decode_entry(payload)
                    except WireError:
                        continue
                    if not isinstance(step, wire.TunnelEntry):
                        continue
                    if step.op == "data" and step.fd == 1 and len(out) < MAX_BYTES:
                        out += step.data
                    elif step.op == "exit":
                        end = step
                        break
    if end is None:
        return f"the worker did not send the stacks within {wait:g} s; try again"
    if end.code != 0:
        return f"the stacks were not read: {end.detail or f'exit {end.code}'}"
    return bytes(out)


def stacks_answer(got: StackReport | str) -> tuple[int, dict[str, object]]:
    """The JSON answer (status, body) of a stacks request."""
    if isinstance(got, str):
        return 409, {"error": got}
    return 200, {"header": header(got), "lines": render_tree(got), "report": got.model_dump()}


def stacks_section(record: RunRecord) -> str:
    """The section, for a run whose processes can be sampled ("" for another): a button reads
    the stacks (the page's script fills ``#ranks`` with their text)."""
    if record.finished or record.state not in _SAMPLED:
        return ""
    return (
        '<section class="ranks"><div class="bar"><h2>Ranks</h2>'
        f'<button type="button" id="ranks-read" data-stacks="/ui/runs/{h(record.id)}/stacks">'
        "Read the stacks</button></div>"
        '<p class="dim">Every process of the run, merged where their stacks are the same '
        "(as <code>tether stacks</code> prints them); running processes are read without "
        "stopping them.</p>"
        '<pre id="ranks" hidden></pre></section>'
    )
