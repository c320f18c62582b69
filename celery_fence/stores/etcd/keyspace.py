"""The etcd store's keys under its prefix, and the token epochs every ``Txn`` reads with them.

``store``, ``records`` and ``admin`` build their ``Txn`` s from this one object: the per-key record names
(``records`` says what each holds), the offset key that ``advance`` moves (a token is a revision plus the
offset of its epoch), and the reads that refresh the cached epochs as a side effect.
"""

from __future__ import annotations

import json
import time
import uuid
from urllib.parse import quote, unquote

from ...lease import Lease
from . import gateway as etcd
from .gateway import KV, Op, TxnResult

__all__ = ["KINDS", "MAX_OPS", "Keyspace"]

KINDS = ("state", "lock", "held", "done", "dead", "recovery")  # per-key records, in read order
MAX_OPS = 128  # etcd's default --max-txn-ops


class Keyspace:
    def __init__(self, gateway: etcd.Gateway, prefix: str) -> None:
        self.gateway, self.prefix = gateway, prefix
        self.offset_key = f"{prefix}meta/offset"
        self.epochs = etcd.Epochs()  # as last read; a Txn that compares the offset finds out if it moved

    def k(self, kind: str, key: str | None = None) -> str:
        """The name of ``key``'s record of ``kind``, or (no key) the prefix of every record of that kind."""
        return f"{self.prefix}{kind}/" if key is None else f"{self.prefix}{kind}/{quote(key, safe='')}"

    def offset_is(self, epochs: etcd.Epochs) -> Op:
        return etcd.modified(self.offset_key, epochs.mod)

    def moved(self, failed: TxnResult, epochs: etcd.Epochs) -> bool:
        """Whether an advance moved the offset since ``epochs`` was read (the cache is then refreshed)."""
        self.epochs = etcd.Epochs.load(failed.first(0))
        return self.epochs.mod != epochs.mod

    def read(self, ranges: list[Op]) -> TxnResult:
        """One read of ``ranges`` (answers from index 1) with the offset key, which refreshes the cache."""
        result = self.gateway.txn([], [etcd.get(self.offset_key), *ranges])
        self.epochs = etcd.Epochs.load(result.first(0))
        return result

    def records(self, ranges: list[Op]) -> dict[str, dict[str, KV]]:
        """The records read by ``ranges`` (one per kind, in ``KINDS`` order), by lease key and kind."""
        result, by_key = self.read(ranges), dict[str, dict[str, KV]]()
        for i, kind in enumerate(KINDS):
            for kv in result.kvs(i + 1):
                by_key.setdefault(unquote(kv.key[len(self.k(kind)) :]), {})[kind] = kv
        return by_key

    def free(self, key: str) -> list[Op]:
        return [etcd.delete(self.k("lock", key)), etcd.delete(self.k("held", key))]

    def event(self, lease: Lease, event: str, detail: str | None = None, literal: bool = False) -> Op:
        """A history put. Token 0: its Txn's revision (acquire, takeover) unless literal; owner "": none."""
        token, owner = lease.token if literal else lease.token or None, lease.owner or None
        value = dict(key=lease.key, event=event, token=token, owner=owner, detail=detail, at=time.time())
        return etcd.put(f"{self.k('history', lease.key)}/{uuid.uuid4().hex}", json.dumps(value))

    def log(self, events: list[Op]) -> None:
        for start in range(0, len(events), MAX_OPS):
            self.gateway.txn([], events[start : start + MAX_OPS])
