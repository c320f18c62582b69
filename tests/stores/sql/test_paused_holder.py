"""A holder SIGSTOPped inside its run's fenced transaction (claim C47), on real processes.

PostgreSQL: the run's transaction carries ``idle_in_transaction_session_timeout`` = the lease ttl, so the
server ends the paused holder's session one ttl after its last statement and a takeover follows; never
before (the row stays locked until then). The order is read on the store's clock, never timed here.

SQLite: there is no server to end anything. The paused run's ``BEGIN IMMEDIATE`` holds the whole
database's write lock, so every writer of every key is kept out (``StoreUnavailable`` after its busy
timeout, naming the cause) until the holder is resumed or dies. That is the limit docs/stores.md states.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from celery_fence import LeaseHeld, StoreUnavailable
from celery_fence.fence import Fence
from celery_fence.stores.sql import SQLStore
from celery_fence.stores.sql.engine import SessionLimits
from celery_fence.testing import wait_for
from tests.support.harnesses import HARNESSES

TTL = 1.0  # the paused run's lease ttl: what bounds its hold on PostgreSQL
# Far above TTL: only the run's own per-transaction limit can end the pause within POLL.
HOLDER_LIMITS = SessionLimits(idle_in_transaction=600.0, lock=600.0, statement=600.0)
POLL = 60.0  # a bound on polls only; a takeover normally follows within a second or two of the bound
PG_NOW = "SELECT extract(epoch from clock_timestamp())"  # the store's clock, as its statements read it
CAUSE = "the SQLite database is locked by another process's open transaction"


def _hold(url: str, lease_ttl: float, out: Any, go: Any) -> None:
    """The holder: acquire ``k``, open the run's transaction, write, say so, then wait to be told to go on
    (SIGSTOPped meanwhile by the test); on ``go`` it completes the run."""
    store = SQLStore(url, HOLDER_LIMITS)
    lease = store.acquire("k", "paused", lease_ttl)
    fence = Fence(store, lease, None, lease_ttl)
    with fence.transaction() as conn:
        conn.execute(text("INSERT INTO fence_test_effects VALUES ('k', :t, 'paused')"), {"t": lease.token})
        at = conn.execute(text(PG_NOW)).scalar() if store.dialect == "postgresql" else None
    out.put(
        (lease.token, None if at is None else float(at))
    )  # ``at``: the store's clock at the transaction's last statement
    go.wait(POLL * 2)
    fence.commit("paused's result")
    out.put("committed")


@contextmanager
def _paused_holder(url: str, lease_ttl: float) -> Iterator[tuple[Any, int, float, Any]]:
    """A holder process stopped inside its run's transaction: (process, token, store time of its last
    statement, its ``go`` event). Killed by its pid afterwards."""
    ctx = multiprocessing.get_context("spawn")
    out, go = ctx.Queue(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(url, lease_ttl, out, go))
    holder.start()
    try:
        token, at = out.get(timeout=POLL)
        assert holder.pid is not None
        os.kill(holder.pid, signal.SIGSTOP)
        yield holder, token, at, (out, go)
    finally:
        if holder.pid is not None and holder.exitcode is None:
            os.kill(holder.pid, signal.SIGKILL)
            os.kill(holder.pid, signal.SIGCONT)
        holder.join(30)


def _with_effects_table(store: SQLStore) -> SQLStore:
    """A user table in the store's database, written only through the holder's fenced transaction."""
    with store.engine.begin() as conn:
        conn.execute(
            text("CREATE TABLE fence_test_effects (key VARCHAR(100), token BIGINT, who VARCHAR(20))")
        )
    return store


def _effects(store: SQLStore) -> list[tuple[Any, ...]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text("SELECT key, token, who FROM fence_test_effects"))]


@pytest.fixture
def pg(request: pytest.FixtureRequest) -> Iterator[SQLStore]:
    for store in HARNESSES["postgresql"].open(request):
        yield _with_effects_table(store)


def _takeover(store: SQLStore, key: str) -> int:
    """Poll acquire until it takes ``key`` over (bounded): the new token. LeaseHeld until then."""

    def attempt() -> int | None:
        try:
            return store.acquire(key, "taker", 30.0).token
        except LeaseHeld:  # the paused run's transaction still locks the row
            return None

    return wait_for(attempt, timeout=POLL, what="the takeover of the paused holder's key")


def test_on_postgresql_a_paused_holder_blocks_a_takeover_for_one_ttl_after_its_last_statement(
    pg: SQLStore,
) -> None:
    with _paused_holder(pg.url, TTL) as (_holder, token, last_statement_at, _):
        with pg.engine.connect() as conn:
            expires_at = float(
                conn.execute(text("SELECT expires_at FROM fence_leases WHERE key = 'k'")).scalar()
            )
        taken = _takeover(pg, "k")
    takeover = [e for e in pg.history("k") if e.event == "takeover"]
    assert [e.token for e in takeover] == [taken] and taken > token
    # On the store's clock: the takeover came after the lease's expiry, and after the paused run's
    # transaction had been idle one ttl (the server ended it then; the locked row answered LeaseHeld before).
    assert takeover[0].at >= expires_at
    assert takeover[0].at >= last_statement_at + TTL
    assert _effects(pg) == []  # the paused run's write rolled back with its session


@pytest.mark.parametrize("ending", ["resumed", "killed"])
def test_on_sqlite_a_paused_holder_keeps_every_writer_of_every_key_out_until_it_resumes_or_dies(
    tmp_path: Path, ending: str
) -> None:
    url = f"sqlite:///{tmp_path / 'fence.db'}"
    writer = SQLStore(url, SessionLimits(lock=0.2))  # gives up on the write lock quickly
    writer.migrate()
    _with_effects_table(writer)
    other = writer.acquire("other", "w", 30.0)
    try:
        with _paused_holder(url, TTL) as (holder, token, _, (out, go)):
            wait_for(lambda: writer.get("k").expires_in <= 0, timeout=POLL, what="the paused lease to expire")
            # Readers answer (WAL); every write, of any key, gives up with the cause named (not LeaseHeld).
            for name, write in {
                "takeover of the paused key": lambda: writer.acquire("k", "taker", 30.0),
                "acquire of another key": lambda: writer.acquire("fresh", "w", 30.0),
                "renew of another key": lambda: writer.renew([other], 30.0),
            }.items():
                with pytest.raises(StoreUnavailable, match=CAUSE):
                    write()
                assert writer.get("k").token == token, name
            if ending == "resumed":
                os.kill(holder.pid, signal.SIGCONT)  # first: setting ``go`` waits for its sleeper to wake
                go.set()
                assert out.get(timeout=POLL) == "committed"  # nobody took over: its completion is accepted
            else:
                os.kill(holder.pid, signal.SIGKILL)
                os.kill(holder.pid, signal.SIGCONT)
                holder.join(POLL)
        # The lock is gone with the pause: every writer goes on.
        assert writer.renew([other], 30.0) == []
        assert writer.acquire("fresh", "w", 30.0).token > other.token
        if ending == "resumed":
            assert writer.get("k").done and _effects(writer) == [("k", token, "paused")]
        else:
            assert writer.acquire("k", "taker", 30.0).token > token
            assert _effects(writer) == []  # the killed run's write never committed
    finally:
        writer.close()
