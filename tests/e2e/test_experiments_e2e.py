"""Experiments end to end, with real processes: a run's metrics from ``tether.report`` (in a
Python environment of the user's that has no tether installed) and from its output lines, read back
with ``tether metrics`` and ``tether ls``; sweeps on the local pool (random, grid, ASHA) driven by
the relay, read back with ``tether sweep status``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from node_harness import open_vscode_session, scenario
from stack import relay_stack, status_saying, tether, worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TRAIN = """\
import math, sys
import tether

lr = float(sys.argv[1])
for step in range(50):
    loss = math.exp(-lr * step)
    tether.report(step=step, loss=loss)
    if step % 10 == 0:
        print(f"epoch {step // 10} val_loss={loss * 1.5:.6f}", flush=True)
print("done", tether.params(), tether.should_stop(), flush=True)
"""


def bare_venv(where: Path) -> Path:
    """A Python environment with the standard library only (as a user's may be: no tether)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import tether"], capture_output=True, cwd=where)
    assert probe.returncode != 0, "the bare venv sees tether: the test would prove nothing"
    return python


async def run_cli(home: Path, *args: str) -> str:
    async with tether(*args, home=home, name=args[0]) as proc:
        with trio.fail_after(60):
            code = await proc.process.wait()
            while not proc.eof:  # all it printed
                await proc._changed.wait()
    assert code == 0, proc.output
    return proc.output


async def test_a_run_reports_metrics_by_the_api_and_by_its_output_lines(tmp_path: Path) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "train.py").write_text(TRAIN)
    python = bare_venv(tmp_path / "venv")
    home = tmp_path / "home"
    # a venv of the user's own, made under pytest's tmp_path (root's only): run as its user
    async with relay_stack(home, workers=1, isolated=False):
        out = await run_cli(
            home, "run", "--workdir", str(workdir), "-f",
            "--metric", r"epoch (?P<step>\d+) val_loss=(?P<val_loss>[\d.e+-]+)",
            "--", str(python), "train.py", "0.1",
        )  # fmt: skip
        assert "done {} False" in out
        listed = await run_cli(home, "ls", "--json")
        record = json.loads(listed[listed.index("[") :])[0]
        points = [
            json.loads(line)
            for line in (await run_cli(home, "metrics", record["id"], "--json")).splitlines()
            if line.startswith("{")
        ]
        losses = [p for p in points if "loss" in p]
        # every report exactly once, in order
        assert [p["step"] for p in losses] == list(range(50))
        assert losses[-1]["loss"] == pytest.approx(2.718281828 ** (-4.9))
        epochs = [(p["step"], p["val_loss"]) for p in points if "val_loss" in p]
        assert [step for step, _ in epochs] == [0, 1, 2, 3, 4]
        assert epochs[0][1] == pytest.approx(1.5)
        assert record["metrics"]["loss"] == pytest.approx(losses[-1]["loss"])
        table = await run_cli(home, "ls")
        assert "METRICS" in table and "loss 0.007447" in table, table
        text = await run_cli(home, "metrics", record["id"])
        assert "step 49  loss 0.007447" in text


# --- sweeps ----------------------------------------------------------------------------------------

#: a trial: loss falls faster with a larger lr, and bs shifts it; ``--slow`` sleeps between steps
#: (so that early stopping has time to act) and stops when told
SWEEP_TRAIN = """\
import math, sys, time
import tether

lr, bs, steps, pause = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
for step in range(steps):
    tether.report(step=step, loss=math.exp(-lr * 100 * step) + bs / 1000)
    if tether.should_stop():
        print("stopping at", step, flush=True)
        break
    time.sleep(pause)
print("params", tether.params(), "trial", tether.trial(), flush=True)
"""


async def sweep_status(home: Path, sweep: str) -> dict[str, Any]:
    out = await run_cli(home, "sweep", "status", sweep, "--json")
    return json.loads(out[out.index("{") :])  # type: ignore[no-any-return]


async def finished_sweep(home: Path, sweep: str, *, timeout: float = 120) -> dict[str, Any]:
    """The sweep's status once it ended (asked again after each answer: no event says so)."""
    with trio.fail_after(timeout):
        while True:
            info = await sweep_status(home, sweep)
            if info["sweep"]["state"] != "running":
                return info


async def start_sweep(home: Path, workdir: Path, *args: str) -> str:
    out = await run_cli(home, "sweep", "--workdir", str(workdir), *args)
    return out.strip().splitlines()[-1]


async def points_of_run(home: Path, run_id: str) -> list[dict[str, Any]]:
    out = await run_cli(home, "metrics", run_id, "--json")
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def sweep_project(tmp_path: Path) -> Path:
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "train.py").write_text(SWEEP_TRAIN)
    return workdir


async def test_a_random_sweep_runs_every_trial_three_at_a_time_and_names_the_best(
    tmp_path: Path,
) -> None:
    workdir = sweep_project(tmp_path)
    home = tmp_path / "home"
    async with relay_stack(home, workers=4):
        sweep = await start_sweep(
            home, workdir, "--param", "lr=log:1e-4:1e-1", "--param", "bs=16,32",
            "--trials", "12", "--parallel", "3", "--objective", "loss:min",
            "--", "python", "train.py", "{lr}", "{bs}", "5", "0.2",
        )  # fmt: skip
        info = await finished_sweep(home, sweep)
        trials = info["trials"]
        assert info["sweep"]["state"] == "finished"
        assert [t["n"] for t in trials] == list(range(12))
        assert {t["state"] for t in trials} == {"complete"}
        for trial in trials:  # each trial's value is its run's last loss, all 5 steps in
            points = await points_of_run(home, trial["run"])
            assert [p["step"] for p in points] == [0, 1, 2, 3, 4]
            assert trial["value"] == pytest.approx(points[-1]["loss"])
            assert 1e-4 <= trial["params"]["lr"] <= 1e-1 and trial["params"]["bs"] in (16, 32)
        best = min(trials, key=lambda t: t["value"])
        assert info["sweep"]["best"] == best["n"]
        text = await run_cli(home, "sweep", "status", sweep)
        assert f"best       trial {best['n']} (run {best['run']})" in text
        # never more than 3 at once: the runs' attempts, start to end
        listed = await run_cli(home, "ls", "--json", "-n", "20")
        runs = [r for r in json.loads(listed[listed.index("[") :]) if r["trial"]]
        assert len(runs) == 12 and all(r["state"] == "succeeded" for r in runs)
        spans = [(r["attempts"][0]["claimed_at"], r["attempts"][0]["ended_at"]) for r in runs]
        for start, _end in spans:
            assert sum(1 for s, e in spans if s <= start < e) <= 3
        assert runs[0]["spec"]["env"]["TETHER_SWEEP"] == sweep


async def test_a_grid_sweep_runs_each_combination_once(tmp_path: Path) -> None:
    workdir = sweep_project(tmp_path)
    (workdir / "sweep.yaml").write_text(
        "command: python train.py {lr} {bs} 3 0\n"
        "params:\n  lr: [0.001, 0.01]\n  bs: [16, 32, 64]\n"
        "search: grid\ntrials: 100\nparallel: 2\nobjective: loss:min\n"
    )
    home = tmp_path / "home"
    async with relay_stack(home, workers=2):
        sweep = await start_sweep(home, workdir, "--file", str(workdir / "sweep.yaml"))
        info = await finished_sweep(home, sweep)
        combos = sorted((t["params"]["lr"], t["params"]["bs"]) for t in info["trials"])
        assert combos == [(lr, bs) for lr in (0.001, 0.01) for bs in (16, 32, 64)]
        assert {t["state"] for t in info["trials"]} == {"complete"}
        best = info["trials"][info["sweep"]["best"]]
        assert (best["params"]["lr"], best["params"]["bs"]) == (0.01, 16)


async def test_asha_stops_the_worst_trials_early(tmp_path: Path) -> None:
    workdir = sweep_project(tmp_path)
    home = tmp_path / "home"
    async with relay_stack(home, workers=3):
        sweep = await start_sweep(
            home, workdir, "--param", "lr=log:1e-4:1e-1", "--param", "bs=16",
            "--trials", "9", "--parallel", "3", "--objective", "loss:min",
            "--early-stop", "asha", "--seed", "3",
            "--", "python", "train.py", "{lr}", "{bs}", "20", "0.25",
        )  # fmt: skip
        info = await finished_sweep(home, sweep, timeout=170)
        trials = info["trials"]
        pruned = [t for t in trials if t["state"] == "pruned"]
        complete = [t for t in trials if t["state"] == "complete"]
        assert pruned and complete, [(t["n"], t["state"]) for t in trials]
        curves = {t["n"]: {p["step"]: p["loss"] for p in await points_of_run(home, t["run"])}
                  for t in trials}  # fmt: skip
        best = info["sweep"]["best"]
        for trial in pruned:
            curve = curves[trial["n"]]
            assert max(curve) < 19, "a pruned trial ran to the end"
            # it lagged: the best trial's loss was lower at every step it reported but the first
            # (the curves never cross: the loss falls faster with a larger lr)
            assert all(curves[best][step] < loss for step, loss in curve.items() if step), trial
        assert best is not None and trials[best]["state"] == "complete"
        assert max(curves[best]) == 19


async def test_a_relay_restart_in_the_middle_of_a_sweep_loses_no_trial_or_metric(
    tmp_path: Path,
) -> None:
    """``tether up`` (relay and store) killed with SIGKILL while trials run and report, then
    started again on its data: the workers reconnect, the sweep is driven on, every trial and
    every point is there once."""
    workdir = sweep_project(tmp_path)
    home = tmp_path / "home"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    up_args = ("up", "--data-dir", str(home / "data"), "--workers", "0", "--relay-port", port)
    async with tether(*up_args, home=home, name="up") as up:
        relay = (await up.wait_line(r"tether up: ready relay=(\S+)")).group(1)
        async with worker(home, relay, slots=2) as pool:
            sweep = await start_sweep(
                home, workdir, "--param", "lr=log:1e-3:1e-1", "--param", "bs=16,32",
                "--trials", "5", "--parallel", "2", "--objective", "loss:min",
                "--", "python", "train.py", "{lr}", "{bs}", "12", "0.5",
            )  # fmt: skip
            with trio.fail_after(60):  # a trial is under way, its first points stored
                # asked again after each answer: the pool prints nothing when a point is stored
                while True:
                    info = await sweep_status(home, sweep)
                    assert info["sweep"]["state"] == "running", "the sweep ended before the kill"
                    if any(t["values"] and not t["ended"] for t in info["trials"]):
                        break
            os.killpg(up.process.pid, signal.SIGKILL)
            await up.process.wait()
            async with tether(*up_args, home=home, name="up again") as again:
                await again.wait_line(r"tether up: ready")
                info = await finished_sweep(home, sweep, timeout=150)
                assert [t["state"] for t in info["trials"]] == ["complete"] * 5, info["trials"]
                for trial in info["trials"]:
                    points = await points_of_run(home, trial["run"])
                    assert [p["step"] for p in points] == list(range(12)), trial["n"]
                    assert [s for s, _ in trial["values"]] == list(range(12))
                await pool.wait_line(r"relay link up", timeout=5)


#: a trial whose weights blow up with a large lr: its loss goes NaN at some step
DIVERGE = """\
import sys, time
import tether

lr, steps = float(sys.argv[1]), int(sys.argv[2])
weight = 1.0
for step in range(steps):
    weight *= 1 + lr
    loss = weight if weight < 50 else float("nan")
    tether.report(step=step, loss=loss)
    time.sleep(0.1)  # line 10: where the trial that met the condition is paused
print("done", flush=True)
"""
PAUSED_LINE = 10


def diverge_project(tmp_path: Path) -> Path:
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "diverge.py").write_text(DIVERGE)
    return workdir


async def test_debug_when_pauses_exactly_one_trial_and_an_ide_inspects_it(tmp_path: Path) -> None:
    workdir = diverge_project(tmp_path)
    home = tmp_path / "home"
    async with relay_stack(home, workers=2) as (_up, relay):
        # three of the five go NaN (lr 0.5 at step 9, 1 at step 5, 2 at step 3); two never do
        sweep = await start_sweep(
            home, workdir, "--param", "lr=0.01,0.02,0.5,1,2", "--search", "grid",
            "--parallel", "2", "--objective", "loss:min", "--debug-when", "loss != loss",
            "--", "python", "diverge.py", "{lr}", "20",
        )  # fmt: skip
        with trio.fail_after(120):  # the others go on to their ends while one waits
            while True:
                info = await sweep_status(home, sweep)
                paused = info["sweep"]["debugged_run"]
                others = [t for t in info["trials"] if t["run"] != paused]
                if paused and len(others) == 4 and all(t["ended"] for t in others):
                    break
        [trial] = [t for t in info["trials"] if t["run"] == paused]
        assert not trial["ended"] and trial["params"]["lr"] in (0.5, 1, 2)
        assert f"paused at step {len(trial['values']) - 1}: loss=nan" in info["sweep"]["debugged"]
        status = await status_saying(home, paused, "paused at")
        assert f"diverge.py:{PAUSED_LINE} in <module>" in status
        for other in others:  # nobody else paused, NaN or not
            logs = await run_cli(home, "logs", other["run"])
            assert "no IDE is attached" not in logs and "done" in logs, other
        nan_others = [t for t in others if t["params"]["lr"] >= 0.5]
        assert {t["state"] for t in nan_others} == {"failed"}
        async with tether(
            "attach", paused, "--relay", relay, "--port", "0", home=home, name="attach"
        ) as attach:
            port = int((await attach.wait_line(r"adapter on 127\.0\.0\.1:(\d+)")).group(1))
            steps = [
                {"op": "wait_stopped", "line": PAUSED_LINE, "label": "stopped"},
                {"op": "variables", "scope": "Globals", "label": "globals"},
                {"op": "continue"},
                {"op": "wait_terminated", "label": "ended"},
            ]
            spec = scenario(port, workdir, steps, timeout_ms=60_000)
            async with open_vscode_session(spec, timeout=120) as session:
                result, _messages = await session.result()
        labels = dict(result["labels"])
        values = labels["globals"]["values"]
        assert values["loss"] == "nan" and float(values["weight"]) >= 50
        assert int(values["step"]) == len(trial["values"]) - 1
        final = await finished_sweep(home, sweep)
        assert final["sweep"]["state"] == "finished"
        assert sorted(t["state"] for t in final["trials"]) == [
            "complete", "complete", "failed", "failed", "failed",
        ]  # fmt: skip


def program_states(marker: str) -> list[str]:
    """The states (``/proc/PID/stat``: ``S`` sleeping, ``T`` stopped...) of the processes whose
    command line holds ``marker``."""
    states = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if marker in cmdline and "tether" not in cmdline.split()[0]:
            states.append(stat.rsplit(")", 1)[1].split()[0])
    return states


async def test_debug_others_pause_holds_the_other_trials_until_the_paused_one_goes_on(
    tmp_path: Path,
) -> None:
    workdir = diverge_project(tmp_path)
    home = tmp_path / "home"
    async with relay_stack(home, workers=2) as (_up, relay):
        sweep = await start_sweep(
            home, workdir, "--param", "lr=2,0.01", "--search", "grid", "--parallel", "2",
            "--debug-when", "loss != loss", "--debug-others", "pause",
            "--", "python", "diverge.py", "{lr}", "80",
        )  # fmt: skip
        with trio.fail_after(60):
            while True:
                info = await sweep_status(home, sweep)
                held = [t for t in info["trials"] if t["suspended"]]
                if held:
                    break
        [steady] = held
        assert steady["params"]["lr"] == 0.01 and info["sweep"]["debugged_run"] != steady["run"]
        with trio.fail_after(10):  # its program is stopped (SIGSTOP): state T
            while "T" not in program_states("diverge.py 0.01"):  # noqa: ASYNC110 (polls /proc)
                await trio.sleep(0.05)
        async with tether(
            "attach", info["sweep"]["debugged_run"], "--relay", relay, "--port", "0",
            home=home, name="attach",
        ) as attach:  # fmt: skip
            port = int((await attach.wait_line(r"adapter on 127\.0\.0\.1:(\d+)")).group(1))
            steps = [
                {"op": "wait_stopped", "line": PAUSED_LINE},
                {"op": "continue"},
                {"op": "wait_terminated"},
            ]
            async with open_vscode_session(scenario(port, workdir, steps), timeout=120) as s:
                await s.result()
        final = await finished_sweep(home, sweep)
        [steady] = [t for t in final["trials"] if t["run"] == steady["run"]]
        assert not steady["suspended"] and steady["state"] == "complete"
        points = await points_of_run(home, steady["run"])
        assert [p["step"] for p in points] == list(range(80))  # held, then let go: all of it
