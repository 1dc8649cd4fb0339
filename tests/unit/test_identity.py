"""Whom programs run as (``worker_shim/program/identity.py``), which uid a worker leases
(``worker_shim/program/uid_leases.py``: the choice), and who may connect to the debugger
(``worker_shim/inject/_tether_guard.py``: reading the kernel's socket table)."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from worker_shim.inject import _tether_guard as guard
from worker_shim.program.identity import (
    DEFAULT_UIDS,
    Isolation,
    ProgramUser,
    parse_uids,
    passed_env,
)
from worker_shim.program.uid_leases import pick

# /proc/net/tcp rows: a listener on 127.0.0.1:8080 (uid 0), a connection 127.0.0.1:40000 ->
# 127.0.0.1:8080 (uid 1000) and its accepted end (uid 0)
TABLE = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 11 1
   1: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 12 1
   2: 0100007F:1F90 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 13 1
"""


def test_the_socket_table_names_each_ends_owner() -> None:
    assert guard.owner_in(TABLE, local=("127.0.0.1", 40000), remote=("127.0.0.1", 8080)) == 1000
    assert guard.owner_in(TABLE, local=("127.0.0.1", 8080), remote=("127.0.0.1", 40000)) == 0
    assert guard.owner_in(TABLE, local=("127.0.0.1", 40001), remote=("127.0.0.1", 8080)) is None


def test_the_listeners_of_a_port_are_found_on_loopback_or_any_address() -> None:
    assert guard.listener_owners(TABLE, 8080) == {0}
    assert guard.listener_owners(TABLE, 40000) == set()  # a connection, not a listener
    anywhere = "   9: " + "0" * 32 + ":1F90 " + "0" * 32 + ":0000 0A 0:0 0:0 0  7 0 15"
    assert guard.listener_owners(f"header\n{anywhere}\n", 8080) == {7}
    elsewhere = "   1: 0A00000A:1F90 00000000:0000 0A 0:0 0:0 0  8 0 16"  # 10.0.0.10: not loopback
    assert guard.listener_owners(f"header\n{elsewhere}\n", 8080) == set()


def test_ipv4_mapped_rows_of_tcp6_are_found_by_their_ipv4_address() -> None:
    mapped = "0000000000000000FFFF00000100007F"
    row = f"   0: {mapped}:9C41 {mapped}:1F90 01 00000000:00000000 00:00000000 00000000  4242 0 14"
    table = f"header\n{row}\n"
    assert guard.owner_in(table, local=("127.0.0.1", 40001), remote=("127.0.0.1", 8080)) == 4242
    assert (
        guard.owner_in(table, local=("::ffff:127.0.0.1", 40001), remote=("127.0.0.1", 8080)) == 4242
    )


def test_the_allowed_uids_are_the_processs_own_and_the_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(guard.PEERS_ENV, "0, 17,junk")
    assert guard.allowed_uids() == {os.geteuid(), 0, 17}
    monkeypatch.delenv(guard.PEERS_ENV)
    assert guard.allowed_uids() == {os.geteuid()}


def _listen(allowed: set[int]) -> tuple[socket.socket, int]:
    class FakeSockets:
        @staticmethod
        def create_server(host: str, port: int = 0, timeout: float | None = None) -> socket.socket:
            s = socket.socket()
            s.bind((host, port))
            s.settimeout(timeout)
            s.listen()
            return s

    module = FakeSockets()
    assert guard.guard(module) is None
    assert guard.guard(module) is None  # twice is once
    listener = module.create_server("127.0.0.1", 0, timeout=2)
    type(listener).allowed = allowed
    return listener, listener.getsockname()[1]


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="no socket table (not Linux)")
def test_a_guarded_listener_hands_over_allowed_peers_and_closes_the_others() -> None:
    listener, port = _listen({os.geteuid()})
    with listener, socket.create_connection(("127.0.0.1", port)) as client:
        conn, _ = listener.accept()
        conn.sendall(b"hi")
        assert client.recv(2) == b"hi"
        conn.close()

    listener, port = _listen({os.geteuid() + 1})  # nobody we are: refused, never returned
    accepted: list[object] = []

    def accept() -> None:
        try:
            accepted.append(listener.accept())
        except TimeoutError:
            accepted.append(None)

    with listener, socket.create_connection(("127.0.0.1", port)) as client:
        thread = threading.Thread(target=accept)
        thread.start()
        client.settimeout(5)
        assert client.recv(10) == b""  # closed before a byte
        thread.join()
    assert accepted == [None]


def test_a_debugpy_without_create_server_cannot_be_guarded() -> None:
    assert "create_server is missing" in str(guard.guard(object()))


def test_uid_ranges_are_checked() -> None:
    assert parse_uids("60000-60999") == DEFAULT_UIDS
    for bad, why in (
        ("60000", "not a range"),
        ("9-20", "from 1000 on"),
        ("61000-60000", "not after the last"),
        ("65000-65535", r"65534 \(nobody\)"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_uids(bad)


def test_a_leased_uid_is_the_next_free_one_after_a_point() -> None:
    uids = range(100, 105)
    assert pick(uids, set(), 0) == 100
    assert pick(uids, {100, 101}, 0) == 102
    assert pick(uids, {103, 104}, 3) == 100  # wraps round
    assert pick(uids, set(uids), 2) is None


def test_an_isolated_program_gets_the_workers_system_variables_only() -> None:
    worker = {"PATH": "/usr/bin", "LC_ALL": "C", "CUDA_HOME": "/cuda", "AWS_SECRET": "x",
              "HOME": "/root", "SSH_AUTH_SOCK": "/tmp/a", "TETHER_TOKEN": "t"}  # fmt: skip
    assert passed_env(worker) == {"PATH": "/usr/bin", "LC_ALL": "C", "CUDA_HOME": "/cuda"}


def test_a_worker_isolates_when_it_runs_as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("TETHER_RUNS_ROOT", "/srv/runs")
    rule = Isolation.decide(user="alice")
    assert rule.uids == DEFAULT_UIDS and rule.runs_root == Path("/srv/runs")
    assert rule.refusal("bob", "pool") is None  # every user's runs
    assert "uid of its own" in rule.describe()
    assert rule.runs_dir(Path("/w")).parent == Path("/srv/runs")
    opted_out = Isolation.decide(user="alice", isolate=False)
    assert opted_out.uids is None and opted_out.own_only


def test_a_worker_that_cannot_isolate_runs_its_own_users_runs_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    rule = Isolation.decide(user="")
    assert rule.uids is None and rule.runs_dir(Path("/w")) == Path("/w/runs")
    assert rule.refusal("alice", "alice") is None
    refused = rule.refusal("bob", "alice")
    assert refused is not None and "runs only alice's runs" in refused and "--any-user" in refused
    assert "its token's user's runs" in rule.describe()
    assert Isolation.decide(user="alice", any_user=True).refusal("bob", "alice") is None
    with pytest.raises(ValueError, match="only when the worker runs as root"):
        Isolation.decide(user="alice", isolate=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="makes files of other owners")
def test_what_a_uid_may_run_is_read_from_every_directory_on_the_way() -> None:
    with tempfile.TemporaryDirectory() as where:  # in /tmp: pytest's own is root's only
        _what_a_uid_may_run(Path(where))


def _what_a_uid_may_run(tmp_path: Path) -> None:
    user = ProgramUser(61999)
    top = tmp_path / "top"
    (top / "open" / "bin").mkdir(parents=True)
    tool = top / "open" / "bin" / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    for place in (tmp_path, top, top / "open", top / "open" / "bin"):
        place.chmod(0o755)
    assert user.can_run(tool) and user.can_read(tool) and user.can_enter(top / "open")
    (top / "open").chmod(0o700)  # a private directory on the way
    assert not user.can_run(tool) and not user.can_enter(top / "open" / "bin")
    (top / "open").chmod(0o711)  # searchable, not listable: enough
    assert user.can_run(tool)
    link = top / "link"
    hidden = tmp_path / "hidden"
    hidden.mkdir(mode=0o700)
    (hidden / "python").write_text("")
    (hidden / "python").chmod(0o755)
    link.symlink_to(hidden / "python")  # a link to a place of root's only (a venv's python)
    assert not user.can_run(link)
    tool.chmod(0o744)
    assert not user.can_run(tool) and user.can_read(tool)
    os.chown(tool, user.uid, user.gid)
    assert user.can_run(tool)  # its owner's bits
