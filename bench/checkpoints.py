"""Benchmark 17: saving a checkpoint again after 1% of it changed, against rsync; restoring it.

A directory holds one big file of random bytes (a model's weights) and a few small ones. Save 1
sends it all (``relay/client/files.py``'s :func:`upload_dir` to the embedded relay). Then 1% of the
big file's bytes change in place, in a few contiguous regions (an optimizer step touching some
tensors), the small files are rewritten, and save 2 runs with the hash cache of save 1, as the
worker's next ``save_checkpoint`` would. Baseline: ``rsync -a --no-whole-file --stats`` of the same
change into a copy holding the first version (its delta algorithm, which it turns off between
local directories by default), both ends on this machine: its ``Total bytes sent`` and time.
Restore: a fresh client (a new worker: a new connection, no hash cache) downloads the second
checkpoint into an empty directory; the copy is checked byte for byte afterwards (not timed).
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import trio

from protocol_specs.checkpoints.files import CHUNK
from relay.client import Endpoint, open_control
from relay.client.files import HashCache, download, upload_dir

from .common import ms, verdict

#: how many contiguous regions the 1% change is cut into
REGIONS = 4
#: the small files beside the weights
SMALL = {"config.json": 2_000, "optimizer/meta.json": 600, "rng_state.pt": 15_000, "step": 8}


def make_checkpoint(root: Path, mib: int) -> None:
    """``model.bin`` of ``mib`` MiB of random bytes (written 64 MiB at a time), the small files."""
    rng = random.Random(17)
    (root / "optimizer").mkdir(parents=True)
    with open(root / "model.bin", "wb") as f:
        left = mib * 1024 * 1024
        while left:
            n = min(left, 64 * 1024 * 1024)
            f.write(rng.randbytes(n))
            left -= n
    for rel, size in SMALL.items():
        (root / rel).write_bytes(rng.randbytes(size))


def change_one_percent(root: Path) -> int:
    """1% of ``model.bin`` rewritten in place in :data:`REGIONS` regions, the small files
    rewritten; returns the bytes of the big file changed."""
    rng = random.Random(1717)
    path = root / "model.bin"
    size = path.stat().st_size
    region = size // 100 // REGIONS
    stride = size // REGIONS
    with open(path, "r+b") as f:
        for i in range(REGIONS):
            f.seek(i * stride + rng.randrange(stride - region))
            f.write(rng.randbytes(region))
    for rel, n in SMALL.items():
        (root / rel).write_bytes(rng.randbytes(n))
    return region * REGIONS


async def save(relay: Endpoint, root: Path, cache: HashCache) -> dict[str, Any]:
    t0 = trio.current_time()
    async with open_control(relay, client="bench") as control:
        sent = await upload_dir(control, root, cache=cache)
        frames = control.bytes_sent
    return {
        "ms": (trio.current_time() - t0) * 1000,
        "sent": sent.sent,
        "frames": frames,
        "hashed": sent.hashed,
        "size": sent.files.size,
        "files": sent.files,
    }


def rsync(src: Path, dst: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    done = subprocess.run(
        ["rsync", "-a", "--no-whole-file", "--stats", f"{src}/", f"{dst}/"],
        capture_output=True,
        text=True,
        check=True,
    )
    took = (time.perf_counter() - t0) * 1000
    sent = re.search(r"Total bytes sent: ([\d,.]+)", done.stdout)
    return {"ms": took, "bytes": int(re.sub(r"[,.]", "", sent.group(1))) if sent else -1}


def _digests(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
        out[str(path.relative_to(root))] = h.hexdigest()
    return out


async def run(relay: Endpoint, tmp: Path, mib: int) -> dict[str, Any]:
    src, mirror, restored = tmp / "ckpt", tmp / "ckpt-rsync", tmp / "ckpt-restored"
    await trio.to_thread.run_sync(make_checkpoint, src, mib)
    cache = HashCache(tmp / "ckpt-hashes")
    first = await save(relay, src, cache)
    have_rsync = shutil.which("rsync") is not None
    if have_rsync:
        await trio.to_thread.run_sync(rsync, src, mirror)  # the first version, on the other end
    changed = await trio.to_thread.run_sync(change_one_percent, src)
    second = await save(relay, src, cache)
    baseline = await trio.to_thread.run_sync(rsync, src, mirror) if have_rsync else None
    t0 = trio.current_time()
    async with open_control(relay, client="bench-restore") as control:  # a fresh worker
        written = await download(control, second["files"].files, restored)
    restore_ms = (trio.current_time() - t0) * 1000
    identical = await trio.to_thread.run_sync(_digests, restored) == await trio.to_thread.run_sync(
        _digests, src
    )
    os.sync()
    await trio.to_thread.run_sync(shutil.rmtree, tmp)
    for one in (first, second):
        del one["files"]
    return {
        "mib": mib,
        "changed": changed,
        "first": first,
        "second": second,
        "rsync": baseline,
        "restore": {"ms": restore_ms, "bytes": written, "identical": identical},
    }


def section(f: dict[str, Any], _n: dict[str, int]) -> list[str]:
    """Section 17 of ``bench/report.md``."""
    first, second, r, back = f["first"], f["second"], f.get("rsync"), f["restore"]
    size = second["size"]
    mib = lambda n: f"{n / 2**20:,.1f} MiB"  # noqa: E731
    s = lambda x: f"{x / 1000:.2f} s"  # noqa: E731
    rows = [
        "## 17. Checkpoints: a second save with 1% changed, against rsync; a restore",
        "",
        f"A checkpoint of {mib(size)}: `model.bin` ({f['mib']} MiB of random bytes) and "
        f"{len(SMALL)} small files. Save 1 sends it all. Then {mib(f['changed'])} of "
        f"`model.bin` (1%) change in place, in {REGIONS} contiguous regions, and the small files "
        "are rewritten; save 2 uses save 1's hash cache (the worker's next `save_checkpoint`): "
        "it hashes the files whose stat changed, asks the relay which 1 MiB chunks it lacks and "
        "uploads those. Baseline: `rsync -a --no-whole-file --stats` of the same change into a "
        "copy of the first version, both ends on this machine (no network between them: its "
        "time holds no transfer); its `Total bytes sent`. tether's bytes: the chunks and the set blob "
        "uploaded (all frames in parentheses). Restore: a fresh client (a new worker: new "
        "connection, no cache) downloads the second checkpoint into an empty directory, every "
        "chunk checked against its digest.",
        "",
        "| | bytes sent | of the checkpoint | hashed | wall |",
        "|---|---|---|---|---|",
        f"| tether, save 1 | {mib(first['sent'])} ({mib(first['frames'])}) "
        f"| {first['sent'] / size:.1%} | {mib(first['hashed'])} | {s(first['ms'])} |",
        f"| tether, save 2 | {mib(second['sent'])} ({mib(second['frames'])}) "
        f"| {second['sent'] / size:.2%} | {mib(second['hashed'])} | {s(second['ms'])} |",
    ]
    if r:
        rows.append(
            f"| rsync --no-whole-file, save 2 | {mib(r['bytes'])} | {r['bytes'] / size:.2%} "
            f"| {mib(size)} (both ends) | {s(r['ms'])} |"
        )
    rows += [
        "",
        f"Restore on a fresh worker: {mib(back['bytes'])} in {s(back['ms'])} "
        f"({back['bytes'] / 2**20 / max(back['ms'] / 1000, 1e-9):,.0f} MiB/s), byte-identical: "
        f"{verdict(back['identical'])}.",
        "",
    ]
    if r:
        region = f["changed"] // REGIONS
        touched = REGIONS * (-(-region // CHUNK) + 1) * CHUNK  # the chunks the regions can touch
        small = second["frames"] <= touched + CHUNK
        rows += [
            f"Save 2 sends about the change (all frames within the {mib(touched)} of chunks the "
            f"{REGIONS} regions can touch + 1 MiB): {verdict(small)}; {second['frames'] / max(r['bytes'], 1):.2f} x rsync's "
            f"bytes, {second['ms'] / max(r['ms'], 1e-9):.2f} x its time "
            f"({ms(second['ms'])} against {ms(r['ms'])}).",
            "",
        ]
    return rows
