"""Reading the etcd store's per-key records: states, history, and the abandoned runs that recovery
(:mod:`celery_fence.recovery`) sends again.

Per lease key (percent-encoded, so without ``/``) under the prefix: ``lock/<key>`` on the process's etcd
lease, there iff the lease is live, its ``create_revision`` the token (the acquiring ``Txn``'s revision);
``state/<key>`` (owner, run), put by acquire and force_release, so its ``mod_revision`` is the latest
token, and by ``strand`` on a free key, pinning the token it had (0 for a new key: no token is issued);
``held/<key>`` from acquire to release, complete or force_release (held but no lock: expired, the next
acquire is a takeover; its value is when ``abandoned`` first saw that); ``done/<key>`` (token, result,
finished_at); ``dead/<key>``, ``recovery/<key>`` (count, at, sent, rev); ``steps/<key>/<name>``;
``history/<key>/<uuid>``
in ``create_revision`` order; ``pruned/<key>``, the marker that replaced a pruned key's history (a separate
record: a ``Txn`` may not put a key inside a range it deletes); ``meta/offset`` (:meth:`EtcdStore.advance`).

etcd does not say when a lock expired: the first ``abandoned`` call that sees a key held without a lock
stamps its ``held`` marker with its clock, and ``grace`` counts from that stamp. ``recover`` claims a key in
one ``Txn`` comparing every per-key record with what ``abandoned`` saw, so one recoverer wins. A recovery
copy is recorded as sent with the state's revision; a state put since (an acquire: the copy started) makes
that copy count as started when the record is next read, so acquire needs no extra read.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from ... import codec
from ...lease import Abandoned, HistoryEvent, Lease, LeaseState, recovery_backoff
from . import gateway as etcd
from .gateway import KV, Op
from .keyspace import KINDS, Keyspace

__all__ = ["abandoned", "current_token", "history", "prune", "recover", "state_token", "states", "strand"]


def current_token(epochs: etcd.Epochs, lock: KV | None, state: KV | None) -> int | None:
    """The key's current token: its live lock's, else the state's last put (an acquire, or an admin release
    that bumped it). A lease that only expired leaves the state at its own token: etcd deleted the lock."""
    if lock is not None:
        return epochs.token(lock.create)
    return None if state is None else state_token(epochs, state, json.loads(state.value))


def state_token(epochs: etcd.Epochs, state: KV, info: Mapping[str, Any]) -> int:
    """The token of a key by its state record (``info``, its value): the revision of its last put, unless
    a strand pinned one. A pin lives only until the next acquire or force_release: never on a leased,
    abandoned or finished key."""
    pinned = info.get("token")
    return epochs.token(state.mod) if pinned is None else int(pinned)


def states(space: Keyspace, ranges: list[Op]) -> list[LeaseState]:
    """The states read by ``ranges`` (one per kind, in ``KINDS`` order), with the time left on live locks."""
    by_key = space.records(ranges)
    ids = {found["lock"].lease for found in by_key.values() if "lock" in found}
    ttls = {lease_id: space.gateway.time_to_live(lease_id) for lease_id in ids}
    return [_state(space, key, found, ttls) for key, found in sorted(by_key.items()) if "state" in found]


def _state(space: Keyspace, key: str, found: Mapping[str, KV], ttls: Mapping[int, int]) -> LeaseState:
    info, done, lock = json.loads(found["state"].value), found.get("done"), found.get("lock")
    expires_in = None if lock is None and "held" not in found else 0.0  # 0.0: expired, not taken over
    if lock is not None:
        expires_in = max(0.0, float(ttls.get(lock.lease, 0)))
    result = None if done is None else codec.loads(json.loads(done.value)["result"])
    token = state_token(space.epochs, found["state"], info)
    dead = found["dead"].value if "dead" in found else None
    rec = _recovery(found)
    counts = rec["count"], rec["sent"]
    run = codec.loads(info["run"]) if info.get("run") else None
    return LeaseState(
        key, token, info["owner"], expires_in, done is not None, result, dead, *counts, run=run
    )


def history(space: Keyspace, key: str | None) -> list[HistoryEvent]:
    """Events and prune markers in revision order (a marker is put again by a later prune of its key: its
    ``mod_revision``); ``at`` (the writer's clock) is made non-decreasing along it."""
    if key is None:
        ranges = [etcd.get(space.k("history"), prefix=True), etcd.get(space.k("pruned"), prefix=True)]
    else:
        ranges = [etcd.get(space.k("history", key) + "/", prefix=True), etcd.get(space.k("pruned", key))]
    found = space.read(ranges)
    events, at = [], -math.inf
    for kv in sorted([*found.kvs(1), *found.kvs(2)], key=lambda kv: (kv.mod, kv.key)):
        e = json.loads(kv.value)
        at = max(at, e["at"])
        token = space.epochs.token(kv.create) if e["token"] is None else e["token"]
        events.append(HistoryEvent(at, e["event"], token, e["owner"], e["detail"], key=e["key"]))
    return events


def prune(space: Keyspace, older_than: float) -> int:
    """Delete every record of keys finished before ``older_than`` seconds ago (writer clocks), history too,
    leaving one marker ``pruned/<key>`` (the state's token) in its place; older markers go first."""
    cutoff = time.time() - older_than
    kinds = ("pruned", "done", "state")
    found = space.read([etcd.get(space.k(k), prefix=True, keys_only=k == "state") for k in kinds])
    for kv in found.kvs(1):
        if json.loads(kv.value)["at"] <= cutoff:
            space.gateway.txn([etcd.modified(kv.key, kv.mod)], [etcd.delete(kv.key)])
    old = [kv for kv in found.kvs(2) if json.loads(kv.value)["finished_at"] <= cutoff]
    states = {kv.key: kv for kv in found.kvs(3)}
    return sum(_wipe(space, kv, states) for kv in old)


def _wipe(space: Keyspace, done: KV, states: Mapping[str, KV]) -> bool:
    """One ``Txn``: the key's records, steps and history go (growth stays bounded), its marker is put."""
    key = unquote(done.key[len(space.k("done")) :])
    state = states.get(space.k("state", key))
    token = json.loads(done.value)["token"] if state is None else space.epochs.token(state.mod)
    unchanged = [
        etcd.created(done.key, done.create),
        etcd.modified(space.k("state", key), state.mod if state else 0),
    ]
    deletes = [etcd.delete(space.k(kind, key)) for kind in KINDS]
    children = [etcd.delete(space.k(kind, key) + "/", prefix=True) for kind in ("steps", "history")]
    marker = dict(key=key, event="pruned", token=token, owner=None, detail=None, at=time.time())
    ops = [*deletes, *children, etcd.put(space.k("pruned", key), json.dumps(marker))]
    return space.gateway.txn(unchanged, ops).succeeded


def abandoned(space: Keyspace, grace: float, limit: int) -> list[Abandoned]:
    """Keys held without a lock (expired), not done, dead or recovered within ``grace``."""
    now, late = time.time(), []
    found = space.records([etcd.get(space.k(kind), prefix=True) for kind in KINDS])
    idle = {key: r for key, r in found.items() if _idle(r)}
    for key, r in idle.items():
        if not r["held"].value:  # first seen expired: stamp it, unless a lock was taken meanwhile
            guard = [etcd.modified(r["held"].key, r["held"].mod), etcd.created(space.k("lock", key), 0)]
            space.gateway.txn(guard, [etcd.put(r["held"].key, repr(now))])
        expired_at = float(r["held"].value or now)
        rec = _recovery(r)
        if expired_at <= now - grace and rec["at"] <= now - grace * recovery_backoff(rec["sent"]):
            late.append((expired_at, key))
    return [_abandoned(space, key, idle[key]) for _, key in sorted(late)[:limit]]


def recover(space: Keyspace, seen: Abandoned, max_recoveries: int, reason: str) -> int | None:
    k = {kind: space.k(kind, seen.key) for kind in KINDS}
    r = space.records([etcd.get(name) for name in k.values()]).get(seen.key, {})
    if not _idle(r) or _abandoned(space, seen.key, r) != seen:
        return None  # taken over, finished, dead, or recovered first
    count, sent, dead = seen.recoveries, seen.sent, seen.recoveries >= max_recoveries
    lease = Lease(seen.key, seen.token, json.loads(r["state"].value)["owner"] or "")
    if dead:
        ops = _mark_dead(space, k, lease, "dead", reason or f"gave up after {count} recoveries")
    else:
        sent += 1
        ops = [space.event(lease, "recovered", str(count + 1))]
    record = {"count": count, "at": time.time(), "sent": sent, "rev": r["state"].mod}
    ops.append(etcd.put(k["recovery"], json.dumps(record)))
    return (0 if dead else count + 1) if space.gateway.txn(_unchanged(k, r), ops).succeeded else None


def strand(space: Keyspace, key: str, reason: str, run_text: str | None) -> bool | None:
    """Mark a free key dead (``Store.strand``) in one ``Txn`` comparing every per-key record and the token
    offset with what was read; ``None``: something changed meanwhile, judge the key again."""
    k = {kind: space.k(kind, key) for kind in KINDS}
    r = space.records([etcd.get(name) for name in k.values()]).get(key, {})
    if {"lock", "held", "done"} & r.keys():
        return False  # leased (an expired lease is recovery's) or finished
    epochs = space.epochs  # as refreshed by that read
    token = state_token(epochs, r["state"], json.loads(r["state"].value)) if "state" in r else 0
    state = etcd.put(k["state"], json.dumps({"owner": None, "run": run_text, "token": token}))
    ops = [state, *_mark_dead(space, k, Lease(key, token, ""), "gave-up", reason)]
    return space.gateway.txn([*_unchanged(k, r), space.offset_is(epochs)], ops).succeeded or None


def _mark_dead(space: Keyspace, k: Mapping[str, str], lease: Lease, event: str, reason: str) -> list[Op]:
    """The puts that mark a key dead, logged as ``event`` with the lease's token as it is (0 too)."""
    return [etcd.put(k["dead"], reason), space.event(lease, event, reason, literal=True)]


def _unchanged(k: Mapping[str, str], r: Mapping[str, KV]) -> list[Op]:
    """Compares: every per-key record as ``r`` read it (absent ones still absent)."""
    return [etcd.modified(k[kind], r[kind].mod if kind in r else 0) for kind in KINDS]


def _abandoned(space: Keyspace, key: str, r: Mapping[str, KV]) -> Abandoned:
    run = codec.loads(json.loads(r["state"].value)["run"])
    rec = _recovery(r)
    return Abandoned(key, space.epochs.token(r["state"].mod), run, rec["count"], rec["sent"])


def _idle(r: Mapping[str, KV]) -> bool:
    """Abandoned with no grace: held but without a lock (expired), not done, not dead."""
    return "held" in r and "state" in r and not {"lock", "done", "dead"} & r.keys()


def _recovery(r: Mapping[str, KV]) -> dict[str, Any]:
    """``count`` (copies started), ``at`` (last sent), ``sent`` (copies sent, not started): a copy sent
    before the state's last put (an acquire started it) counts as started."""
    if "recovery" not in r:
        return {"count": 0, "at": 0.0, "sent": 0}
    rec = json.loads(r["recovery"].value)
    count, sent = int(rec["count"]), int(rec.get("sent", 0))
    if sent and "state" in r and rec.get("rev") != r["state"].mod:
        count, sent = count + 1, 0
    return {"count": count, "at": float(rec["at"]), "sent": sent}
