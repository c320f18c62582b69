"""The etcd store's own etcd leases: one per process and ttl (in whole seconds), which its locks are
attached to, kept alive by its renews; and what etcd makes of a ttl."""

from __future__ import annotations

import math
import threading
import time

from ..._process import forget_in_child
from ...lease import Lease
from ..capabilities import Capabilities
from .gateway import Gateway

__all__ = ["CAPABILITIES", "MIN_LEASE", "ProcessLeases", "lease_seconds"]

_FRESH = 0.05  # keep an etcd lease alive before attaching a lock once this share of its ttl has passed


MIN_LEASE = 2  # seconds: etcd's shortest lease
CAPABILITIES = Capabilities(name="etcd", min_ttl=MIN_LEASE, whole_second_ttl=True, default_port=2379)


def lease_seconds(ttl: float) -> int:
    """etcd leases are whole seconds, at least 2: a ttl is rounded up."""
    return max(MIN_LEASE, math.ceil(ttl))


class ProcessLeases:
    """One etcd lease per process and ttl in whole seconds, and when each lock on them would expire (a
    lock lives as long as its etcd lease, which other locks keep alive). A forked child has none of these."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.forget_after_fork()  # none yet
        forget_in_child(self)

    def forget_after_fork(self) -> None:
        """The parent's etcd leases are the parent's to keep alive; a forked child starts with none."""
        self._lock = threading.Lock()
        self._leases: dict[int, tuple[int, float]] = {}  # seconds: id, time.monotonic() of its last refresh
        self._due: dict[Lease, float] = {}  # time.monotonic() past which a lock counts as expired

    def lease_for(self, seconds: int) -> int:
        """The etcd lease for a new lock, kept alive first unless just done: the lock lives its ttl."""
        lease_id, refreshed = self._get(seconds)
        stale = time.monotonic() - refreshed > seconds * _FRESH
        if not lease_id or (stale and not self.keepalive(seconds, lease_id)):
            sent, lease_id = time.monotonic(), self.gateway.grant(seconds)
            with self._lock:
                self._leases[seconds] = (lease_id, sent)
        return lease_id

    def keepalive(self, seconds: int, lease_id: int) -> bool:
        """Keep ``lease_id`` alive; forget it when etcd says it is gone (the answer has no TTL > 0)."""
        sent, alive = time.monotonic(), self.gateway.keepalive(lease_id) > 0
        with self._lock:
            ours = self._leases.get(seconds, (0, 0.0))
            if ours[0] == lease_id and alive:
                self._leases[seconds] = (lease_id, max(ours[1], sent))
            elif ours[0] == lease_id:
                del self._leases[seconds]
        return alive

    def track(self, lease: Lease, ttl: float, sent: float) -> None:
        """``lease``'s lock was acquired or renewed by a request sent at ``sent``: it lives ``ttl`` more."""
        with self._lock:
            self._due[lease] = sent + ttl

    def untrack(self, lease: Lease) -> None:
        with self._lock:
            self._due.pop(lease, None)

    def overdue(self) -> list[Lease]:
        """The leases not renewed within their ttl (forgotten now): their locks must go."""
        self._get(0)
        now = time.monotonic()
        with self._lock:
            late = [lease for lease, due in self._due.items() if due <= now]
            for lease in late:
                del self._due[lease]
        return late

    def revoke_all(self) -> None:
        """Revoke this process's etcd leases: every lock attached to them is gone at once."""
        self._get(0)
        with self._lock:
            leases, self._leases, self._due = list(self._leases.values()), {}, {}
        for lease_id, _ in leases:
            self.gateway.revoke(lease_id)

    def _get(self, seconds: int) -> tuple[int, float]:
        with self._lock:
            return self._leases.get(seconds, (0, 0.0))
