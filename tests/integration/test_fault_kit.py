"""The fault kit (``celery_fence.testing``) itself: the proxy, the worker's pid lookup, the history check."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from celery_fence import StoreUnavailable, open_store
from celery_fence.stores.sql import SQLStore
from celery_fence.testing import StoreProxy, WorkerFactory, assert_history_clean, wait_for

from .fenced_app import record
from .workers import marks
from .world import Cluster

pytestmark = pytest.mark.integration

APP = "tests.integration.fenced_app"


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    """A TCP echo server on loopback (one thread per connection), closed afterwards."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    done = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # a reset from the proxy ends it
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[:2]
    done.set()
    thread.join(5)
    server.close()


def _round_trip(address: tuple[str, int], payload: bytes, timeout: float = 10) -> bytes:
    with socket.create_connection(address, timeout=timeout) as conn:
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_the_proxy_passes_bytes_both_ways(echo: tuple[str, int]) -> None:
    payload = os.urandom(3_000_000)
    with StoreProxy(*echo) as proxy:
        assert _round_trip((proxy.host, proxy.port), payload) == payload
        assert _round_trip((proxy.host, proxy.port), b"x") == b"x"


def test_delay_holds_every_chunk_until_it_is_removed(echo: tuple[str, int]) -> None:
    """No duration measured: a client that waits less than the delay gets nothing, and one after
    ``delay(0)`` gets its bytes back."""
    with StoreProxy(*echo) as proxy:
        proxy.delay(60)
        with pytest.raises(TimeoutError):
            _round_trip((proxy.host, proxy.port), b"ping", timeout=0.5)
        proxy.delay(0)
        assert _round_trip((proxy.host, proxy.port), b"pong") == b"pong"
        with pytest.raises(ValueError):
            proxy.delay(-1)


def test_close_stops_every_thread_and_connection(echo: tuple[str, int]) -> None:
    proxy = StoreProxy(*echo)
    conns = [socket.create_connection((proxy.host, proxy.port), timeout=5) for _ in range(3)]
    wait_for(lambda: proxy.connections == 3, 5, "three proxied connections")
    proxy.close()
    assert proxy.connections == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("store-proxy")]
    for conn in conns:
        with conn, pytest.raises(OSError):  # reset: either the send or the read fails
            conn.sendall(b"x")
            if not conn.recv(1):
                raise ConnectionResetError("closed")
    with pytest.raises(OSError):
        socket.create_connection((proxy.host, proxy.port), timeout=1)


def test_url_for_points_a_store_url_at_the_proxy() -> None:
    url = "postgresql+psycopg://app:s3cret@127.0.0.1:5432/shop?options=-csearch_path%3Dx"
    with StoreProxy.for_url(url) as proxy:
        assert proxy.target == ("127.0.0.1", 5432)
        expected = f"postgresql+psycopg://app:s3cret@127.0.0.1:{proxy.port}/shop?options=-csearch_path%3Dx"
        assert proxy.url_for(url) == expected
        with pytest.raises(ValueError, match="does not point at"):
            proxy.url_for("postgresql://127.0.0.1:5433/shop")
    with StoreProxy.for_url("redis://localhost/15") as proxy:
        assert proxy.url_for("redis://localhost/15") == f"redis://127.0.0.1:{proxy.port}/15"
    with StoreProxy.for_url("etcd://127.0.0.1:2379/fence/") as proxy:
        assert proxy.url_for("etcd://127.0.0.1:2379/fence/") == f"etcd://127.0.0.1:{proxy.port}/fence/"
    with pytest.raises(ValueError, match=r"postgresql://, redis:// or etcd://"):
        StoreProxy.for_url("sqlite:///fence.db")


@pytest.mark.postgres
def test_cut_breaks_a_live_postgresql_connection_and_restore_lets_new_ones_in(postgres_url: str) -> None:
    with StoreProxy.for_url(postgres_url) as proxy:
        engine = create_engine(proxy.url_for(postgres_url), connect_args={"connect_timeout": 5})
        try:
            with engine.connect() as conn:
                assert conn.execute(text("SELECT 1")).scalar() == 1
                proxy.cut()
                with pytest.raises(OperationalError) as broken:  # the driver's error, not a hang
                    conn.execute(text("SELECT 1"))
                assert broken.value.connection_invalidated
            with pytest.raises(OperationalError):  # new connections are refused while cut
                engine.connect().close()
            proxy.restore()
            with engine.connect() as conn:
                assert conn.execute(text("SELECT 1")).scalar() == 1
        finally:
            engine.dispose()


@pytest.mark.postgres
def test_a_store_behind_a_cut_proxy_is_unavailable(postgres_url: str) -> None:
    with StoreProxy.for_url(postgres_url) as proxy:
        store = SQLStore(proxy.url_for(postgres_url))
        try:
            assert store.get(f"kit:{uuid.uuid4()}") is None
            proxy.cut()
            with pytest.raises(StoreUnavailable):
                store.get("kit:any")
            proxy.restore()
            assert store.get("kit:any") is None
        finally:
            store.close()


def test_pid_of_finds_the_child_running_the_task(cluster: Cluster, fence_worker: WorkerFactory) -> None:
    """Redis broker, prefork with two children: the pid the task itself wrote down."""
    worker = fence_worker(APP, name="a", queues=cluster.queue, concurrency=2, env=cluster.env)
    result = record.apply_async(("pid",), {"pause": 4.0}, queue=cluster.queue)
    pid = worker.pid_of(result.id)
    ((written, _),) = wait_for(lambda: marks(cluster.workdir, result.id, "started"), 10, "the run's mark")
    assert pid == written != worker.pid
    assert result.get(timeout=30)["pid"] == pid


def test_pid_of_on_the_threads_pool_is_the_worker_itself(
    cluster: Cluster, fence_worker: WorkerFactory
) -> None:
    worker = fence_worker(APP, name="t", queues=cluster.queue, pool="threads", concurrency=2, env=cluster.env)
    result = record.apply_async(("pid",), {"pause": 3.0}, queue=cluster.queue)
    assert worker.pid_of(result.id) == worker.pid
    assert result.get(timeout=30)["pid"] == worker.pid


def _nothing() -> None:
    pass


def test_pid_of_fails_clearly_when_the_worker_cannot_answer_and_leaves_nothing_in_flight(
    cluster: Cluster, fence_worker: WorkerFactory
) -> None:
    """The solo pool's main process runs the task, so nobody answers remote control meanwhile. The wait
    for the reply ended on its timeout with a BRPOP in flight: on a pooled connection, the after-fork
    cleanup of the first process forked later read its reply, and the second hung on the shared socket
    (seen in a two-worker CI run). pid_of closes its own connection: forked processes exit."""
    worker = fence_worker(APP, name="s", queues=cluster.queue, pool="solo", env=cluster.env)
    result = record.apply_async(("pid",), {"pause": 4.0}, queue=cluster.queue)
    wait_for(lambda: marks(cluster.workdir, result.id, "started"), 10, "the run to start")
    with pytest.raises(AssertionError, match="never answered"):
        worker.pid_of(result.id, timeout=1.5)
    forked = [multiprocessing.get_context("fork").Process(target=_nothing) for _ in range(2)]
    try:
        for process in forked:
            process.start()
            process.join(10)
        assert [process.exitcode for process in forked] == [0, 0]
    finally:
        for process in forked:
            if process.pid is not None and process.exitcode is None:
                process.kill()
                process.join(5)
    assert result.get(timeout=30)["item"] == "pid"


def test_a_worker_that_cannot_start_fails_at_once_with_its_output(fence_worker: WorkerFactory) -> None:
    with pytest.raises(AssertionError, match="exited with code") as failed:  # not the readiness bound's
        fence_worker("no_such_module_for_the_kit", name="broken")
    assert "no_such_module_for_the_kit" in str(failed.value)


def test_assert_history_clean_names_every_violation(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'fence.db'}")
    try:
        lease = store.acquire("order:1", "me", 30.0)
        store.complete(lease, {"ok": True})
        assert_history_clean(store)
        with store.engine.begin() as conn:  # a forged second completion, with a token nobody held
            conn.execute(
                text(
                    "INSERT INTO fence_history (key, at, event, token, owner) "
                    "VALUES ('order:1', 0, 'complete', :token, 'forger')"
                ),
                {"token": lease.token + 7},
            )
        with pytest.raises(AssertionError) as found:
            assert_history_clean(store)
        message = str(found.value)
        assert "2 fencing violation(s)" in message
        assert "order:1: stale-write" in message and "order:1: double-complete" in message
        assert_history_clean(store, key="order:2")  # another key's history is clean
    finally:
        store.close()


def test_importing_celery_fence_does_not_import_pytest() -> None:
    code = "import celery_fence, sys; assert 'pytest' not in sys.modules, 'pytest was imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
