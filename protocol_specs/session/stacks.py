"""Every process of a run at a glance: Python stacks merged into classes (``tether stacks RUN``).

Theory of operation
-------------------
A distributed job is many processes that mostly do the same thing; what matters is where they
differ. As STAT and DDT's parallel stack view do for MPI ranks, the stacks of all processes are
merged: processes whose stack is the same list of frames form one *class*, and the classes form
a prefix tree (the common outer calls once, then the branches), each node naming its processes
compactly (``ranks 0-2,4-7``).

- **Input.** Per process (:class:`ProcessStack`): its name as tether describes it (``rank 3 (pid
  4242)``, ``worker 1 of rank 0 (pid 4300)``), its rank when it *is* that rank (not a worker of
  it), its state (``running``, or ``paused`` with why: ``breakpoint``, ``exception``...), and its
  threads' frames (outermost call first), or why its stack could not be read.
- **Which thread.** A process is classed by its *main thread*'s stack: the one a training loop
  runs in. Helper threads (a DataLoader's pin-memory thread, a logger's) differ between processes
  for no reason that matters and would split every class; they are kept in each process's data
  (``--json``) for a view that wants them.
- **Sampled stacks** come from ``py-spy dump --json`` on the worker (:func:`threads_from_pyspy`),
  which reads a process's memory without stopping it, also while it waits in native code (a
  collective). The debugger's own frames are dropped (:func:`user_frames`): a process paused by
  debugpy shows pydevd's wait loop on top of the user's frame, and every debugged process has
  debugpy's and tether's runners at the bottom.
- **Output.** :class:`StackReport`: the processes, the classes, the tree; :func:`render_tree` is
  the text, ``StackReport.model_dump()`` the stable JSON (``docs/cli.md``). The web view and the
  editors' Ranks view take the same report.

Sans-I/O: plain data in, plain data out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "MAX_FRAMES",
    "Frame",
    "ProcessStack",
    "StackClass",
    "StackNode",
    "StackReport",
    "ThreadStack",
    "as_workdir",
    "compress_ranks",
    "describe_set",
    "merge",
    "ranks_text",
    "render_tree",
    "threads_from_pyspy",
    "user_frames",
]

#: the most frames kept per thread (the innermost ones: where it is)
MAX_FRAMES = 256

#: parts of a file's path that make a frame the debugger's (debugpy, pydevd) or tether's
_DEBUGGER_PATHS = ("/debugpy/", "/pydevd", "/_pydevd", "/_pydev_")
_TETHER_SCRIPTS = "_tether_"
#: the runner of ``python -m`` and of debugpy's launch, below the user's first frame
_RUNNERS = frozenset({"runpy.py", "<frozen runpy>"})


class Frame(BaseModel):
    """One call: ``file`` as shown (the file's name), ``path`` in full, ``line``, ``function``."""

    model_config = ConfigDict(frozen=True)

    file: str
    line: int
    function: str
    path: str = ""

    def text(self) -> str:
        return f"{self.file}:{self.line} {self.function}"

    def same_place(self) -> tuple[str, int, str]:
        return (self.path or self.file, self.line, self.function)


class ThreadStack(BaseModel):
    """A thread's frames, outermost call first."""

    model_config = ConfigDict(frozen=True)

    name: str = ""
    tid: int = 0  #: the OS thread id
    main: bool = False
    frames: list[Frame] = Field(default_factory=list)


class ProcessStack(BaseModel):
    """One process as the merge takes it."""

    model_config = ConfigDict(frozen=True)

    pid: int
    #: as tether names it (``rank 3 (pid 4242)``)
    name: str
    #: the rank this process is (None for a worker of a rank, or a process without one)
    rank: int | None = None
    state: Literal["running", "paused"] = "running"
    #: why it is paused (``breakpoint``, ``exception``, ``pause``, ``step``); "" when unknown
    why: str = ""
    #: where the debugger says it is paused (``train.py:52 in step``)
    where: str = ""
    threads: list[ThreadStack] = Field(default_factory=list)
    #: why its stack could not be read ("": it was)
    error: str = ""
    #: the node whose worker read it, of a run that spans nodes (pids of two hosts may be equal)
    node: int = 0

    def main_frames(self) -> list[Frame]:
        """The frames of its main thread (the first thread when none is marked main)."""
        chosen = next((t for t in self.threads if t.main), None)
        if chosen is None and self.threads:
            chosen = self.threads[0]
        return chosen.frames if chosen else []

    def state_text(self) -> str:
        if self.error:
            return f"stack unreadable: {self.error}"
        if self.state == "paused":
            return f"paused: {self.why}" if self.why else "paused"
        return "running"


class StackClass(BaseModel):
    """Processes in the same place, in the same state: their main thread's frames (outermost
    first), or the same reason their stacks could not be read."""

    label: str  #: ``ranks 0-2,4-7``
    pids: list[int]
    state: str  #: ``running``, ``paused: breakpoint``, ``stack unreadable: ...``
    frames: list[Frame] = Field(default_factory=list)

    def text(self) -> str:
        where = " > ".join(f.text() for f in self.frames) or "(no Python frames)"
        if self.state.startswith("stack unreadable"):
            return f"{self.label}: {self.state}"
        return f"{self.label} ({self.state}): {where}"


class StackNode(BaseModel):
    """A node of the merged tree: a run of ``frames`` every one of ``pids`` is in, then its
    ``children`` (the branches); a leaf (no children) is where its processes are, in ``state``."""

    label: str
    pids: list[int]
    frames: list[Frame] = Field(default_factory=list)
    state: str = ""  #: a leaf's (its processes share it); "" for a branching node
    children: list[StackNode] = Field(default_factory=list)


class StackReport(BaseModel):
    """What ``tether stacks --json`` prints (and a view renders)."""

    run: str = ""
    processes: list[ProcessStack] = Field(default_factory=list)
    classes: list[StackClass] = Field(default_factory=list)
    tree: list[StackNode] = Field(default_factory=list)
    #: processes whose stacks could not be read, one class per reason
    unreadable: list[StackClass] = Field(default_factory=list)
    #: the nodes of a run that spans nodes whose stacks could not be read (``node 1: why``)
    missing: list[str] = Field(default_factory=list)


def compress_ranks(ranks: Iterable[int]) -> str:
    """``0-2,4-7`` for ranks 0, 1, 2, 4, 5, 6, 7 (each once, ascending)."""
    ordered = sorted(set(ranks))
    runs: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)


def ranks_text(ranks: Iterable[int]) -> str:
    """``rank 3``, ``ranks 0-2,4-7``: how tether names a set of ranks everywhere (the stacks'
    classes, the group's notes)."""
    numbers = set(ranks)
    return ("rank " if len(numbers) == 1 else "ranks ") + compress_ranks(numbers)


#: how many names a label lists before it counts the rest
_NAMES_SHOWN = 3
#: how :meth:`ProcessInfo.title <protocol_specs.session.processes.ProcessInfo.title>` names a
#: rank's worker process (``worker 2 of rank 0 (pid 4300)``)
_WORKER_OF = re.compile(r"worker(?: \d+)? of rank (\d+)\b")


def describe_set(processes: list[ProcessStack]) -> str:
    """``ranks 0-2,4-7``, ``rank 3``, ``ranks 0-1, main process (pid 10)``, ``ranks 0-3, 8
    workers of ranks 0-3`` (a rank's workers, DataLoader's say, counted once there are several),
    ``eval.py (pid 12), ... and 5 more``."""
    ranks = sorted({p.rank for p in processes if p.rank is not None})
    others = [p.name for p in processes if p.rank is None]
    owners = [int(m.group(1)) for name in others if (m := _WORKER_OF.match(name))]
    parts = [ranks_text(ranks)] if ranks else []
    if len(owners) > 1:
        others = [name for name in others if not _WORKER_OF.match(name)]
        parts.append(f"{len(owners)} workers of {ranks_text(owners)}")
    parts += others[:_NAMES_SHOWN]
    more = len(others) - _NAMES_SHOWN
    text = ", ".join(parts)
    return f"{text} and {more} more" if more > 0 else text


def _order(p: ProcessStack) -> tuple[int, int, int, int]:
    """Ranks first, by rank; then the others by node and pid."""
    return (0, p.rank, p.node, p.pid) if p.rank is not None else (1, 0, p.node, p.pid)


def merge(processes: Iterable[ProcessStack], run: str = "") -> StackReport:
    """The classes and the tree of ``processes`` (each pid of a node once; a later duplicate is
    dropped): those of every node of a run that spans nodes, merged by where they are as one
    node's are (a class's ``pids`` may then name one pid twice, on two nodes: ``processes`` says
    which node's).

    Every process is in exactly one class (of ``classes`` or ``unreadable``) and, if its stack
    was read, at exactly one leaf of ``tree``."""
    seen: dict[tuple[int, int], ProcessStack] = {}
    for p in processes:
        seen.setdefault((p.node, p.pid), p)
    procs = sorted(seen.values(), key=_order)
    readable = [p for p in procs if not p.error]
    groups: dict[tuple[Any, ...], list[ProcessStack]] = {}
    for p in readable:
        key = (tuple(f.same_place() for f in p.main_frames()), p.state_text())
        groups.setdefault(key, []).append(p)
    classes = [
        StackClass(
            label=describe_set(g),
            pids=[p.pid for p in g],
            state=g[0].state_text(),
            frames=g[0].main_frames(),
        )
        for g in groups.values()
    ]
    failed: dict[str, list[ProcessStack]] = {}
    for p in procs:
        if p.error:
            failed.setdefault(p.error, []).append(p)
    unreadable = [
        StackClass(label=describe_set(g), pids=[p.pid for p in g], state=g[0].state_text())
        for g in failed.values()
    ]
    return StackReport(
        run=run,
        processes=procs,
        classes=classes,
        tree=_branches(readable, 0),
        unreadable=unreadable,
    )


def _branches(procs: list[ProcessStack], depth: int) -> list[StackNode]:
    """The nodes below the first ``depth`` frames ``procs`` share: one leaf per state for those
    whose stack ends there, then one node per next frame (its run of shared frames merged)."""
    nodes: list[StackNode] = []
    ends: dict[str, list[ProcessStack]] = {}
    going: dict[tuple[str, int, str], list[ProcessStack]] = {}
    for p in procs:
        frames = p.main_frames()
        if len(frames) == depth:
            ends.setdefault(p.state_text(), []).append(p)
        else:
            going.setdefault(frames[depth].same_place(), []).append(p)
    for state, group in ends.items():
        nodes.append(StackNode(label=describe_set(group), pids=[p.pid for p in group], state=state))
    for group in going.values():
        first = group[0].main_frames()
        end = depth + 1
        while all(len(p.main_frames()) > end for p in group) and (
            len({p.main_frames()[end].same_place() for p in group}) == 1
        ):
            end += 1
        children = _branches(group, end)
        node = StackNode(
            label=describe_set(group), pids=[p.pid for p in group], frames=first[depth:end]
        )
        if len(children) == 1 and not children[0].frames:  # they all end here, in one state
            node.state = children[0].state
        else:
            node.children = children
        nodes.append(node)
    return nodes


def render_tree(report: StackReport) -> list[str]:
    """The text of ``tether stacks``: the tree, two spaces per level, a node's shared frames on
    its line (``ranks 0-3: launcher.py:20 main > rank.py:31 step``), a leaf's state in
    parentheses; then the processes whose stacks could not be read."""
    lines: list[str] = []

    def walk(node: StackNode, indent: str) -> None:
        state = f" ({node.state})" if node.state else ""
        where = " > ".join(f.text() for f in node.frames)
        if not node.frames:
            where = "(no Python frames)" if not indent else "(here)"
        lines.append(f"{indent}{node.label}{state}: {where}")
        for child in node.children:
            walk(child, indent + "  ")

    for node in report.tree:
        walk(node, "")
    lines += [c.text() for c in report.unreadable]
    return lines


def user_frames(raw: list[dict[str, Any]]) -> list[Frame]:
    """py-spy's frames of a thread (innermost first) as :class:`Frame` s, outermost first,
    without the debugger's: its runners below the user's first frame (debugpy's launch, tether's
    boot and launch scripts, ``runpy``), and from the first debugger frame above a user's frame
    on (pydevd's trace function and its wait while it holds the thread: ``threading``'s
    ``Condition.wait`` included); at most :data:`MAX_FRAMES` (the innermost)."""
    frames: list[Frame] = []
    for item in reversed(raw):
        path = str(item.get("filename") or "")
        name = str(item.get("short_filename") or path.rsplit("/", 1)[-1])
        # py-spy's short name keeps the packages a file is in (``worker_shim/inject/...`` when
        # tether runs from a source checkout): the script is known by its base name
        base = name.rsplit("/", 1)[-1]
        if any(part in path for part in _DEBUGGER_PATHS) or base.startswith(_TETHER_SCRIPTS):
            if frames:  # the debugger, called from the user's frame: all above it is its own
                break
            continue
        if not frames and base in _RUNNERS:
            continue
        line = item.get("line")
        frames.append(
            Frame(
                file=name,
                path=path,
                line=line if isinstance(line, int) else 0,
                function=str(item.get("name") or "?"),
            )
        )
    return frames[-MAX_FRAMES:]


def as_workdir(threads: list[ThreadStack], local: Iterable[str], workdir: str) -> list[ThreadStack]:
    """``threads`` with the paths under the worker's copy of the snapshot (``local``: its
    directory, as named and as resolved) shown under the user's ``workdir``, as the debugger's
    path mappings show them: the same file on two nodes (two directories) is the same place."""
    roots = [root.rstrip("/") + "/" for root in local if root]

    def mapped(frame: Frame) -> Frame:
        for root in roots:
            if frame.path.startswith(root):
                path = workdir.rstrip("/") + "/" + frame.path[len(root) :]
                return frame.model_copy(update={"path": path})
        return frame

    return [t.model_copy(update={"frames": [mapped(f) for f in t.frames]}) for t in threads]


def threads_from_pyspy(data: Any, pid: int) -> list[ThreadStack]:
    """The threads in ``py-spy dump --json``'s output that run user code (a thread with nothing
    but the debugger's frames is the debugger's own: left out); the main thread first."""
    threads = []
    for item in data if isinstance(data, list) else []:
        if not isinstance(item, dict):
            continue
        raw = item.get("frames")
        frames = user_frames(
            [f for f in raw if isinstance(f, dict)] if isinstance(raw, list) else []
        )
        if not frames:
            continue
        tid = item.get("os_thread_id")
        name = str(item.get("thread_name") or "")
        main = name == "MainThread" or tid == pid
        threads.append(
            ThreadStack(name=name, tid=tid if isinstance(tid, int) else 0, main=main, frames=frames)
        )
    threads.sort(key=lambda t: not t.main)
    return threads
