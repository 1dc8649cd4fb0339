"""Benchmark 6: a second submit after changing one file of a big tree, against ``rsync -a``.

tether: snapshot the tree (hash, manifest, trees), upload what the relay lacks, submit; the bytes
sent are every frame the client sent the relay (the questions about what it lacks, the blobs and
trees, the submit). rsync: ``rsync -a --stats`` of the same change between two local directories
(its quick check needs no hashing), its ``Total bytes sent``.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import trio

from adapter.snapshots.hash_cache import HashCache
from adapter.snapshots.snapshot import build_snapshot
from adapter.snapshots.snapshot_upload import submit_snapshot
from protocol_specs.runs.spec import RunSpec
from relay.client import Endpoint, open_control

from .common import timed


def make_tree(root: Path, files: int, total_mib: int) -> None:
    """``files`` files of random bytes, 200 a directory (100 directories at least), ``total_mib``
    MiB in all, last modified an hour ago (a working tree is mostly old files)."""
    size = total_mib * 1024 * 1024 // files
    rng = random.Random(6)
    hour_ago = time.time() - 3600
    dirs = max(100, files // 200)
    for i in range(files):
        d = root / f"pkg{i % dirs:02d}"
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"f{i:05d}.bin"
        path.write_bytes(rng.randbytes(size))
        os.utime(path, (hour_ago, hour_ago))


async def submit(relay: Endpoint, root: Path, cache_dir: Path) -> dict[str, Any]:
    """What `tether run` does: snapshot (with its digest cache), upload, submit."""

    async def once() -> dict[str, Any]:
        cache = HashCache.for_tree(cache_dir, root)
        snapshot = await trio.to_thread.run_sync(
            lambda: build_snapshot(root, cache=cache, save=False)
        )
        async with trio.open_nursery() as nursery, open_control(relay, client="bench") as control:
            nursery.start_soon(trio.to_thread.run_sync, cache.save)  # as `tether run` does
            spec = RunSpec(command=["python", "-c", "pass"], workdir=str(root), name="snapshot")
            _record, uploaded = await submit_snapshot(control, spec, snapshot)
            sent = control.bytes_sent
        return {
            "blob_bytes": uploaded.bytes,
            "bytes": sent,
            "blobs": uploaded.blobs,
            "trees": uploaded.trees,
        }

    ms, got = await timed(once())
    return {**got, "ms": ms}


def rsync(src: Path, dst: Path) -> dict[str, Any]:
    t0 = _now()
    done = subprocess.run(
        ["rsync", "-a", "--stats", f"{src}/", f"{dst}/"], capture_output=True, text=True, check=True
    )
    ms = (_now() - t0) * 1000
    sent = re.search(r"Total bytes sent: ([\d,.]+)", done.stdout)
    return {"ms": ms, "bytes": int(re.sub(r"[,.]", "", sent.group(1))) if sent else -1}


def _now() -> float:
    return time.perf_counter()


def change_one(root: Path, n: int) -> None:
    target = root / "pkg00" / "f00000.bin"
    data = bytearray(target.read_bytes())
    data[n % len(data)] ^= 0xFF
    target.write_bytes(bytes(data))


async def run(relay: Endpoint, tmp: Path, files: int, mib: int, rounds: int) -> dict[str, Any]:
    src, mirror = tmp / "tree", tmp / "mirror"
    await trio.to_thread.run_sync(make_tree, src, files, mib)
    cache = tmp / "hash-cache"
    first = await submit(relay, src, cache)
    have_rsync = shutil.which("rsync") is not None
    if have_rsync:
        await trio.to_thread.run_sync(rsync, src, mirror)
    results: dict[str, list[dict[str, Any]]] = {"tether": [], "rsync": []}
    for i in range(rounds):
        change_one(src, i)
        results["tether"].append(await submit(relay, src, cache))
        if have_rsync:
            results["rsync"].append(await trio.to_thread.run_sync(rsync, src, mirror))
    os.sync()
    await trio.to_thread.run_sync(shutil.rmtree, tmp)  # a big tree is many inodes
    return {
        "files": files,
        "mib": mib,
        "first": first,
        "rounds": results,
        "file_bytes": mib * 1024 * 1024 // files,
    }
