"""A run's outputs back home: a real relay on a real Redis-compatible server, a real worker pool
running a real program, the CLI's ``tether outputs`` and ``tether cp`` reading from the relay,
while the pool runs and after it was stopped.

The program writes ``out/a.bin`` (3 MiB and a bit: four chunks), ``preds.csv`` and ``notes.txt``
(outside the globs); its first attempt fails, its second writes the same ``out/a.bin`` and a new
``preds.csv``: the worker's uploads (spied on, the real function doing the work) send the whole
first time and only the changed file the second.
"""

from __future__ import annotations

import json
import os
import random
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
from live_relay import live_relay

from adapter.cli.parser import build_parser
from adapter.cli.submission import submit_run
from protocol_specs.runs.runs import RunRecord, RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.web.web import COOKIE
from relay.client import Endpoint, follow_logs, open_control
from relay.store import Store
from worker_shim import shim
from worker_shim.backends.pool import run_pool

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(180)]

PROGRAM = """\
import os, random, sys
marker = sys.argv[1]
again = os.path.exists(marker)
os.makedirs("out", exist_ok=True)
random.seed(7)
with open("out/a.bin", "wb") as f:
    f.write(random.randbytes(3 * 1024 * 1024 + 12345))
os.chmod("out/a.bin", 0o640)
with open("preds.csv", "w") as f:
    f.write("id,pred\\n" + "".join(f"{i},{i * (3 if again else 2)}\\n" for i in range(500)))
with open("notes.txt", "w") as f:
    f.write("not an output\\n")
if not again:
    open(marker, "w").close()
    sys.exit(1)
"""


async def _cli(*words: str) -> int:
    args = build_parser().parse_args(list(words))
    code: int = await args.fn(args)
    return code


async def _web(url: str, token: str, run: str) -> dict[str, httpx.Response]:
    """What a browser logged in with ``token`` gets of the run's page and its outputs."""
    base = url.replace("ws://", "http://")
    origin = {"Origin": base, "Sec-Fetch-Site": "same-origin"}
    async with httpx.AsyncClient(base_url=base) as client:
        login = await client.post(
            "/ui/login", headers={**origin, "Authorization": f"Bearer {token}"}
        )
        assert login.status_code == 200, login.text
        cookie = {**origin, "Cookie": f"{COOKIE}={login.cookies[COOKIE]}"}
        return {
            what: await client.get(path, headers=cookie)
            for what, path in [
                ("page", f"/ui/runs/{run}"),
                ("a.bin", f"/ui/runs/{run}/outputs/out/a.bin"),
                ("none", f"/ui/runs/{run}/outputs/notes.txt"),
            ]
        }


async def _ended(user: Endpoint, run_id: str) -> RunRecord:
    with trio.fail_after(90):
        await follow_logs(user, run_id, lambda _entry: None)
    async with open_control(user) as control:
        return await control.get_run(run_id)


async def test_outputs_come_home_and_only_what_changed_is_sent_again(
    redis_store: Store,
    tmp_path: Path,
    shared_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TETHER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TETHER_CONFIG", str(tmp_path / "none.toml"))
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "train.py").write_text(PROGRAM)
    spec = RunSpec(
        command=["python", "train.py", str(shared_tmp / "attempted")], workdir=str(workdir),
        debug=False, debuggable=False, max_retries=1, retry_backoff=0,
        outputs=["out/", "*.csv"],
    )  # fmt: skip
    sent: list[tuple[int, int | None]] = []
    real = shim.send_outputs

    async def spy(link, record, run_dir, **kw):  # type: ignore[no-untyped-def]
        got = await real(link, record, run_dir, **kw)
        sent.append((record.attempt, got))
        return got

    monkeypatch.setattr(shim, "send_outputs", spy)
    async with live_relay(redis_store) as relay:
        monkeypatch.setenv("TETHER_TOKEN", relay.alice.token)
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as pool_scope:
                pool = partial(run_pool, relay.pool, slots=1, work_dir=tmp_path / "pool", gpus=[])
                nursery.start_soon(pool)
                record = await submit_run(relay.alice, spec, lambda _text: None)
                done = await _ended(relay.alice, record.id)
                assert done.state is RunState.SUCCEEDED, done
                assert [a.n for a in done.attempts] == [1, 2]
                capsys.readouterr()
                assert await _cli("outputs", record.id, "--relay", relay.url, "--json") == 0
                listed = json.loads(capsys.readouterr().out)
                live = tmp_path / "live"
                assert await _cli("cp", f"{record.id}:", str(live), "--relay", relay.url) == 0
                pool_scope.cancel()  # the pool and its worker are gone from here on
            gone = tmp_path / "gone"
            assert await _cli("cp", f"{record.id}:out", str(gone), "--relay", relay.url) == 0
            assert await _cli("cp", f"{record.id}:preds.csv", str(tmp_path / "p.csv"),
                              "--relay", relay.url) == 0  # fmt: skip
            with pytest.raises(SystemExit, match=r"have no model\.pt \(they have: out/a\.bin, "):
                await _cli("cp", f"{record.id}:model.pt", str(tmp_path), "--relay", relay.url)
            web = await _web(relay.url, relay.alice.token, record.id)
            bobs = await _web(relay.url, relay.bob.token, record.id)
            nursery.cancel_scope.cancel()
        async with open_control(relay.alice) as control:
            final = await control.get_run(record.id)

    a_bin = random.Random(7).randbytes(3 * 1024 * 1024 + 12345)  # what the program wrote
    preds = ("id,pred\n" + "".join(f"{i},{i * 3}\n" for i in range(500))).encode()
    assert (tmp_path / "live" / "out" / "a.bin").read_bytes() == a_bin
    assert (tmp_path / "live" / "preds.csv").read_bytes() == preds
    assert [(f["path"], f["size"], f["attempt"]) for f in listed["files"]] == [
        ("out/a.bin", len(a_bin), 2),
        ("preds.csv", len(preds), 2),
    ]
    assert not (tmp_path / "live" / "notes.txt").exists()
    assert os.stat(tmp_path / "live" / "out" / "a.bin").st_mode & 0o777 == 0o640
    assert (tmp_path / "gone" / "out" / "a.bin").read_bytes() == a_bin
    assert (tmp_path / "p.csv").read_bytes() == preds
    # the web view: the page lists them, a link downloads one, for its owner only
    assert f'href="/ui/runs/{record.id}/outputs/out/a.bin" download>' in web["page"].text
    assert f'href="/ui/runs/{record.id}/outputs/preds.csv" download>' in web["page"].text
    assert web["a.bin"].status_code == 200 and web["a.bin"].content == a_bin
    assert "attachment" in web["a.bin"].headers["content-disposition"]
    assert web["none"].status_code == 404 and "has no output notes.txt" in web["none"].text
    assert all(got.status_code == 404 for got in bobs.values())
    assert (final.outputs, final.outputs_bytes) == (2, len(a_bin) + len(preds))
    # the first attempt sent everything; the second only preds.csv (and its set's blob)
    by_attempt = dict(sent)
    assert by_attempt[1] is not None and by_attempt[1] >= len(a_bin)
    assert by_attempt[2] is not None and len(preds) <= by_attempt[2] < len(preds) + 64 * 1024


SAVES = """\
import time
import tether

with open("preds.csv", "w") as f:
    f.write("id,pred\\n0,1\\n")
(tether.checkpoint_dir() / "state").write_text("step 5")
tether.save_checkpoint(5)
print("saved", flush=True)
time.sleep(3600)
"""


async def test_a_checkpoint_sends_the_outputs_while_the_run_is_live_and_a_cancel_too(
    redis_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """After a stored checkpoint the worker sends the outputs (the program still runs: ``tether
    outputs`` lists them); a cancelled run's program is ended, and its outputs sent again."""
    from worker_shim.program import outputs as program_outputs

    monkeypatch.setenv("TETHER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TETHER_CONFIG", str(tmp_path / "none.toml"))
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "train.py").write_text(SAVES)
    spec = RunSpec(command=["python", "train.py"], workdir=str(workdir), debug=False,
                   debuggable=False, outputs=["*.csv"])  # fmt: skip
    whys: list[str] = []
    checkpointed, exited = trio.Event(), trio.Event()
    real = program_outputs.send_outputs

    async def spy(link, record, run_dir, **kw):  # type: ignore[no-untyped-def]
        got = await real(link, record, run_dir, **kw)
        whys.append(kw.get("why", "exit"))
        if got is not None:
            (checkpointed if kw.get("why") == "checkpoint" else exited).set()
        return got

    monkeypatch.setattr(program_outputs, "send_outputs", spy)  # the checkpoint hook's
    monkeypatch.setattr(shim, "send_outputs", spy)  # the attempt's end
    async with live_relay(redis_store) as relay, trio.open_nursery() as nursery:
        monkeypatch.setenv("TETHER_TOKEN", relay.alice.token)
        nursery.start_soon(partial(run_pool, relay.pool, slots=1, work_dir=tmp_path / "pool"))
        record = await submit_run(relay.alice, spec, lambda _text: None)
        with trio.fail_after(60):
            await checkpointed.wait()
        capsys.readouterr()
        assert await _cli("outputs", record.id, "--relay", relay.url) == 0
        listing = capsys.readouterr().out.splitlines()
        async with open_control(relay.alice) as control:
            assert (await control.get_run(record.id)).state is RunState.RUNNING
            await control.cancel(record.id)
        done = await _ended(relay.alice, record.id)
        with trio.fail_after(30):  # the worker ends the program, then sends what it left
            await exited.wait()
        async with open_control(relay.alice) as control:
            files = (await control.outputs(record.id)).files
        nursery.cancel_scope.cancel()
    assert [f.path for f in files.files] == ["preds.csv"]
    assert listing[0].split() == ["PATH", "SIZE", "ATTEMPT", "MODIFIED"]
    assert listing[1].split()[:3] == ["preds.csv", "12", "1"]
    assert done.state is RunState.CANCELLED
    assert whys == ["checkpoint", "exit"]
