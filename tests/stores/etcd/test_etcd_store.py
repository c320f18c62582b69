"""What only the etcd store promises: round trips, etcd leases, ttl rounding, clear errors, races."""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from celery_fence import (
    AlreadyDone,
    ConfigurationError,
    InvalidArgument,
    Lease,
    LeaseHeld,
    StaleToken,
    StoreUnavailable,
    open_store,
)
from celery_fence.lease import new_owner
from celery_fence.stores.etcd import EtcdStore
from celery_fence.stores.etcd.gateway import get as range_of
from celery_fence.stores.etcd.gateway import put
from celery_fence.stores.etcd.http import EtcdConnection
from celery_fence.stores.etcd.leases import lease_seconds
from celery_fence.testing import free_port
from tests.servers.etcd import EtcdServer
from tests.support.harnesses import HARNESSES
from tests.support.harnesses.etcd import shared_server

TTL = 30.0


@pytest.fixture
def estore(request: pytest.FixtureRequest) -> Iterator[EtcdStore]:
    yield from HARNESSES["etcd"].open(request)


class RoundTrips:
    """Counts HTTP requests sent to etcd, by gateway path."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        original = EtcdConnection.request

        def counting(conn: EtcdConnection, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            self.paths.append(url.split("/v3", 1)[-1])
            return original(conn, method, url, *args, **kwargs)

        monkeypatch.setattr(EtcdConnection, "request", counting)

    def count(self, fn: Callable[..., Any], *args: Any) -> int:
        self.paths.clear()
        fn(*args)
        return len(self.paths)


def _lease_of(store: EtcdStore, key: str) -> int:
    """The etcd lease the key's lock is attached to."""
    lock = store.gateway.txn([], [range_of(store.space.k("lock", key))]).first(0)
    assert lock is not None
    return lock.lease


def _granted_ttl(store: EtcdStore, lease_id: int) -> int:
    return int(store.gateway.call("/lease/timetolive", {"ID": str(lease_id)})["grantedTTL"])


def test_http_round_trips_of_each_operation_renew_the_same_for_any_count(
    estore: EtcdStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    trips = RoundTrips(monkeypatch)
    assert trips.count(estore.acquire, "first", "w", TTL) == 2  # grant of the process's etcd lease + Txn
    assert trips.paths == ["/lease/grant", "/kv/txn"]
    leases = [estore.acquire(f"k{i}", "w", TTL) for i in range(1000)]
    measured = {}
    for n in (1, 100, 1000):
        measured[n] = trips.count(estore.renew, leases[:n], TTL)
        assert trips.paths == ["/kv/txn", "/lease/keepalive"], f"renew of {n} leases"
    assert trips.count(estore.acquire, "new", "w", TTL) == 1  # the etcd lease was just kept alive
    assert trips.count(estore.complete, leases[0], {"ok": True}) == 1
    assert trips.count(estore.release, leases[1]) == 1
    assert trips.count(estore.save_step, leases[2], "s", 1) == 1
    assert trips.count(estore.get, "k3") == 2  # Txn + time-to-live of the lock's etcd lease
    assert trips.count(estore.renew, [leases[0]], TTL) == 2  # Txn, renew-failed event (no live lock)
    with pytest.raises(StaleToken):
        trips.count(estore.complete, leases[0], 1)
    assert len(trips.paths) == 2  # refused Txn + the refused event
    with pytest.raises(LeaseHeld):
        trips.count(estore.acquire, "k3", "other", TTL)
    assert len(trips.paths) == 2  # failed Txn + time-to-live for expires_in
    print(f"\netcd round trips: renew of 1/100/1000 leases {measured[1]}/{measured[100]}/{measured[1000]}")


def test_stale_etcd_lease_is_kept_alive_before_a_new_lock(
    estore: EtcdStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    estore.acquire("a", "w", 2.0)
    time.sleep(0.15)  # more than a twentieth of 2 s
    trips = RoundTrips(monkeypatch)
    assert trips.count(estore.acquire, "b", "w", 2.0) == 2
    assert trips.paths == ["/lease/keepalive", "/kv/txn"]


def test_revoked_etcd_lease_loses_every_lease_on_it(estore: EtcdStore) -> None:
    leases = [estore.acquire(f"k{i}", "w", TTL) for i in range(3)]
    lease_id = _lease_of(estore, "k0")
    estore.gateway.call("/lease/revoke", {"ID": str(lease_id)})  # behind the store's back
    assert estore.gateway.keepalive(lease_id) == 0  # the gateway answers 200 without a TTL
    assert estore.renew(leases, TTL) == leases
    assert ("renew-failed", leases[0].token) in [(e.event, e.token) for e in estore.history("k0")]
    for lease in leases:
        with pytest.raises(StaleToken):
            estore.complete(lease, "too late")
    again = estore.acquire("k0", "w2", TTL)  # a new etcd lease is granted for it
    assert again.token > leases[-1].token
    assert _lease_of(estore, "k0") != lease_id
    assert [e.event for e in estore.history("k0")][-1] == "takeover"


def test_a_revoked_cached_etcd_lease_is_replaced_on_acquire(estore: EtcdStore) -> None:
    estore.acquire("a", "w", TTL)
    lease_id = _lease_of(estore, "a")
    estore.gateway.call("/lease/revoke", {"ID": str(lease_id)})
    lease = estore.acquire("b", "w", TTL)  # the Txn names a lease etcd no longer has: grant, try again
    assert lease.token > 0 and _lease_of(estore, "b") != lease_id


def test_expired_lease_is_gone_on_etcd(estore: EtcdStore) -> None:
    lease = estore.acquire("k", "a", TTL)
    estore.etcd_leases.revoke_all()
    state = estore.get("k")
    assert state is not None and (state.token, state.expires_in, state.done) == (lease.token, 0.0, False)
    assert estore.renew([lease], TTL) == [lease]
    with pytest.raises(StaleToken) as info:
        estore.complete(lease, 1)
    assert info.value.current is None  # nobody holds it: not "stale, current: <its own token>"
    newer = estore.acquire("k", "b", TTL)
    assert newer.token > lease.token
    with pytest.raises(StaleToken) as info:
        estore.save_step(lease, "s", 1)
    assert info.value.current == newer.token


@pytest.mark.parametrize(("ttl", "seconds"), [(0.5, 2), (1, 2), (2, 2), (2.1, 3), (30.0, 30)])
def test_ttl_is_rounded_up_to_whole_seconds_at_least_2(estore: EtcdStore, ttl: float, seconds: int) -> None:
    assert lease_seconds(ttl) == seconds
    estore.acquire("k", "w", ttl)
    assert _granted_ttl(estore, _lease_of(estore, "k")) == seconds


def test_one_etcd_lease_per_distinct_ttl(estore: EtcdStore) -> None:
    for i, ttl in enumerate([10, 9.5, 10.0, 20]):
        estore.acquire(f"k{i}", "w", ttl)
    ids = [_lease_of(estore, f"k{i}") for i in range(4)]
    assert ids[0] == ids[1] == ids[2] != ids[3]


def test_unreachable_server_is_store_unavailable() -> None:
    store = EtcdStore(f"etcd://127.0.0.1:{free_port()}/x/", timeout=(1.0, 1.0))
    for call in (lambda: store.acquire("k", "w", TTL), lambda: store.get("k"), store.leases):
        with pytest.raises(StoreUnavailable, match=r"127\.0\.0\.1") as info:
            call()
        assert isinstance(info.value.__cause__, ConnectionRefusedError)
    store.close()


class _NotFound(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_error(404)

    def log_message(self, *args: Any) -> None:
        pass


class _Quiet(SimpleHTTPRequestHandler):  # what ``python -m http.server`` runs: 501 for POST
    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize("handler", [_Quiet, _NotFound])
def test_a_server_without_the_gateway_is_a_configuration_error(handler: Any) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        store = open_store(f"etcd://127.0.0.1:{server.server_address[1]}")
        with pytest.raises(ConfigurationError, match=r"etcd >= 3\.4"):
            store.acquire("k", "w", TTL)
        with pytest.raises(ConfigurationError):
            store.migrate()
    finally:
        server.shutdown()
        server.server_close()


def test_an_etcd_without_its_gateway_is_a_configuration_error(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    server = EtcdServer(request.getfixturevalue("etcd_binary"), tmp_path, "--enable-grpc-gateway=false")
    try:
        store = EtcdStore(server.start().url())
        with pytest.raises(ConfigurationError, match=r"HTTP 404 .*etcd >= 3\.4") as info:
            store.migrate()
        assert str(server.port) in str(info.value)
    finally:
        server.stop()


def test_an_etcd_url_carries_its_key_prefix_and_a_bad_one_is_refused(request: pytest.FixtureRequest) -> None:
    base = shared_server(request).url()
    assert EtcdStore(base).url == f"{base}fence/"
    assert EtcdStore(f"{base}a/b").url == f"{base}a/b/"
    assert EtcdStore(f"{base}a/", prefix="other").url == f"{base}other/"
    assert isinstance(open_store(f"{base}p/"), EtcdStore)
    for bad in ["etcd://", "etcd://h:notaport", "etcd://u:p@h:1", "etcd://h:1/?x=1", "http://h:1"]:
        with pytest.raises(ConfigurationError):
            EtcdStore(bad)
    with pytest.raises(ConfigurationError):
        EtcdStore(base, prefix="/")


def test_keys_with_slashes_and_unicode_stay_apart(estore: EtcdStore) -> None:
    for key in ["a", "a/b", "a%2Fb", "ä/€"]:
        lease = estore.acquire(key, "w", TTL)
        estore.save_step(lease, "x/y", key)
        estore.complete(lease, key)
    for key in ["a", "a/b", "a%2Fb", "ä/€"]:
        assert (estore.get(key) or pytest.fail()).result == key
        assert estore.steps(key) == {"x/y": key}
        assert [e.event for e in estore.history(key)] == ["acquire", "step", "complete"]
    assert [s.key for s in estore.leases()] == sorted(["a", "a/b", "a%2Fb", "ä/€"])


def test_prune_drops_steps_and_history(estore: EtcdStore) -> None:
    lease = estore.acquire("k", "a", TTL)
    estore.save_step(lease, "s", 1)
    estore.complete(lease, 1)
    live = estore.acquire("live", "a", TTL)
    assert estore.prune(3600) == 0
    assert estore.prune(0) == 1
    assert (estore.get("k"), estore.steps("k")) == (None, {})
    # the history goes with the key (growth is bounded); one marker takes its place
    assert [(e.event, e.token) for e in estore.history("k")] == [("pruned", lease.token)]
    assert estore.get("live") is not None
    estore.complete(live, 2)


def test_advance_seen_by_a_handle_with_an_old_offset(estore: EtcdStore) -> None:
    other = EtcdStore(estore.url)
    before = other.acquire("old", "w", TTL)
    floor = estore.advance(1000)
    assert floor >= before.token + 1000
    other.save_step(before, "s", 1)  # other's offset is stale: the Txn notices, reloads it, commits
    other.complete(before, "kept")  # a lease from before the advance keeps its token
    after = other.acquire("new", "w", TTL)
    assert after.token > floor
    estore.complete(after, "fine")  # any handle decodes the token
    assert (estore.history("old")[0].event, estore.history("old")[0].token) == ("acquire", before.token)
    assert (estore.get("new") or pytest.fail()).token == after.token
    second = estore.advance(5)
    assert second >= after.token + 5 and other.acquire("third", "w", TTL).token > second
    assert [(e.event, e.token) for e in other.history("new")] == [
        ("acquire", after.token),
        ("complete", after.token),
    ]
    with pytest.raises(StaleToken):
        other.complete(before, "twice")
    other.close()


def test_force_release_on_etcd(estore: EtcdStore) -> None:
    lease = estore.acquire("k", "a", TTL)
    token = estore.force_release("k")
    state = estore.get("k")
    assert state is not None and (state.token, state.owner, state.expires_in) == (token, None, None)
    with pytest.raises(StaleToken) as info:
        estore.save_step(lease, "s", 1)
    assert info.value.current == token
    with pytest.raises(InvalidArgument):
        estore.force_release("nobody")


def _forked_lease(url: str, out: Any) -> None:
    store = EtcdStore(url)
    store.acquire("child", "c", TTL)
    out.put(_lease_of(store, "child"))


def test_a_forked_child_gets_its_own_etcd_lease(estore: EtcdStore) -> None:
    estore.acquire("parent", "p", TTL)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_forked_lease, args=(estore.url, out))
    child.start()
    child_lease = out.get(timeout=30)
    child.join(30)
    assert child.exitcode == 0
    assert child_lease != _lease_of(estore, "parent")


# -- processes racing --


def _patiently(fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn`` again while the store is unavailable, as a worker does: a loaded machine can stall etcd
    for seconds. An acquire is retried with the same owner, so a lost answer finds its own lease."""
    for _ in range(50):
        try:
            return fn(*args)
        except StoreUnavailable:
            time.sleep(0.2)
    return fn(*args)


def _racer(url: str, keys: list[str], seed: int, out: Any) -> None:
    rng = random.Random(seed)
    store = open_store(url)
    acquired: list[tuple[str, int]] = []
    completed: list[tuple[str, int]] = []
    stale_tries, stale = 0, 0
    for key in rng.sample(keys, len(keys)):
        released = None
        while True:
            try:
                lease = _patiently(store.acquire, key, new_owner(), 2.0)
            except LeaseHeld:
                time.sleep(rng.uniform(0, 0.01))
                continue
            except AlreadyDone:
                break
            acquired.append((key, lease.token))
            if released is None and rng.random() < 0.5:  # give it back once, as a retrying task does
                _patiently(store.release, lease)
                released = lease
                continue
            try:
                _patiently(store.complete, lease, {"token": lease.token, "seed": seed})
                completed.append((key, lease.token))
            except StaleToken:  # it lapsed (a stalled machine), or our own answer was lost
                state = store.get(key)
                if state is not None and state.done and state.token == lease.token:
                    completed.append((key, lease.token))
                    break
                continue
            break
        if released is not None:
            stale_tries += 1
            try:
                _patiently(store.complete, released, "stale")
            except StaleToken:
                stale += 1
    store.close()
    out.put((acquired, completed, stale_tries, stale))


@pytest.mark.parametrize("n_keys", [1, 20])
def test_racing_processes_never_get_a_token_twice_and_complete_each_key_once(
    estore: EtcdStore, n_keys: int
) -> None:
    keys = [f"key{i}" for i in range(n_keys)]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(estore.url, keys, seed, out)) for seed in range(8)]
    for proc in procs:
        proc.start()
    reports: list[Any] = []
    deadline = time.monotonic() + 120
    while len(reports) < len(procs):
        with contextlib.suppress(queue.Empty):
            reports.append(out.get(timeout=0.5))
        crashed = [proc.exitcode for proc in procs if proc.exitcode not in (None, 0)]
        assert not crashed, f"a racer crashed (exit codes {crashed}): see its stderr"
        assert time.monotonic() < deadline, f"racers still running after 120 s: {len(reports)} reported"
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    acquired = [pair for report in reports for pair in report[0]]
    completed = [pair for report in reports for pair in report[1]]
    assert len({token for _, token in acquired}) == len(acquired), "a token was issued twice"
    assert sorted(key for key, _ in completed) == sorted(keys), "not exactly one completion per key"
    assert sum(report[3] for report in reports) == sum(report[2] for report in reports)  # all refused
    by_key = collections.defaultdict(list)
    for key, token in acquired:
        by_key[key].append(token)
    for key in keys:
        events = estore.history(key)
        issued = [e.token for e in events if e.event in ("acquire", "takeover")]
        assert issued == sorted(issued) and sorted(issued) == sorted(by_key[key])
        done = [e.token for e in events if e.event == "complete"]
        assert done == [issued[-1]] == [token for k, token in completed if k == key]
        state = estore.get(key)
        assert state is not None and state.done and state.result["token"] == done[0]
        refused = [e for e in events if e.event == "refused"]
        assert all(e.token < done[0] for e in refused)


def test_abandoned_counts_its_grace_from_when_it_was_first_seen_expired(estore: EtcdStore) -> None:
    run = {"task": "t", "id": "1", "args": [], "kwargs": {}}
    estore.acquire("k", "a", TTL, run)
    estore.etcd_leases.revoke_all()
    held = estore.space.k("held", "k")
    assert estore.abandoned(60.0) == []  # etcd does not say when it expired: stamped now
    stamp = float((estore.gateway.txn([], [range_of(held)]).first(0) or pytest.fail()).value)
    assert abs(stamp - time.time()) < 5
    estore.gateway.txn([], [put(held, repr(stamp - 100))])  # as if first seen expired 100 s ago
    (seen,) = estore.abandoned(60.0)
    assert (seen.key, seen.run, seen.recoveries) == ("k", run, 0)
    estore.acquire("k", "b", TTL)  # a takeover clears the stamp
    assert (estore.gateway.txn([], [range_of(held)]).first(0) or pytest.fail()).value == ""
    assert estore.abandoned(0.0) == []


def test_a_lock_nobody_renews_expires_although_its_etcd_lease_lives(estore: EtcdStore) -> None:
    """Other locks keep the process's etcd lease alive; a lock left behind (its release failed, its run
    gave up) must still expire after its ttl, as it would on any other store."""
    forgotten = estore.acquire("forgotten", "a", TTL)
    renewed = estore.acquire("renewed", "a", TTL)
    estore.etcd_leases.track(forgotten, TTL, time.monotonic() - TTL - 1)  # last renewed a ttl ago
    assert estore.renew([renewed], TTL) == []
    state = estore.get("forgotten")
    assert state is not None and state.expires_in == 0.0  # expired, not taken over
    assert (estore.get("renewed") or pytest.fail()).expires_in
    other = EtcdStore(estore.url)
    assert other.acquire("forgotten", "b", TTL).token > forgotten.token
    assert [e.event for e in estore.history("forgotten")] == ["acquire", "takeover"]
    other.etcd_leases.revoke_all()
    other.close()


def _lose_the_next_answer(store: EtcdStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next Txn commits, but its answer never arrives."""
    real = store.gateway.txn

    def txn(*args: Any) -> Any:
        monkeypatch.setattr(store.gateway, "txn", real)
        real(*args)
        raise StoreUnavailable("answer lost")

    monkeypatch.setattr(store.gateway, "txn", txn)


def test_an_acquire_whose_answer_was_lost(estore: EtcdStore, monkeypatch: pytest.MonkeyPatch) -> None:
    _lose_the_next_answer(estore, monkeypatch)
    with pytest.raises(StoreUnavailable):
        estore.acquire("retried", "owner-1", TTL)
    lease = estore.acquire("retried", "owner-1", TTL)  # the same owner finds its lease
    _lose_the_next_answer(estore, monkeypatch)
    with pytest.raises(StoreUnavailable):
        estore.acquire("abandoned", "owner-2", TTL)  # nobody asks again: its lock must still expire
    assert Lease("retried", 0, "owner-1") not in estore.etcd_leases._due  # found again: nothing to expire
    estore.etcd_leases.track(Lease("abandoned", 0, "owner-2"), TTL, time.monotonic() - TTL - 1)  # a ttl ago
    assert estore.renew([lease], TTL) == []
    assert (estore.get("abandoned") or pytest.fail()).expires_in == 0.0
    assert (estore.get("retried") or pytest.fail()).expires_in
    estore.complete(lease, "ok")
