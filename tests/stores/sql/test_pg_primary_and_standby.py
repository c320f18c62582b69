"""The SQL store on a PostgreSQL primary and standby: the libpq multi-host URL, no
statement ever on the standby, the same store object on the new primary after a failover, and what an
asynchronous failover does to the token counter (and ``advance``, its remedy)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from celery_fence import ConfigurationError, StoreUnavailable, open_store
from celery_fence.stores.sql import SQLStore
from celery_fence.stores.urls import mask_url
from tests.servers.pg_pair import PostgresPair, multi_host_url, postgres_pair

TWO = "postgresql+psycopg://app:s3cret@/shop?host=10.0.0.1:5432&host=10.0.0.2:5433"


def test_a_multi_host_url_with_read_write_is_taken_and_masked() -> None:
    url = f"{TWO}&target_session_attrs=read-write"
    SQLStore.check_url(url)
    SQLStore.check_url(url.replace("read-write", "primary"))
    SQLStore.check_url("postgresql+psycopg://app@/shop?host=10.0.0.1:5432")  # one server: nothing to pick
    SQLStore.check_url("postgresql+psycopg://app@localhost/shop?host=/run/postgresql")  # the query wins
    assert mask_url(url) == url.replace("s3cret", "***")


@pytest.mark.parametrize(
    ("url", "named"),
    [
        (TWO, "target_session_attrs=read-write"),
        (f"{TWO}&target_session_attrs=any", "target_session_attrs=read-write"),
        (f"{TWO}&target_session_attrs=prefer-standby", "target_session_attrs=read-write"),
        ("postgresql+psycopg://app:s3cret@/shop?host=10.0.0.1,10.0.0.2", "target_session_attrs=read-write"),
        ("postgresql+psycopg://app:s3cret@db1/shop?host=h1:1&host=h2:2", "target_session_attrs=read-write"),
    ],
)
def test_a_multi_host_url_that_could_reach_a_standby_is_refused(url: str, named: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        open_store(url)
    assert named in str(refused.value)
    assert "s3cret" not in str(refused.value)


@pytest.fixture(scope="module")
def pair() -> Iterator[PostgresPair]:
    with postgres_pair(synchronous=False) as started:  # a test waits for the standby where it must
        yield started


@pytest.fixture
def store(pair: PostgresPair) -> Iterator[SQLStore]:
    opened = open_store(multi_host_url(pair.ports[::-1]))  # the standby first: libpq must skip it
    assert isinstance(opened, SQLStore)
    opened.migrate()
    yield opened
    opened.close()


def _server_port(store: SQLStore) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(text("SELECT inet_server_port()")).scalar()


def test_every_session_is_on_the_primary(pair: PostgresPair, store: SQLStore) -> None:
    lease = store.acquire("first", "me", 30)
    store.complete(lease, {"ok": 1})
    state = store.get("first")
    assert state is not None and state.done and state.result == {"ok": 1}
    assert _server_port(store) == pair.primary.port


def test_a_standby_named_alone_answers_nothing(pair: PostgresPair) -> None:
    """Its reads could be behind the primary and its writes fail: the store refuses it as unavailable
    (what it reports at connect, no round trip), never a wrong answer."""
    standby = open_store(f"postgresql+psycopg://postgres@127.0.0.1:{pair.standby.port}/postgres")
    try:
        for call in (lambda: standby.acquire("alone", "me", 30), lambda: standby.get("first")):
            with pytest.raises(StoreUnavailable):
                call()
    finally:
        standby.close()


def test_the_same_store_goes_on_on_the_new_primary(pair: PostgresPair, store: SQLStore) -> None:
    held = store.acquire("across", "me", 60)
    pair.wait_replayed()  # what a synchronous standby does for every commit
    # The new primary read-only while the block runs: no client may use it yet.
    with pair.failing_over(gated=True), pytest.raises(StoreUnavailable):
        store.get("across")
    state = store.get("across")  # the held connection and the pools were on the dead primary
    assert state is not None and state.token == held.token, "a replayed commit was lost"
    store.complete(held, "done")
    after = store.acquire("next", "me", 60)
    assert after.token > held.token
    assert _server_port(store) == pair.primary.port


def test_an_asynchronous_failover_rewinds_the_counter_until_advance(
    pair: PostgresPair, store: SQLStore
) -> None:
    """What the standby had not received is gone: leases and the tokens issued for them. The sequence
    resumes below tokens already handed out (it logs 32 values ahead, so more than 32 must be lost)."""
    before = store.acquire("kept", "me", 60)
    pair.wait_replayed()
    pair.stop_replication()
    issued = [store.acquire(f"lost-{n}", "me", 60).token for n in range(40)]
    with pair.failing_over():
        pass
    assert store.get("lost-0") is None
    reissued = store.acquire("after", "me", 60).token
    assert before.token < reissued <= max(issued), "the counter did not go back: no rewind shown"
    floor = store.advance(1_000_000)
    assert floor > max(issued)
    assert store.acquire("advanced", "me", 60).token > max(issued)


def test_a_primary_made_read_only_under_the_store_is_unavailable_until_writable(
    pair: PostgresPair, store: SQLStore
) -> None:
    """The server turns read-only under the store (``default_transaction_read_only``, as for a failover,
    docs/operating.md). A session applies a reload only after its next statement, so that one statement
    may still write; from then on the server reports itself read-only and every call is StoreUnavailable,
    reads too (the store never reads from a server that takes no writes). Writable again: the same store
    goes on, on new connections."""
    warm = store.acquire("warm", "me", 60)  # the held connection is open on the primary
    _read_only(pair, "on")
    try:
        with contextlib.suppress(StoreUnavailable):
            store.release(warm)  # the statement after which the held session applies the reload
        with pytest.raises(StoreUnavailable):
            store.acquire("while-read-only", "me", 60)
        with pytest.raises(StoreUnavailable):
            store.get("warm")
    finally:
        _read_only(pair, "off")
    assert store.get("while-read-only") is None
    assert store.acquire("after-read-only", "me", 60).token > warm.token


def _read_only(pair: PostgresPair, value: str) -> None:
    """Set it on the primary and wait until a new session sees it."""
    dsn = f"postgresql://postgres@127.0.0.1:{pair.primary.port}/postgres"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET default_transaction_read_only = {value}")
        conn.execute("SELECT pg_reload_conf()")
    deadline = time.monotonic() + 30
    while _setting(dsn) != value:
        assert time.monotonic() < deadline, "the reload did not take effect"
        time.sleep(0.02)


def _setting(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SHOW default_transaction_read_only").fetchone()
    return str(row[0]) if row else ""
