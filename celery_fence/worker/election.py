"""One recoverer at a time, cluster-wide: elected by a lease of celery-fence's own.

Every worker runs recovery by default; before each pass a worker's main process holds (or renews) the lease
on :data:`RECOVERER_KEY`, and only its holder runs the pass. The lease outlives a few passes, so the same
worker stays elected while it lives; when it dies, another takes the key over once the lease expires. A
recovery pass does not need this for safety (each re-send is claimed atomically at the store, one claimer
wins): the election keeps N workers from scanning the store N times per interval.
"""

from __future__ import annotations

import logging

from ..errors import FenceError, LeaseHeld
from ..lease import Lease, new_owner
from ..stores.base import Store

__all__ = ["RECOVERER_KEY", "RESERVED_PREFIX", "Election"]

log = logging.getLogger(__name__)

RESERVED_PREFIX = "celery-fence:"  # keys of the library's own; recovery never re-sends them
RECOVERER_KEY = f"{RESERVED_PREFIX}recoverer"


class Election:
    """This process's candidacy for :data:`RECOVERER_KEY`, holding its lease between passes."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.owner = new_owner()
        self.lease: Lease | None = None

    def hold(self, store: Store) -> bool:
        """Renew the lease if this process holds it, else try to take it. True while elected."""
        if self.lease is not None and not store.renew([self.lease], self.ttl):
            return True
        was = self.lease is not None
        self.lease = None
        try:
            self.lease = store.acquire(RECOVERER_KEY, self.owner, self.ttl)
        except LeaseHeld:
            if was:
                log.warning("celery-fence: no longer the recoverer; another worker took over")
            return False
        log.info("celery-fence: elected the recoverer (%s)", self.owner)
        return True

    def step_down(self, store: Store) -> None:
        """Give the lease back (worker shutdown), so another worker is elected at its next pass."""
        lease, self.lease = self.lease, None
        if lease is not None:
            try:
                store.release(lease)
            except FenceError as exc:  # it expires by its ttl instead
                log.warning("celery-fence: could not step down as the recoverer: %s", exc)
