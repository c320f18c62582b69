"""What only the SQL store promises: statement counts, fenced transactions, locks and session timeouts."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, text

from celery_fence import (
    ConfigurationError,
    LeaseHeld,
    StaleToken,
    StoreUnavailable,
    TokenRewound,
    open_store,
)
from celery_fence.fence import Fence
from celery_fence.lease import Lease
from celery_fence.stores.sql import SQLStore
from celery_fence.stores.sql.engine import SessionLimits
from celery_fence.stores.sql.errors import Unchanged
from celery_fence.testing import wait_for
from tests.support.harnesses import HARNESSES
from tests.support.racing import race
from tests.support.reconnect import OPERATIONS, run_and_check
from tests.support.round_trips import RoundTrips

TTL = 30.0


@pytest.fixture(params=["sqlite", "postgresql"])
def sql(request: pytest.FixtureRequest) -> Iterator[SQLStore]:
    yield from HARNESSES[request.param].open(request)


def _effects_table(store: SQLStore) -> str:
    """A user table in the store's database, written only through fenced transactions."""
    with store.engine.begin() as conn:
        conn.execute(
            text("CREATE TABLE fence_test_effects (key VARCHAR(100), token BIGINT, who VARCHAR(20))")
        )
    return "fence_test_effects"


@pytest.fixture
def effects(sql: SQLStore) -> str:
    return _effects_table(sql)


def _expire(store: SQLStore) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE fence_leases SET expires_at = expires_at - 10000 WHERE expires_at IS NOT NULL")
        )


class StatementCounter:
    """Counts what the store hands the driver (psycopg or sqlite3 ``execute``/``executemany``), on both of
    its engines, whether a statement goes through SQLAlchemy or straight to the driver's cursor."""

    def __init__(self, store: SQLStore) -> None:
        self.statements: list[str] = []
        for engine in (store.engine, store.autocommit_engine):
            event.listen(engine, "do_connect", self._on_connect)
            engine.dispose()  # every connection from now on is a counting one

    def _on_connect(self, dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
        if dialect.name == "postgresql":
            cparams["cursor_factory"] = _counting_psycopg_cursor(self.statements)
        else:
            cparams["factory"] = _counting_sqlite_connection(self.statements)

    def count(self, fn: Any, *args: Any) -> int:
        self.statements.clear()
        fn(*args)
        return len(self.statements)


def _counting_psycopg_cursor(seen: list[str]) -> type:
    import psycopg

    class Counting(psycopg.Cursor[Any]):
        def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(str(query))
            return super().execute(query, *args, **kwargs)

        def executemany(self, query: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(str(query))
            return super().executemany(query, *args, **kwargs)

    return Counting


def _counting_sqlite_connection(seen: list[str]) -> type:
    class Cursor(sqlite3.Cursor):
        def execute(self, sql: str, *args: Any) -> Any:
            seen.append(sql)
            return super().execute(sql, *args)

        def executemany(self, sql: str, *args: Any) -> Any:
            seen.append(sql)
            return super().executemany(sql, *args)

    class Connection(sqlite3.Connection):
        def cursor(self, *args: Any, **kwargs: Any) -> Any:
            return super().cursor(Cursor)

    return Connection


def test_one_statement_per_operation(sql: SQLStore) -> None:
    sql.migrate()
    counter = StatementCounter(sql)
    leases = [sql.acquire(f"k{i}", "w", TTL) for i in range(1000)]
    assert counter.count(sql.acquire, "new", "w", TTL) == 1
    for n in (1, 100, 1000):
        assert counter.count(sql.renew, leases[:n], TTL) == 1, f"renew of {n} leases"
    assert counter.count(sql.complete, leases[0], {"ok": True}) == 1
    assert counter.count(sql.release, leases[1]) == 1
    assert counter.count(sql.renew, leases[1:3], TTL) == 2  # a lost lease adds the one that records it
    print(f"\n{sql.dialect}: acquire 1, renew of 1/100/1000 leases 1, complete 1, release 1 statement")


def test_a_runs_transaction_opens_with_one_statement(sql: SQLStore) -> None:
    """The guard that checks and locks the lease row also sets PostgreSQL's idle timeout for the run's
    transaction (set_config in its RETURNING): a SET LOCAL before it was a round trip of its own. On
    PostgreSQL the guard goes with the transaction's BEGIN, in one round trip counted on the wire."""
    sql.migrate()
    fence = Fence(sql, sql.acquire("opens", "w", TTL), None, TTL)
    counter, opened, idle = StatementCounter(sql), [], []
    setting = "SELECT setting FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout'"
    wire = RoundTrips(sql.engine) if sql.dialect == "postgresql" else None

    def open_it() -> None:
        with fence.transaction() as conn:  # what follows the transaction's BEGIN (SQLite: BEGIN IMMEDIATE)
            opened.append(wire.total() if wire else len([q for q in counter.statements if "BEGIN" not in q]))
            if sql.dialect == "postgresql":
                idle.append(conn.exec_driver_sql(setting).scalar())

    try:
        counter.count(open_it)
    finally:
        fence.abort()
        if wire is not None:
            wire.close()
    assert opened == [1], counter.statements
    assert idle == ([str(int(TTL * 1000))] if sql.dialect == "postgresql" else [])


def test_a_completion_that_changes_no_row_fails_its_transaction_and_nothing_commits(
    sql: SQLStore, effects: str
) -> None:
    """The completion goes with the COMMIT (one query on PostgreSQL): when it matches no row it must fail
    the transaction (``fence_unchanged()``), or the COMMIT behind it would commit the run's writes."""
    sql.migrate()
    lease = Lease("never-acquired", 7, "w")
    statements = sql.statements
    conn = statements.connect()
    tx = conn.begin()
    try:
        conn.execute(text(f"INSERT INTO {effects} (key, token, who) VALUES ('k', 7, 'unfenced')"))
        with pytest.raises(Unchanged):
            statements.last(conn, tx, "complete_or_fail", statements.complete_params(lease, "result"))
    finally:
        conn.close()
    with sql.engine.connect() as check:
        assert check.execute(text(f"SELECT count(*) FROM {effects}")).scalar() == 0
    assert sql.get("never-acquired") is None


def test_a_takeover_draws_one_token(sql: SQLStore) -> None:
    """INSERT ... ON CONFLICT DO UPDATE takes the token its INSERT drew (excluded.token): drawing another in
    the UPDATE burned a sequence value per takeover."""
    sql.migrate()
    first = sql.acquire("taken", "a", TTL)
    _expire(sql)
    taken_over = sql.acquire("taken", "b", TTL)
    fresh = sql.acquire("fresh", "c", TTL)
    assert (taken_over.token, fresh.token) == (first.token + 1, first.token + 2)


def test_fenced_transaction_commits_with_the_current_token(sql: SQLStore, effects: str) -> None:
    lease = sql.acquire("k", "a", TTL)
    with sql.transaction(lease) as conn:
        conn.execute(text(f"INSERT INTO {effects} VALUES ('k', :t, 'a')"), {"t": lease.token})
    with sql.engine.connect() as conn:
        assert conn.execute(text(f"SELECT token FROM {effects}")).scalars().all() == [lease.token]
    assert ("write", lease.token) in [(e.event, e.token) for e in sql.history("k")]


def test_user_errors_inside_the_transaction_roll_back_and_stay_theirs(sql: SQLStore, effects: str) -> None:
    lease = sql.acquire("k", "a", TTL)
    with pytest.raises(ZeroDivisionError), sql.transaction(lease) as conn:
        conn.execute(text(f"INSERT INTO {effects} VALUES ('k', 1, 'a')"))
        _ = 1 / 0
    with sql.engine.connect() as conn:
        assert conn.execute(text(f"SELECT count(*) FROM {effects}")).scalar() == 0
    assert "write" not in [e.event for e in sql.history("k")]


def _write_racing(sql: SQLStore, effects: str, key: str, writers: dict[str, Any]) -> dict[str, str]:
    """Start one fenced transaction per writer at the same instant; report who committed."""
    barrier, outcome = threading.Barrier(len(writers)), {}

    def write(who: str, lease: Any) -> None:
        barrier.wait()
        try:
            with sql.transaction(lease) as conn:
                row = {"k": key, "t": lease.token, "w": who}
                conn.execute(text(f"INSERT INTO {effects} VALUES (:k, :t, :w)"), row)
            outcome[who] = "committed"
        except StaleToken:
            outcome[who] = "stale"

    threads = [threading.Thread(target=write, args=item) for item in writers.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcome


def test_old_and_new_token_race_only_the_new_commits(sql: SQLStore, effects: str) -> None:
    for round_ in range(10):
        key = f"k{round_}"
        old = sql.acquire(key, "old", TTL)
        _expire(sql)
        new = sql.acquire(key, "new", TTL)
        outcome = _write_racing(sql, effects, key, {"old": old, "new": new})
        assert outcome == {"old": "stale", "new": "committed"}
        with sql.engine.connect() as conn:
            rows = conn.execute(text(f"SELECT token, who FROM {effects} WHERE key = :k"), {"k": key}).all()
        assert [tuple(r) for r in rows] == [(new.token, "new")]


def test_a_takeover_never_slips_into_an_open_fenced_transaction(sql: SQLStore, effects: str) -> None:
    """The guard locks the lease row until commit. On PostgreSQL an acquire that meets the lock answers
    LeaseHeld at once (docs/guarantees.md#the-rule-of-transaction-its-writes-commit-with-the-completion: no
    pool process waits behind a paused holder); SQLite has one writer, so there the acquire waits for the
    commit. Either way the takeover comes after the write."""
    old = sql.acquire("k", "old", TTL)
    _expire(sql)
    taken: dict[str, Any] = {}
    thief = threading.Thread(target=lambda: taken.setdefault("lease", sql.acquire("k", "new", TTL)))
    with sql.transaction(old) as conn:
        conn.execute(text(f"INSERT INTO {effects} VALUES ('k', :t, 'old')"), {"t": old.token})
        if sql.dialect == "postgresql":
            with pytest.raises(LeaseHeld):
                sql.acquire("k", "new", TTL)
        else:
            thief.start()
            thief.join(timeout=0.5)
            assert thief.is_alive(), "SQLite's takeover waits for the writer"
    if sql.dialect == "postgresql":
        taken["lease"] = sql.acquire("k", "new", TTL)
    else:
        thief.join()
    events = [(e.event, e.token) for e in sql.history("k")]
    assert events.index(("write", old.token)) < events.index(("takeover", taken["lease"].token))


def test_expiry_is_judged_by_the_statement_clock_not_the_transaction_start(sql: SQLStore) -> None:
    """PostgreSQL's now() is the transaction's start: a lease that expired meanwhile would look live."""
    lease = sql.acquire("k", "a", 0.3)
    with sql.engine.connect() as conn, conn.begin():
        conn.execute(text("SELECT 1"))  # the transaction starts before the expiry instant
        deadline = time.monotonic() + 10
        while conn.execute(sql.queries.state, {"key": "k"}).one().expires_in > 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        params = {"key": "k", "owner": "b", "ttl": TTL, "run": None}
        token = conn.execute(sql.queries.acquire, params).scalar()
    assert token is not None and token > lease.token


def _hold_transaction_then_pause(url: str, ready: Any) -> None:
    store = SQLStore(url, SessionLimits(idle_in_transaction=1.0, lock=1.0, statement=5.0))
    lease = store.acquire("k", "paused", 0.5)
    with store.transaction(lease) as conn:
        conn.execute(text("INSERT INTO fence_test_effects VALUES ('k', :t, 'paused')"), {"t": lease.token})
        ready.set()
        time.sleep(60)  # SIGSTOPped here by the test


@pytest.mark.parametrize("sql", ["postgresql"], indirect=True)
def test_a_paused_holder_inside_a_fenced_transaction_does_not_block_a_takeover(
    sql: SQLStore, effects: str
) -> None:
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_transaction_then_pause, args=(sql.url, ready))
    holder.start()
    try:
        assert ready.wait(30)
        os.kill(holder.pid, signal.SIGSTOP)
        taker = SQLStore(sql.url, SessionLimits(lock=1.0))
        deadline = time.monotonic() + 30  # far beyond ttl + idle_in_transaction timeout: a poll bound only
        while True:
            try:
                lease = taker.acquire("k", "taker", TTL)
                break
            except (LeaseHeld, StoreUnavailable):
                assert time.monotonic() < deadline, "the paused holder blocked the takeover"
                time.sleep(0.1)
        assert [e.event for e in taker.history("k")][-1] == "takeover"
        with taker.engine.connect() as conn:  # the paused holder's write never committed
            assert conn.execute(text("SELECT count(*) FROM fence_test_effects")).scalar() == 0
        taker.complete(lease, "ok")
        taker.close()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        os.kill(holder.pid, signal.SIGCONT)
        holder.join(10)


def test_racing_processes_on_one_key(sql: SQLStore, effects: str) -> None:
    result = race(sql.url, keys=["one"], processes=8, rounds=60)
    assert result.completions == {"one": 1}
    result.check_tokens()


def test_racing_processes_on_many_keys(sql: SQLStore, effects: str) -> None:
    keys = [f"key{i}" for i in range(20)]
    result = race(sql.url, keys=keys, processes=8, rounds=40)
    assert result.completions == dict.fromkeys(keys, 1)
    result.check_tokens()
    history = sql.history()
    for key in keys:
        issued = [e.token for e in history if e.key == key and e.event in ("acquire", "takeover")]
        assert issued == sorted(issued) and len(set(issued)) == len(issued)


def test_migrate_is_idempotent(sql: SQLStore) -> None:
    sql.migrate()
    sql.migrate()
    lease = sql.acquire("k", "a", TTL)
    sql.migrate()
    assert sql.get("k").token == lease.token


def test_tables_created_by_someone_else_are_not_adopted(sql: SQLStore) -> None:
    with sql.engine.begin() as conn:
        conn.execute(text("CREATE TABLE fence_leases (key VARCHAR(10) PRIMARY KEY)"))
    with pytest.raises(ConfigurationError, match="did not create"):
        sql.acquire("k", "a", TTL)


def test_a_rewound_counter_is_refused(sql: SQLStore) -> None:
    for i in range(10):
        sql.complete(sql.acquire(f"other{i}", "a", TTL), i)
    lease = sql.acquire("k", "a", TTL)
    _expire(sql)
    with sql.engine.begin() as conn:  # what an async failover or an old backup does to the counter
        if sql.dialect == "postgresql":
            conn.execute(text("SELECT setval('fence_token_seq', 1)"))
        else:
            conn.execute(text("UPDATE fence_counter SET value = 0"))
    before = sql.history()
    with pytest.raises(TokenRewound, match=r"celery fence advance"):
        sql.acquire("k", "b", TTL)
    assert sql.history() == before
    assert sql.get("k").token == lease.token
    sql.advance(1000)
    assert sql.acquire("k", "b", TTL).token > lease.token


def test_a_rewound_counter_is_not_noticed_on_a_new_key(sql: SQLStore) -> None:
    """The documented limit (stores.md, honest limits): the triggers guard keys whose row survived only."""
    issued = [sql.acquire(f"old{i}", "a", TTL).token for i in range(5)]
    with sql.engine.begin() as conn:
        if sql.dialect == "postgresql":
            conn.execute(text("SELECT setval('fence_token_seq', :v)"), {"v": issued[0]})
        else:
            conn.execute(text("UPDATE fence_counter SET value = :v"), {"v": issued[0]})
    assert sql.acquire("new", "b", TTL).token in issued  # a token issued before: what advance is for
    sql.advance(1000)
    assert sql.acquire("newer", "b", TTL).token > max(issued)


def test_an_unreachable_server_is_store_unavailable() -> None:
    store = open_store("postgresql+psycopg://postgres@127.0.0.1:1/nothing?connect_timeout=1")
    with pytest.raises(StoreUnavailable, match=r"127\.0\.0\.1:1"):
        store.acquire("k", "a", TTL)
    store.close()


@pytest.fixture
def pg(request: pytest.FixtureRequest) -> Iterator[SQLStore]:
    yield from HARNESSES["postgresql"].open(request)


@pytest.fixture
def pg_effects(pg: SQLStore) -> str:
    return _effects_table(pg)


def _end_session(store: SQLStore, pid: int | None = None) -> None:
    """pg_terminate_backend of one of ``store``'s sessions (by default: its idle pooled one)."""
    if pid is None:
        with store.engine.connect() as conn:  # checked out and back: the pool's idle connection
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
    admin = SQLStore(store.url.split("?")[0])
    with admin.autocommit_engine.connect() as conn:
        assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar()
        # Until it has exited, and so said goodbye on its socket: pg_terminate_backend only signals it (CI
        # once found the session still quiet on checkout, and the statement met the goodbye instead).
        alive = text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p")
        wait_for(lambda: not conn.execute(alive, {"p": pid}).scalar(), what=f"session {pid} to exit")
    admin.close()


def _end_every_session(store: SQLStore) -> None:
    """pg_terminate_backend of every celery-fence session on the store's database, as a store restart or an
    operator would: the store's pooled connections and the one it holds for its hot statements, all idle."""
    store.renew([store.acquire("warm", "w", TTL)], TTL)  # so that the held connection exists
    with store.engine.connect(), store.autocommit_engine.connect():  # and a pooled one of each engine
        pass
    others = (
        "FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'celery-fence'"
        " AND pid <> pg_backend_pid()"
    )
    admin = SQLStore(store.url.split("?")[0])
    with admin.autocommit_engine.connect() as conn:
        assert conn.execute(text(f"SELECT count(pg_terminate_backend(pid)) {others}")).scalar() >= 3
        deadline = time.monotonic() + 10  # until they have exited (and so said goodbye on their sockets)
        while conn.execute(text(f"SELECT count(*) {others}")).scalar() and time.monotonic() < deadline:
            time.sleep(0.01)
    admin.close()


def test_a_fenced_transaction_replaces_a_pooled_connection_the_server_ended(
    pg: SQLStore, pg_effects: str
) -> None:
    lease = pg.acquire("k", "a", TTL)
    _end_session(pg)
    with pg.transaction(lease) as conn:
        conn.execute(text(f"INSERT INTO {pg_effects} VALUES ('k', :t, 'a')"), {"t": lease.token})
    _end_session(pg)
    pg.save_step(lease, "s", 1)
    with pg.engine.connect() as conn:
        assert conn.execute(text(f"SELECT token FROM {pg_effects}")).scalars().all() == [lease.token]
    assert pg.steps("k") == {"s": 1}


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_every_operation_replaces_the_pooled_connections_the_server_ended(
    pg: SQLStore, operation: str
) -> None:
    """Ended while idle in the pool, a connection is found out on checkout, before a statement is sent on
    it: the operation runs once, on a fresh connection, instead of failing as StoreUnavailable (a
    statement that failed in flight could not be told apart from one that ran and lost its reply)."""
    lease = pg.acquire("k", "a", TTL)
    _end_every_session(pg)
    run_and_check(pg, lease, operation)


def test_a_connection_lost_in_the_callers_statements_is_the_store_unavailable(
    pg: SQLStore, pg_effects: str
) -> None:
    lease = pg.acquire("k", "a", TTL)
    with pytest.raises(StoreUnavailable, match="nothing of it was committed"), pg.transaction(lease) as conn:
        conn.execute(text(f"INSERT INTO {pg_effects} VALUES ('k', :t, 'a')"), {"t": lease.token})
        _end_session(pg, conn.execute(text("SELECT pg_backend_pid()")).scalar())
        conn.execute(text("SELECT 1"))
    with pg.engine.connect() as conn:
        assert conn.execute(text(f"SELECT count(*) FROM {pg_effects}")).scalar() == 0  # nothing committed


# A connection's identity: its server session on PostgreSQL; on SQLite (no server) a random id kept in a
# TEMP table, which exists on that one connection only (made on first sight, read back afterwards).
_PG_ID = "SELECT CAST(pg_backend_pid() AS TEXT)"
_SQLITE_ID = (
    "CREATE TEMP TABLE IF NOT EXISTS fence_test_conn_id AS SELECT hex(randomblob(8)) AS id",
    "SELECT id FROM fence_test_conn_id",
)


def _dbapi_identity(store: SQLStore, dbapi_conn: Any) -> str:
    if store.dialect == "postgresql":
        return str(dbapi_conn.info.backend_pid)
    dbapi_conn.execute(_SQLITE_ID[0])
    return str(dbapi_conn.execute(_SQLITE_ID[1]).fetchone()[0])


def _identity(store: SQLStore, conn: Any) -> str:
    if store.dialect == "postgresql":
        return str(conn.execute(text(_PG_ID)).scalar())
    conn.execute(text(_SQLITE_ID[0]))
    return str(conn.execute(text(_SQLITE_ID[1])).scalar())


def _sessions(store: SQLStore) -> set[str]:
    """The connections behind ``store``'s held connection and a pooled one of each engine."""
    store.renew([store.acquire(f"probe-{os.getpid()}", "p", TTL)], TTL)  # the held connection, in use
    held = store.connections._hot._held
    assert held is not None
    found = {_dbapi_identity(store, held[0].dbapi_connection)}
    for engine in (store.engine, store.autocommit_engine):
        with engine.begin() as conn:  # committed: SQLite's TEMP table outlives the transaction
            found.add(_identity(store, conn))
    return found


def _child_sessions(store: SQLStore, out: Any) -> None:
    out.put(sorted(_sessions(store)))
    store.close()  # must leave the parent's connections alone


def test_a_forked_child_never_talks_on_the_parents_connections(sql: SQLStore) -> None:
    """A store used across fork: the child opens its own connections (for the held connection and both
    pools) instead of using the parent's (on PostgreSQL its sockets; on SQLite its file handles and
    locks, which SQLite forbids carrying across fork), and closing it there leaves the parent's alone."""
    parent = _sessions(sql)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_sessions, args=(sql, out))
    child.start()
    theirs = set(out.get(timeout=30))
    child.join(30)
    assert child.exitcode == 0
    assert len(parent) == 3 and len(theirs) == 3 and not theirs & parent
    assert _sessions(sql) == parent  # the parent's connections are still there and work
