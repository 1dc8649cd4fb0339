"""Issue 42, item 3: in a debug run every ``torch.distributed`` process group gets a long timeout
from its creation (``worker_shim/inject/_tether_collectives.py``), because a collective keeps the
timeout it started with. The pure parts, a fake ``distributed_c10d``, and the import hook in a real
interpreter with a stand-in ``torch`` package; real PyTorch is ``test_pytorch_pause_e2e.py``'s."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from protocol_specs.session.processes import COLLECTIVE_TIMEOUT_ENV, COLLECTIVE_TIMEOUT_FLOOR
from worker_shim.inject import SCRIPTS
from worker_shim.program.python_command import boot_dir, debugged_children_env


def _load() -> Any:
    spec = importlib.util.spec_from_file_location(
        "_tether_collectives", SCRIPTS / "_tether_collectives.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


C = _load()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("86400", 86400.0), ("90m", 5400.0), ("24h", 86400.0), ("2d", 172800.0), ("1.5h", 5400.0),
     ("0", 0.0), (" 10S ", 10.0), ("", None), ("-5", None), ("soon", None), ("h", None),
     ("inf", None), ("nan", None), (None, None)],
)  # fmt: skip
def test_durations_parse_or_are_refused(text: str | None, seconds: float | None) -> None:
    assert C.parse_seconds(text) == seconds


def test_a_timeout_is_raised_to_the_floor_and_never_lowered() -> None:
    assert C.raised(None, 86400) == 86400  # torch's default (10 or 30 min)
    assert C.raised(10, 86400) == 86400
    assert C.raised(172800, 86400) == 172800
    assert [C.describe(s) for s in (86400, 5400, 600, 90, 1.5)] == [
        "24h",
        "90m",
        "10m",
        "90s",
        "1.5s",
    ]


def _fake_c10d() -> tuple[types.ModuleType, list[tuple[str, Any]]]:
    calls: list[tuple[str, Any]] = []
    c10d = types.ModuleType("fake_c10d")

    def init_process_group(
        backend: Any = None, init_method: Any = None, timeout: Any = None, **kw: Any
    ) -> None:
        calls.append(("init_process_group", timeout))

    def new_group(ranks: Any = None, timeout: Any = None, backend: Any = None) -> str:
        calls.append(("new_group", timeout))
        return "group"

    def _new_group_with_tag(ranks: Any = None, timeout: Any = None) -> None:
        calls.append(("_new_group_with_tag", timeout))

    def split_group(parent_pg: Any = None, split_ranks: Any = None, timeout: Any = None) -> None:
        calls.append(("split_group", timeout))

    for fn in (init_process_group, new_group, _new_group_with_tag, split_group):
        setattr(c10d, fn.__name__, fn)
    return c10d, calls


def test_every_creator_gets_the_floor_once_told_and_the_users_longer_timeout_stays() -> None:
    c10d, calls = _fake_c10d()
    said: list[str] = []
    assert C.wrap(c10d, 86400, said.append) is None
    c10d.init_process_group("gloo", None, timedelta(seconds=10))  # positional: still seen
    assert c10d.new_group([0, 1], backend="gloo") == "group"  # no timeout: torch's default
    c10d.new_group([0], timeout=timedelta(days=3))  # longer than the floor: kept
    c10d._new_group_with_tag([0])
    c10d.split_group(None, [[0]], timedelta(minutes=5))
    day = timedelta(days=1)
    assert calls == [
        ("init_process_group", day),
        ("new_group", day),
        ("new_group", timedelta(days=3)),
        ("_new_group_with_tag", day),
        ("split_group", day),
    ]
    assert said == [
        "tether: debug run: torch.distributed process groups get a timeout of 24h (not 10s), so "
        "a paused rank does not end the job (TETHER_COLLECTIVE_TIMEOUT=24h; 0 turns this off)"
    ]
    assert C.wrap(c10d, 86400, said.append) is None  # twice: not wrapped twice
    c10d.new_group([0], timeout=timedelta(seconds=1))
    assert calls[-1] == ("new_group", day) and len(said) == 1


def test_a_torch_it_does_not_know_is_left_alone_and_said_why() -> None:
    c10d, calls = _fake_c10d()
    del c10d.split_group
    assert C.wrap(c10d, 86400, print) == "torch.distributed.distributed_c10d has no split_group"
    c10d.new_group([0], timeout=timedelta(seconds=10))
    assert calls == [("new_group", timedelta(seconds=10))]

    def new_group(ranks: Any = None) -> None: ...

    c10d, _ = _fake_c10d()
    c10d.new_group = new_group
    assert "takes no timeout" in C.wrap(c10d, 86400, print)


def test_unset_or_unreadable_installs_nothing() -> None:
    said: list[str] = []
    before = list(sys.meta_path)
    assert C.install({}, said.append) is None
    assert C.install({COLLECTIVE_TIMEOUT_ENV: "soon"}, said.append) is None
    assert sys.meta_path == before
    assert said == [
        "tether: TETHER_COLLECTIVE_TIMEOUT='soon' is not a duration (86400, 90m, 24h, 2d); ignored"
    ]


def test_off_raises_no_timeout_but_maps_the_breakpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    assert C.install({COLLECTIVE_TIMEOUT_ENV: "0"}, print) is None  # no floor
    hook = sys.meta_path[0]
    assert type(hook).__name__ == "_AfterC10d"
    c10d, calls = _fake_c10d()
    dist = types.ModuleType("torch.distributed")
    dist._make_distributed_pdb = object  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    hook.then(c10d)  # type: ignore[attr-defined]
    c10d.init_process_group("gloo")
    assert calls == [("init_process_group", None)]  # the timeout as given (none)
    assert isinstance(dist._make_distributed_pdb(), C.DebuggerStop)  # type: ignore[attr-defined]


class _Pdb:
    def __init__(self) -> None:
        self.said: list[str] = []
        self.traced: list[Any] = []

    def message(self, text: str) -> None:
        self.said.append(text)

    def set_trace(self, frame: Any = None) -> None:
        self.traced.append(frame)


def _torch_breakpoint(make_pdb: Any) -> None:
    """What ``torch.distributed.breakpoint()`` does with its pdb (torch 2.13), in a frame named as
    torch's module is."""
    code = "pdb = make_pdb()\npdb.message('Type up')\npdb.set_trace()\n"
    exec(code, {"__name__": "torch.distributed", "make_pdb": make_pdb})


def test_torch_distributed_breakpoint_stops_its_caller_in_the_debugger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c10d, _ = _fake_c10d()
    dist = types.ModuleType("torch.distributed")
    pdbs: list[_Pdb] = []
    dist._make_distributed_pdb = lambda: pdbs.append(_Pdb()) or pdbs[-1]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    C.map_breakpoint(c10d)
    C.map_breakpoint(c10d)  # once is enough: a second call wraps nothing more
    c10d.init_process_group("gloo")
    c10d.init_process_group("gloo")

    stopped: list[Any] = []
    debugger = types.ModuleType("_tether_breakpoint")
    debugger.stop_here = lambda frame: stopped.append(frame) or True  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "_tether_breakpoint", debugger)
    _torch_breakpoint(dist._make_distributed_pdb)  # type: ignore[attr-defined]
    assert [f.f_code.co_name for f in stopped] == ["_torch_breakpoint"]  # torch's frame skipped
    assert pdbs == []  # no pdb was made

    debugger.stop_here = lambda frame: False  # type: ignore[attr-defined]  # no client: pdb
    _torch_breakpoint(dist._make_distributed_pdb)  # type: ignore[attr-defined]
    assert len(pdbs) == 1 and pdbs[0].said == ["Type up"] and len(pdbs[0].traced) == 1


def test_the_worker_sets_the_floor_and_puts_the_sitecustomize_first(tmp_path: Path) -> None:
    env = {"PYTHONPATH": "/mine", "A": "1"}
    assert debugged_children_env(env, boot="/boot") == {
        "PYTHONPATH": "/boot:/mine",
        "A": "1",
        COLLECTIVE_TIMEOUT_ENV: COLLECTIVE_TIMEOUT_FLOOR,
    }
    mine = {COLLECTIVE_TIMEOUT_ENV: "0"}  # the user's --env wins (off)
    assert debugged_children_env(mine, boot=None) == mine


#: a stand-in torch package: torch.distributed re-exports its c10d's names, as torch's does
_C10D = """
def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1):
    print("init", timeout)
def new_group(ranks=None, timeout=None, backend=None):
    print("new_group", timeout)
def _new_group_with_tag(ranks=None, timeout=None):
    pass
def split_group(parent_pg=None, split_ranks=None, timeout=None):
    pass
__all__ = ["init_process_group", "new_group"]
"""


def test_the_sitecustomize_hooks_torch_distributed_before_it_reexports(tmp_path: Path) -> None:
    fake = tmp_path / "fake" / "torch" / "distributed"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("from .distributed_c10d import *\n")
    (fake / "distributed_c10d.py").write_text(_C10D)
    code = (
        "import sys; assert 'torch' not in sys.modules\n"  # nothing imported early
        "from datetime import timedelta\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo', timeout=timedelta(seconds=10))\n"
        "dist.new_group([0])\n"
    )
    env = {"PATH": "/usr/bin:/bin", "RANK": "0"}
    path = f"{boot_dir(tmp_path)}:{tmp_path / 'fake'}"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "PYTHONPATH": path, COLLECTIVE_TIMEOUT_ENV: "2h"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["init 2:00:00", "new_group 2:00:00"]
    assert "get a timeout of 2h (not 10s)" in done.stderr
    quiet = subprocess.run(  # rank 1: the same, without the note (rank 0's is the job's)
        [sys.executable, "-c", code],
        env={**env, "RANK": "1", "PYTHONPATH": path, COLLECTIVE_TIMEOUT_ENV: "2h"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert quiet.stdout == done.stdout and quiet.stderr == ""
    plain = subprocess.run(  # not a debug run: untouched
        [sys.executable, "-c", code],
        env={**env, "PYTHONPATH": path},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert plain.stdout.splitlines() == ["init 0:00:10", "new_group None"]
