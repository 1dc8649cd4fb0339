"""``tether outputs RUN`` and ``tether cp RUN:PATH [LOCAL]``: a run's outputs (``--outputs``),
listed and fetched from the relay, so while the run is live and after its worker is gone alike.

``cp`` reads as ``scp -r`` does: ``RUN:out/a.bin .`` writes ``./a.bin``, ``RUN:out/a.bin
x.bin`` writes ``x.bin``, ``RUN:out .`` writes ``./out/...``, ``RUN: dir`` writes every output
under ``dir``. What to write where is decided by :func:`copy_plan` (no I/O); the engine
(``relay/client/files.py``) writes each file atomically and checks every chunk's digest.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import trio

from protocol_specs.checkpoints.files import FileSet, StoredFile
from relay.client import open_control

from .errors import control_call
from .settings import resolve_relay

__all__ = ["cmd_cp", "cmd_outputs", "copy_plan", "outputs_table", "split_source"]

#: how many of the outputs' paths a refusal names
_NAMED = 8


async def cmd_outputs(args: argparse.Namespace) -> int:
    """List the run's outputs: path, size, the attempt that stored it, when it was modified."""
    relay = resolve_relay(args.relay, args)
    async with open_control(relay, client="tether-cli") as control:
        run_id = (await control_call(control.get_run(args.run))).id
        files = (await control_call(control.outputs(run_id))).files
    if args.json:
        rows = [
            {"path": f.path, "size": f.size, "mode": f.mode, "attempt": f.attempt, "mtime": f.mtime}
            for f in files.files
        ]
        print(json.dumps({"run": run_id, "files": rows}))
    elif not files.files:
        print(f"-- tether: {_none(run_id)}")
    else:
        print(outputs_table(files))
    return 0


async def cmd_cp(args: argparse.Namespace) -> int:
    """Fetch ``RUN:PATH`` (a file, a directory of outputs, or ``RUN:`` for all) into LOCAL."""
    from relay.client import FilesError, download

    run, path = split_source(args.source)
    relay = resolve_relay(args.relay, args)
    local = Path(args.local)
    async with open_control(relay, client="tether-cli") as control:
        run_id = (await control_call(control.get_run(run))).id
        files = (await control_call(control.outputs(run_id))).files
        try:
            into = await trio.Path(local).is_dir() or args.local.endswith(("/", os.sep))
            dest, plan = copy_plan(run_id, files, path, local, into)
        except ValueError as exc:
            raise SystemExit(f"tether: {exc}") from None
        try:
            written = await control_call(download(control, plan, dest, run=run_id))
        except FilesError as exc:
            raise SystemExit(f"tether: cp {args.source}: {exc}") from None
    if not args.quiet:
        where = dest / plan[0].path if len(plan) == 1 else dest
        what = "1 file" if len(plan) == 1 else f"{len(plan)} files"
        print(f"-- tether: {what}, {written} bytes written -> {where}")
    return 0


def split_source(text: str) -> tuple[str, str]:
    """``RUN:PATH`` as ``(run, path)`` (``RUN:``: every output, path ``""``)."""
    run, colon, path = text.partition(":")
    if not colon or not run:
        raise SystemExit(
            f"tether: cp {text}: give RUN:PATH (a file or directory of the run's outputs), "
            "or RUN: for all of them"
        )
    return run, path.strip("/")


def copy_plan(
    run: str, files: FileSet, path: str, local: Path, local_is_dir: bool
) -> tuple[Path, list[StoredFile]]:
    """Where to write (a directory) and the files to write under it, each named by its path
    below that directory; ``ValueError`` naming what the outputs have if ``path`` is none of
    them."""
    chosen = files.under(path)
    if not chosen:
        if not files.files:
            raise ValueError(_none(run))
        have = ", ".join(f.path for f in files.files[:_NAMED])
        more = f" and {len(files.files) - _NAMED} more" if len(files.files) > _NAMED else ""
        raise ValueError(f"run {run}'s outputs have no {path} (they have: {have}{more})")
    single = len(chosen) == 1 and chosen[0].path == path
    if single and not local_is_dir:  # a file to a file name: LOCAL is the file
        return local.parent, [chosen[0].model_copy(update={"path": local.name})]
    # a file into a directory, or a directory (its last name kept, as cp -r does)
    parent = path.rpartition("/")[0]
    cut = len(parent) + 1 if parent else 0
    return local, [f.model_copy(update={"path": f.path[cut:]}) for f in chosen]


def outputs_table(files: FileSet) -> str:
    """PATH, SIZE, ATTEMPT, MODIFIED: one output a line."""
    rows = [("PATH", "SIZE", "ATTEMPT", "MODIFIED")]
    for f in files.files:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(f.mtime)) if f.mtime else "-"
        rows.append((f.path, str(f.size), str(f.attempt or "-"), when))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(
        f"{p:<{widths[0]}}  {s:>{widths[1]}}  {a:>{widths[2]}}  {m}" for p, s, a, m in rows
    )


def _none(run: str) -> str:
    return (
        f"run {run} has no outputs (yet): name them when submitting with --outputs GLOB "
        "(or the config key outputs); the worker sends them after each attempt and checkpoint"
    )
