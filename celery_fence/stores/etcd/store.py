"""The etcd store (``etcd://host:port[,host2:port,...][/prefix/]``, prefix ``fence/`` by default) on etcd's v3
JSON gateway, failing over between the members listed (:mod:`.members`).

The layout of the per-key records is in :mod:`celery_fence.stores.etcd.records`.

Round trips: every operation is one ``Txn`` comparing the lock's ``create_revision`` (plus a put of the
``refused`` event when refused). acquire adds a grant or keep-alive when the process's etcd lease is missing
or not refreshed within a twentieth of the ttl; renew of any number of leases is a ``Txn`` and a keep-alive.

Its honest limits (an expired lease's lock is gone, whole-second leases, one etcd lease per process and
ttl, wall-clock ``at``, revisions rewound by a restore, plain HTTP) are in docs/stores.md, "etcd".
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import quote, unquote

from ... import codec
from ...errors import AlreadyDone, InvalidArgument, LeaseHeld, StaleToken, StoreUnavailable
from ...lease import Abandoned, HistoryEvent, Lease, LeaseState
from . import admin, records
from . import gateway as etcd
from .gateway import KV, Op, TxnResult
from .keyspace import KINDS, MAX_OPS, Keyspace
from .leases import CAPABILITIES, ProcessLeases, lease_seconds

__all__ = ["EtcdStore"]

T = TypeVar("T")
_ATTEMPTS = 5  # a Txn spoiled by an advance or by its etcd lease running out is tried again this often
_TIMEOUT = (3.0, 5.0)  # seconds to connect, to read an answer


class EtcdStore:
    """Lease store on etcd; see :class:`celery_fence.stores.base.Store` and this module's limits."""

    # etcd refuses a request over --max-request-bytes (1.5 MiB by default): a record (the result with its
    # token, a step value, the run's record with its owner) is kept to 1 MiB, the rest of a Txn fits beside.
    max_value_bytes = 1024 * 1024
    capabilities = CAPABILITIES

    def __init__(self, url: str, prefix: str | None = None, timeout: tuple[float, float] = _TIMEOUT) -> None:
        members, self.prefix = etcd.parse_url(url, prefix)
        self.url = f"etcd://{','.join(members)}/{quote(self.prefix)}"  # names the same keys in any process
        self.gateway = etcd.Gateway([f"http://{member}" for member in members], timeout)
        self.etcd_leases = ProcessLeases(self.gateway)
        self.space = Keyspace(self.gateway, self.prefix)

    @staticmethod
    def check_url(url: str) -> None:
        """Refuse, without a round trip, a URL the store would refuse (a bad member list...)."""
        etcd.parse_url(url)

    def migrate(self) -> None:
        """Nothing to create; checks that the gateway answers."""
        self.space.read([])

    def acquire(self, key: str, owner: str, ttl: float, run: Mapping[str, Any] | None = None) -> Lease:
        run_text = codec.dumps_mapping(run, self.max_value_bytes // 2)  # JSON in JSON: escapes may double it
        state = json.dumps({"owner": owner, "run": run_text})
        self._expire_overdue()
        return self._retry(f"acquire({key!r})", lambda: self._acquire(key, owner, ttl, state))

    def renew(self, leases: Sequence[Lease], ttl: float) -> list[Lease]:
        if not leases:
            return []
        self._expire_overdue()
        seconds, sent, locks = lease_seconds(ttl), time.monotonic(), self._locks(leases)
        current = {lease for lease in leases if self._holds(locks.get(lease.key), lease)}
        for lease_id in {locks[lease.key].lease for lease in current}:  # usually just this process's
            if not self.etcd_leases.keepalive(seconds, lease_id):  # 200 without a TTL: revoked, expired
                current = {lease for lease in current if locks[lease.key].lease != lease_id}
        for lease in current:
            self.etcd_leases.track(lease, ttl, sent)
        lost = [lease for lease in leases if lease not in current]
        for lease in lost:
            self.etcd_leases.untrack(lease)
        self.space.log([self.space.event(lease, "renew-failed") for lease in lost])
        return lost

    def complete(self, lease: Lease, result: Any) -> None:
        done = {"token": lease.token, "result": codec.dumps(result), "finished_at": time.time()}
        record = json.dumps(done)
        codec.check_size(record, self.max_value_bytes, "the result")  # refused before anything is sent
        ops = [*self.space.free(lease.key), etcd.put(self.space.k("done", lease.key), record)]
        answer = self._fenced(lease, [], [*ops, self.space.event(lease, "complete")])
        self.etcd_leases.untrack(lease)
        if not answer.succeeded:
            self._stale(lease, "complete", answer)

    def release(self, lease: Lease) -> None:
        space = self.space
        self._fenced(lease, [], [*space.free(lease.key), space.event(lease, "release")])  # stale: nothing
        self.etcd_leases.untrack(lease)

    def save_step(self, lease: Lease, name: str, value: Any) -> None:
        step = self.space.k("steps", lease.key) + "/" + quote(name, safe="")
        value_text = codec.dumps(value, self.max_value_bytes)
        ops = [etcd.put(step, value_text), self.space.event(lease, "step", name)]
        answer = self._fenced(lease, [etcd.created(step, 0)], ops)
        if not answer.succeeded and not self._holds(answer.first(2), lease):
            self._stale(lease, f"step {name}", answer)
        if not answer.succeeded:
            raise InvalidArgument(f"step {name!r} of key {lease.key!r} is already committed")

    def steps(self, key: str) -> dict[str, Any]:
        steps = self.space.k("steps", key) + "/"
        found = self.space.read([etcd.get(steps, prefix=True)]).kvs(1)
        return {unquote(kv.key.rsplit("/", 1)[1]): codec.loads(kv.value) for kv in sorted(found, key=_order)}

    def refuse(self, lease: Lease, what: str) -> None:
        self.space.log([self.space.event(lease, "refused", what)])

    def get(self, key: str) -> LeaseState | None:
        ranges = [etcd.get(self.space.k(kind, key)) for kind in KINDS]
        states = records.states(self.space, ranges)
        return states[0] if states else None

    def leases(self) -> list[LeaseState]:
        return records.states(self.space, [etcd.get(self.space.k(kind), prefix=True) for kind in KINDS])

    def history(self, key: str | None = None) -> list[HistoryEvent]:
        return records.history(self.space, key)

    def force_release(self, key: str) -> int:
        return self._retry(f"force_release({key!r})", lambda: admin.force_release(self.space, key))

    def prune(self, older_than: float) -> int:
        return records.prune(self.space, older_than)

    def advance(self, gap: int) -> int:
        """Raise the token offset by ``gap``: tokens are revisions plus an offset (etcd 3.4 cannot bump its
        revision), and every ``Txn`` compares the offset key, so none issues or checks a token with a stale
        one. Returns the floor: at least ``gap`` above every token issued before, below every later one."""
        return self._retry(f"advance({gap})", lambda: admin.advance(self.space, gap))

    def abandoned(self, grace: float, limit: int = 100) -> list[Abandoned]:
        return records.abandoned(self.space, grace, limit)

    def recover(self, seen: Abandoned, max_recoveries: int, reason: str = "") -> int | None:
        return records.recover(self.space, seen, max_recoveries, reason)

    def strand(self, key: str, run: Mapping[str, Any] | None, reason: str) -> bool:
        run_text = codec.dumps_mapping(run, self.max_value_bytes // 2)  # as acquire keeps it
        return self._retry(f"strand({key!r})", lambda: records.strand(self.space, key, reason, run_text))

    def close(self) -> None:
        """Close this process's idle HTTP connections; the etcd leases run out by their ttl. Idempotent."""
        self.gateway.close()

    def _acquire(self, key: str, owner: str, ttl: float, state: str) -> Lease | None:
        seconds = lease_seconds(ttl)
        epochs, lease_id = self.space.epochs, self.etcd_leases.lease_for(seconds)
        k = {kind: self.space.k(kind, key) for kind in KINDS}
        events = [self.space.event(Lease(key, 0, owner), name) for name in ("acquire", "takeover")]
        compare = [etcd.created(k["lock"], 0), etcd.created(k["done"], 0), self.space.offset_is(epochs)]
        log = etcd.nested([etcd.created(k["held"], 0)], events[:1], events[1:])  # acquire, else takeover
        puts = [etcd.put(k["held"], ""), etcd.put(k["state"], state), etcd.put(k["lock"], owner, lease_id)]
        puts.append(etcd.delete(k["dead"]))  # a fresh delivery may run a dead key
        failure, sent = [etcd.get(self.space.offset_key), *map(etcd.get, k.values())], time.monotonic()
        unsure = Lease(key, 0, owner)  # token 0: if the answer is lost, a lock of this owner may exist
        self.etcd_leases.track(unsure, ttl, sent)
        try:
            result = self.gateway.txn(compare, [log, *puts], failure)
        except etcd.LeaseNotFound:  # the process's etcd lease ran out: this keep-alive forgets it
            self.etcd_leases.untrack(unsure)
            self.etcd_leases.keepalive(seconds, lease_id)
            return None
        self.etcd_leases.untrack(unsure)
        if result.succeeded:  # the nested Txn's branch says which event it logged (proto3 omits false)
            taken_over = not result.responses[0].get("response_txn", {}).get("succeeded", False)
            lease: Lease | None = Lease(key, epochs.token(result.revision), owner, taken_over=taken_over)
        else:
            lease = None if self.space.moved(result, epochs) else self._busy(key, owner, result)
        if lease is not None:
            self.etcd_leases.track(lease, ttl, sent)
        return lease

    def _busy(self, key: str, owner: str, failed: TxnResult) -> Lease | None:
        """Why an acquire failed: ``AlreadyDone``, ``LeaseHeld``, our own lease, or ``None`` (try again)."""
        state, lock, _, done = (failed.first(i + 1) for i in range(4))
        if done is not None:
            finished = json.loads(done.value)
            token = finished["token"] if state is None else self.space.epochs.token(state.mod)
            raise AlreadyDone(key, token, codec.loads(finished["result"]))
        if lock is not None and lock.value == owner:  # our own acquire committed; its reply was lost
            return Lease(key, self.space.epochs.token(lock.create), owner)
        if lock is None:  # not after a Txn that failed in one revision; try again
            return None
        left = self.gateway.time_to_live(lock.lease)  # -1: expired, etcd is still deleting the lock
        raise LeaseHeld(key, lock.value, float(max(left, 0)))

    def _fenced(self, lease: Lease, compare: list[Op], success: list[Op]) -> TxnResult:
        """Run ``success`` iff the token is current; a failed answer holds the offset, state and lock."""
        lock = self.space.k("lock", lease.key)
        state = self.space.k("state", lease.key)
        failure = [etcd.get(self.space.offset_key), etcd.get(state), etcd.get(lock)]

        def attempt() -> TxnResult | None:
            epochs = self.space.epochs
            guard = [etcd.created(lock, epochs.revision(lease.token)), self.space.offset_is(epochs), *compare]
            result = self.gateway.txn(guard, success, failure)
            return None if not result.succeeded and self.space.moved(result, epochs) else result

        return self._retry(f"a write of {lease.key!r}", attempt)

    def _expire_overdue(self) -> None:
        """Delete the locks nobody renewed within their ttl, which their shared etcd lease keeps alive (token
        0: an acquire whose answer was lost, known by its owner)."""
        for lease in self.etcd_leases.overdue():
            lock = self.space.k("lock", lease.key)
            token = etcd.created(lock, self.space.epochs.revision(lease.token))
            self.gateway.txn([token if lease.token else etcd.holds(lock, lease.owner)], [etcd.delete(lock)])

    def _retry(self, what: str, attempt: Callable[[], T | None]) -> T:
        for _ in range(_ATTEMPTS):
            if (value := attempt()) is not None:
                return value
        raise StoreUnavailable(f"etcd at {self.gateway.base_url} kept changing under {what}; try again")

    def _stale(self, lease: Lease, what: str, failed: TxnResult) -> None:
        self.space.log([self.space.event(lease, "refused", what)])
        current = records.current_token(self.space.epochs, lock=failed.first(2), state=failed.first(1))
        current = None if current == lease.token else current  # it only expired: nobody holds the key
        raise StaleToken(lease.key, lease.token, current, what, recorded=True)

    def _holds(self, lock: KV | None, lease: Lease) -> bool:
        return lock is not None and lock.create == self.space.epochs.revision(lease.token)

    def _locks(self, leases: Sequence[Lease]) -> dict[str, KV]:
        keys = sorted({lease.key for lease in leases})
        if len(keys) < MAX_OPS:
            ranges = [etcd.get(self.space.k("lock", key), keys_only=True) for key in keys]
        else:  # one range over every lock of the store beats ceil(n / 127) round trips
            ranges = [etcd.get(self.space.k("lock"), prefix=True, keys_only=True)]
        result, start = self.space.read(ranges), len(self.space.k("lock"))
        return {unquote(kv.key[start:]): kv for i in range(len(ranges)) for kv in result.kvs(i + 1)}



def _order(kv: KV) -> tuple[int, str]:
    return kv.create, kv.key
