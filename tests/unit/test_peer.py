"""The adapter's check of who is on the other end of a loopback connection
(``adapter/dap/peer.py``)."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from adapter.dap.peer import peer_uid, refusal, socket_owner

TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1
   1: 0100007F:C350 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1001        0 2 1
   2: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 3 1
"""
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0000000000000000FFFF00000100007F:D431 0000000000000000FFFF00000100007F:1F90 01 00000000:00000000 00:00000000 00000000   65534        0 4 1
   1: 00000000000000000000000001000000:D432 00000000000000000000000001000000:1F90 01 00000000:00000000 00:00000000 00000000   42        0 5 1
"""


def test_rows_are_matched_by_both_ends() -> None:
    # the peer's socket: its local end is 127.0.0.1:50000, its remote end our 127.0.0.1:8080
    assert socket_owner(TCP, ("127.0.0.1", 50000), ("127.0.0.1", 8080)) == 1001
    assert socket_owner(TCP, ("127.0.0.1", 8080), ("127.0.0.1", 50000)) == 1000
    assert socket_owner(TCP, ("127.0.0.1", 50001), ("127.0.0.1", 8080)) is None
    assert socket_owner("garbage\nnot a table at all\n", ("127.0.0.1", 1), ("127.0.0.1", 2)) is None


def test_ipv6_rows_and_ipv4_mapped_addresses() -> None:
    assert socket_owner(TCP6, ("127.0.0.1", 0xD431), ("127.0.0.1", 8080)) == 65534
    assert socket_owner(TCP6, ("::ffff:127.0.0.1", 0xD431), ("::ffff:127.0.0.1", 8080)) == 65534
    assert socket_owner(TCP6, ("::1", 0xD432), ("::1", 8080)) == 42


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="procfs socket table: Linux")
def test_a_connection_of_this_process_is_owned_by_this_user() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        with client, accepted:
            ours, theirs = accepted.getsockname(), accepted.getpeername()
            assert peer_uid(ours, theirs) == os.geteuid()
            assert refusal(ours, theirs) is None
