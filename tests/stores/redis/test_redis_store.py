"""What only the Redis store promises: one round trip per operation, NOSCRIPT recovery, the token-rewind
guard, clear errors for bad servers and URLs, and safety under real processes racing on one server.

Everything runs on the harness's private redis-server (never the shared one on 6379).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import socket
import time
import traceback
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.connection import Connection

from celery_fence import open_store
from celery_fence.errors import (
    AlreadyDone,
    ConfigurationError,
    FenceError,
    InvalidArgument,
    LeaseHeld,
    StaleToken,
    StoreUnavailable,
    TokenRewound,
)
from celery_fence.lease import Lease, LeaseState, new_owner
from celery_fence.stores.redis import RedisStore
from celery_fence.stores.redis import store as redis_store
from celery_fence.testing import free_port
from tests.servers.redis import RedisServer, drop_prefix
from tests.support.harnesses import HARNESSES
from tests.support.harnesses.redis import shared_server
from tests.support.reconnect import OPERATIONS, run_and_check

TTL = 30.0


@pytest.fixture
def server(request: pytest.FixtureRequest) -> RedisServer:
    assert HARNESSES["redis"].multiprocess
    return shared_server(request)


@pytest.fixture
def prefix(server: RedisServer) -> Iterator[str]:
    name = f"r{uuid.uuid4().hex[:12]}:"
    yield name
    drop_prefix(server, name)


@pytest.fixture
def rstore(server: RedisServer, prefix: str) -> Iterator[RedisStore]:
    store = open_store(server.url(prefix=prefix))
    assert isinstance(store, RedisStore)
    yield store
    store.close()


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every command any redis-py connection in this process writes to a socket: one per round trip."""
    commands: list[bytes] = []
    original = Connection.send_packed_command

    def counting(self: Connection, command: Any, check_health: bool = True) -> None:
        parts = command if isinstance(command, list) else [command]
        commands.append(b"".join(bytes(p) for p in parts).split(b"\r\n")[2])
        original(self, command, check_health)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(Connection, "send_packed_command", counting)
    return commands


def snapshot(server: RedisServer, prefix: str) -> dict[str, Any]:
    """Every key under the prefix with its value: to prove that nothing was written."""
    out: dict[str, Any] = {}
    with server.client() as client:
        for name in client.scan_iter(match=f"{prefix}*"):
            kind = client.type(name)
            read = {"string": client.get, "hash": client.hgetall, "set": client.smembers}
            read |= {"list": lambda n: client.lrange(n, 0, -1)}
            read |= {"zset": lambda n: client.zrange(n, 0, -1, withscores=True)}
            out[name] = (kind, read[kind](name))
    return out


def state(store: Any, key: str) -> LeaseState:
    found: LeaseState | None = store.get(key)
    assert found is not None, key
    return found


# -- round trips --


def test_each_operation_is_one_round_trip(rstore: RedisStore, sent: list[bytes]) -> None:
    many = [rstore.acquire(f"m{i}", "w", TTL) for i in range(10_000)]
    lease = rstore.acquire("k", "w", TTL)
    rstore.renew([lease], TTL)  # every script used below runs once first: loaded
    rstore.save_step(lease, "s0", 0)
    rstore.refuse(lease, "x")
    rstore.complete(rstore.acquire("warm", "w", TTL), 1)
    rstore.release(many[-1])
    rstore.get("k")
    rstore.history("k")  # the pooled client's own connection (scripts run on the held one): opened
    rstore.advance(1)  # a script too
    operations: dict[str, Callable[[], object]] = {
        "acquire": lambda: rstore.acquire("k2", "w", TTL),
        "renew 1": lambda: rstore.renew([lease], TTL),
        "renew 1000": lambda: rstore.renew(many[:1000], TTL),
        "renew 10000": lambda: rstore.renew(many[:10_000], TTL),
        "save_step": lambda: rstore.save_step(lease, "s1", {"a": 1}),
        "refuse": lambda: rstore.refuse(lease, "check"),
        "complete": lambda: rstore.complete(lease, {"ok": True}),
        "release": lambda: rstore.release(many[0]),
        "get": lambda: rstore.get("k"),
        "history": lambda: rstore.history("k"),
        "advance": lambda: rstore.advance(10),
    }
    print("\nRedis store round trips (commands sent):")
    for name, operation in operations.items():
        sent.clear()
        started = time.perf_counter()
        operation()
        elapsed = (time.perf_counter() - started) * 1000
        print(f"  {name:12} {len(sent)}  {[c.decode() for c in sent]}  {elapsed:.1f} ms")
        assert len(sent) == 1, (name, sent)
    assert rstore.renew(many[1:-1], TTL) == []  # the 10,000-lease renews really renewed


def test_admin_operations_round_trips(rstore: RedisStore, sent: list[bytes]) -> None:
    """abandoned, prune and leases read an index first (two round trips); recover is one."""

    def cycle(tag: str) -> dict[str, int]:
        rstore.acquire(f"{tag}-lost", "w", TTL, {"task": "t", "id": tag, "args": [], "kwargs": {}})
        rstore.complete(rstore.acquire(f"{tag}-done", "w", TTL), 1)
        HARNESSES["redis"].expire_all(rstore)
        counts, found = {}, []
        operations: dict[str, Callable[[], object]] = {
            "abandoned": lambda: found.extend(rstore.abandoned(0.0)),
            "recover": lambda: rstore.recover(found[0], 3),
            "force_release": lambda: rstore.force_release(f"{tag}-lost"),
            "prune": lambda: rstore.prune(0.0),
            "leases": rstore.leases,
        }
        for name, operation in operations.items():
            sent.clear()
            operation()
            counts[name] = len(sent)
        return counts

    cycle("warm")  # loads every script once
    counts = cycle("measured")
    print(f"\nadmin round trips: {counts}")
    assert counts == {"abandoned": 2, "recover": 1, "force_release": 1, "prune": 2, "leases": 2}


def test_prune_in_batches_drops_old_markers_before_writing_its_own(
    rstore: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of 2: [a b] [c d] [e f] mixes old markers and finished keys in one script call."""
    monkeypatch.setattr(redis_store, "READ_BATCH", 2)
    for keys in ("abc", "def"):
        for key in keys:
            rstore.complete(rstore.acquire(key, "w", TTL), key)
        assert rstore.prune(0.0) == 3
    assert [(e.key, e.event) for e in rstore.history()] == [(k, "pruned") for k in "def"]


def test_noscript_fallback_after_script_flush(
    rstore: RedisStore, server: RedisServer, sent: list[bytes]
) -> None:
    first = rstore.acquire("a", "w", TTL)
    with server.client() as admin:
        admin.script_flush()
    sent.clear()
    second = rstore.acquire("b", "w", TTL)
    print(f"\nacquire right after SCRIPT FLUSH: {[c.decode() for c in sent]}")
    assert [c.upper() for c in sent] == [b"EVALSHA", b"SCRIPT", b"EVALSHA"]
    assert second.token > first.token
    sent.clear()
    rstore.acquire("c", "w", TTL)
    assert len(sent) == 1


# -- the token-rewind guard --


def test_counter_set_back_is_refused_and_writes_nothing(
    rstore: RedisStore, server: RedisServer, prefix: str
) -> None:
    old = rstore.acquire("k", "a", TTL)
    rstore.release(old)
    with server.client() as admin:
        admin.set(f"{prefix}counter", 0)  # what a failover or restore that lost increments looks like
    before = snapshot(server, prefix)
    with pytest.raises(TokenRewound) as info:
        rstore.acquire("k", "b", TTL)
    assert "celery fence advance" in str(info.value)
    with pytest.raises(TokenRewound):
        rstore.force_release("k")
    assert snapshot(server, prefix) == before
    rstore.advance(1_000_000)
    assert rstore.acquire("k", "b", TTL).token > old.token


def test_evicted_counter_is_refused_for_a_new_key_too(
    rstore: RedisStore, server: RedisServer, prefix: str
) -> None:
    rstore.complete(rstore.acquire("done", "a", TTL), 1)
    with server.client() as admin:
        admin.delete(f"{prefix}counter")
    before = snapshot(server, prefix)
    with pytest.raises(TokenRewound):
        rstore.acquire("never-seen", "b", TTL)  # caught by the highest token issued, kept apart
    assert snapshot(server, prefix) == before


def test_empty_restart_is_the_documented_limit_and_advance_heals_it(tmp_path: Path) -> None:
    """A restart without persistence leaves nothing to compare with (the documented limit: tokens start
    over). A holder that comes back presents a token above the counter, but a presented token is no
    evidence (it may be forged): it is refused and moves nothing. ``advance`` heals the store."""
    own = RedisServer(tmp_path).start()
    try:
        store = open_store(own.url())
        for i in range(5):
            store.complete(store.acquire(f"old{i}", "a", TTL), i)
        held = store.acquire("k", "a", TTL)
        own.restart()
        assert store.get("k") is None  # the pooled connection was replaced; no driver error leaks
        assert store.acquire("fresh", "b", TTL).token == 1  # the limit: nothing stored to compare
        assert store.renew([held], TTL) == [held]  # the holder returns with a token above the counter
        assert store.acquire("another", "b", TTL).token == 2  # refused, and it moved nothing
        store.advance(1_000)
        assert store.acquire("k", "b", TTL).token > held.token
        store.close()
    finally:
        own.stop()


# -- bad servers, URLs and arguments --


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_every_operation_reconnects_a_connection_the_server_closed(tmp_path: Path, operation: str) -> None:
    """CLIENT KILL of the store's idle connections (the one it holds for scripts, the pooled one), on a
    server of its own: found before a command is sent on them, so the operation runs once, on a new
    connection, instead of failing as StoreUnavailable."""
    own = RedisServer(tmp_path).start()
    try:
        store = open_store(own.url())
        assert isinstance(store, RedisStore)
        lease = store.acquire("k", "a", TTL)
        store.history("k")  # the pooled connection exists too
        with own.client() as admin:
            assert admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes") >= 2
            deadline = time.monotonic() + 10
            while len(admin.client_list()) > 1 and time.monotonic() < deadline:
                time.sleep(0.01)
        run_and_check(store, lease, operation)
        store.close()
    finally:
        own.stop()


def test_unreachable_server_is_store_unavailable() -> None:
    port = free_port()
    store = open_store(f"redis://:hunter2@127.0.0.1:{port}/0")
    with pytest.raises(StoreUnavailable) as info:
        store.acquire("k", "a", TTL)
    assert f"127.0.0.1:{port}" in str(info.value) and "hunter2" not in str(info.value)
    assert isinstance(info.value.__cause__, redis.ConnectionError)
    store.close()


def test_silent_server_times_out_as_store_unavailable() -> None:
    with socket.socket() as listener:  # accepts connections (backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        store = open_store(f"redis://127.0.0.1:{listener.getsockname()[1]}/0", timeout=0.3)
        with pytest.raises(StoreUnavailable) as info:
            store.renew([Lease("k", 1, "a")], TTL)
        assert isinstance(info.value.__cause__, redis.TimeoutError)
        store.close()


def test_wrong_database_number_is_a_configuration_error(server: RedisServer, prefix: str) -> None:
    store = open_store(server.url(db=99, prefix=prefix))
    with pytest.raises(ConfigurationError) as info:
        store.acquire("k", "a", TTL)
    assert "database" in str(info.value)
    with pytest.raises(ConfigurationError):
        store.migrate()
    store.close()
    assert snapshot(server, prefix) == {}


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1/abc",
        "redis://127.0.0.1:notaport/0",
        "redis://127.0.0.1/0?frobnicate=1",
        "redis://127.0.0.1/0?prefix=a{b",
        "redis://127.0.0.1/0?prefix=",
        "http://127.0.0.1/0",
    ],
)
def test_bad_urls_are_refused_at_once(url: str) -> None:
    with pytest.raises(ConfigurationError):
        RedisStore(url)


def test_prefix_in_url_and_argument_must_agree() -> None:
    with pytest.raises(ConfigurationError):
        RedisStore("redis://127.0.0.1/0?prefix=a:", prefix="b:")
    assert RedisStore("redis://127.0.0.1/0?prefix=a:", prefix="a:").prefix == "a:"
    assert RedisStore("redis://127.0.0.1/0").prefix == "fence:"


def test_everything_lives_under_the_prefix(server: RedisServer, prefix: str) -> None:
    with server.client() as admin:
        before = set(admin.scan_iter(count=1000))
    other = f"{prefix}other:"
    one, two = open_store(server.url(prefix=prefix)), open_store(server.url(prefix=other))
    a = one.acquire("k", "a", TTL)
    b = two.acquire("k", "b", TTL)  # the same key under another prefix: independent
    one.save_step(a, "s", 1)
    one.complete(a, 1)
    two.release(b)
    assert [s.key for s in one.leases()] == ["k"]
    assert state(one, "k").done and not state(two, "k").done
    with server.client() as admin:
        created = set(admin.scan_iter(count=1000)) - before
    assert created and all(name.startswith(prefix) for name in created)
    one.close()
    two.close()


def test_driver_errors_never_leak(rstore: RedisStore, server: RedisServer, prefix: str) -> None:
    with server.client() as admin:
        admin.set(f"{prefix}counter", "not a number")
    with pytest.raises(StoreUnavailable) as info:
        rstore.acquire("k", "a", TTL)
    assert isinstance(info.value.__cause__, redis.ResponseError)
    with server.client() as admin:
        admin.set(f"{prefix}lease:{{k}}", "wrong type")
    with pytest.raises(FenceError):
        rstore.complete(Lease("k", 1, "a"), 1)


def test_unencodable_key_is_invalid_and_writes_nothing(
    rstore: RedisStore, server: RedisServer, prefix: str
) -> None:
    with pytest.raises(InvalidArgument):
        rstore.acquire("bad\ud800", "a", TTL)
    assert snapshot(server, prefix) == {}


def test_huge_ttl_is_refused_not_truncated(rstore: RedisStore) -> None:
    with pytest.raises(InvalidArgument):
        rstore.acquire("k", "a", 1e300)
    assert rstore.get("k") is None


# -- processes --


def _use_inherited(store: RedisStore, key: str) -> None:
    store.complete(store.acquire(key, "child", TTL), os.getpid())


def test_a_forked_child_makes_its_own_client(rstore: RedisStore) -> None:
    rstore.acquire("parent", "p", TTL)  # the parent's client exists and is connected
    child = multiprocessing.get_context("fork").Process(target=_use_inherited, args=(rstore, "child"))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert state(rstore, "child").done and state(rstore, "child").result == child.pid
    assert rstore.acquire("parent", "p", TTL).token > 0  # the parent's client still works


def test_threads_share_one_store_from_a_cold_start(server: RedisServer, prefix: str) -> None:
    store = open_store(server.url(prefix=prefix))  # no client yet: the threads race to make it

    def run(i: int) -> int:
        lease = store.acquire(f"t{i}", f"thread-{i}", TTL)
        assert store.renew([lease], TTL) == []
        store.complete(lease, i)
        return lease.token

    with ThreadPoolExecutor(16) as pool:
        tokens = list(pool.map(run, range(64)))
    assert len(set(tokens)) == 64 and all(state(store, f"t{i}").result == i for i in range(64))
    store.close()


def _racer(url: str, keys: list[str], seed: int, barrier: Any, results: Any) -> None:
    try:
        results.put(_race(url, keys, seed, barrier))
    except BaseException:  # report it: a silent child would only show as a timeout
        results.put(traceback.format_exc())


def _race(url: str, keys: list[str], seed: int, barrier: Any) -> Any:
    store, rng = open_store(url), random.Random(seed)
    pending, acquired, completed = list(keys), [], []
    barrier.wait(60)
    deadline = time.monotonic() + 60
    while pending and time.monotonic() < deadline:
        key = rng.choice(pending)
        try:
            lease = store.acquire(key, new_owner(), 0.05)
        except LeaseHeld:
            time.sleep(rng.uniform(0, 0.005))
            continue
        except AlreadyDone:
            pending.remove(key)
            continue
        acquired.append((key, lease.token))
        # Every process's first run outlives its ttl (a pause), later ones often do: takeovers follow.
        time.sleep(0.15 if len(acquired) == 1 else rng.choice([0, 0.01, 0.08]))
        if rng.random() < 0.3 and store.renew([lease], 0.05):
            continue  # lost: a newer holder exists
        try:
            store.complete(lease, {"token": lease.token, "pid": os.getpid()})
            completed.append((key, lease.token))
        except StaleToken:
            pass
    store.close()
    return acquired, completed, pending


@pytest.mark.parametrize("n_keys", [1, 20])
def test_eight_processes_race(server: RedisServer, prefix: str, n_keys: int) -> None:
    keys = [f"job-{i}" for i in range(n_keys)]
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(8), ctx.Queue()
    url = server.url(prefix=prefix)
    procs = [ctx.Process(target=_racer, args=(url, keys, i, barrier, results)) for i in range(8)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    assert not [o for o in outcomes if isinstance(o, str)], [o for o in outcomes if isinstance(o, str)]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    tokens = [t for acquired, _, _ in outcomes for _, t in acquired]
    assert len(tokens) == len(set(tokens)), "a token was issued twice"
    wins = Counter(key for _, completed, _ in outcomes for key, _ in completed)
    assert wins == Counter(keys), "not exactly one completion per key"
    assert all(not pending for _, _, pending in outcomes)
    store = open_store(url)
    issued: dict[str, list[int]] = defaultdict(list)
    for key in keys:
        latest = 0
        for event in store.history(key):
            if event.event in ("acquire", "takeover"):
                assert event.token > latest, f"{key}: tokens not increasing"
                latest = event.token
                issued[key].append(event.token)
            if event.event == "complete":
                assert event.token == latest, f"{key}: a stale token completed"
        completes = [e for e in store.history(key) if e.event == "complete"]
        assert len(completes) == 1 and state(store, key).result["token"] == completes[0].token
    assert sorted(t for ts in issued.values() for t in ts) == sorted(tokens)
    takeovers = sum(e.event == "takeover" for e in store.history())
    fenced = sum(e.event in ("refused", "renew-failed") for e in store.history())
    print(f"\n8 processes, {n_keys} keys: {len(tokens)} tokens, {takeovers} takeovers, {fenced} fenced out")
    assert takeovers >= 1 and fenced >= 1  # the fencing was exercised, not just the happy path
    store.close()
