"""The records a worker process owes its store (:class:`OwedRecords`, kept by its runtime): the ``strand`` of
each run that gave up (an unavailable store waited out, the fence's re-sends spent), and the release of
each run that ended FAILURE, ``Reject`` or ``Ignore`` whose release did not reach the store (else its lease
would expire and recovery would run it again). The store is down when such a run ends, so the record
usually cannot be written then; the runtime keeps it and writes it once the store answers again (after the
next acquire that succeeds in the process), or when it closes. A record still owed then is logged at
``ERROR``: never dropped silently.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass

from ._delivery import Stranded
from .errors import FenceError
from .lease import Lease
from .stores import Store
from .stores.base import RecoveryStore, lacking

__all__ = ["MAX_OWED", "Owed", "OwedRecords", "Released"]

log = logging.getLogger(__name__)

MAX_OWED = 1_000  # records kept per process: a long outage must not grow memory without bound


@dataclass(frozen=True)
class Released:
    """The release a run owes after it ended FAILURE, ``Reject`` or ``Ignore``: ``Store.release(lease)``."""

    task_id: str
    lease: Lease

    @property
    def key(self) -> str:
        return self.lease.key

    @property
    def reason(self) -> str:
        return f"the release of token {self.lease.token} after the run ended"


Owed = Stranded | Released


class OwedRecords:
    """The records this process owes its store, oldest first. Thread-safe (the threads pool)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: deque[Owed] = deque()  # read unlocked only to see whether any is owed

    def __len__(self) -> int:
        return len(self.records)

    def write(self, store: Store, record: Owed) -> None:
        """Write the record now if the store takes it, else keep it owed. A store without the recovery role
        keeps no give-up record: said once per run, at WARNING, and nothing is owed."""
        if isinstance(record, Stranded) and lacking(store, RecoveryStore):
            log.warning("fence: the store keeps no give-up records (no recovery role): %s", record.reason)
            return
        if not _written(store, record):
            log.warning(
                "fence: the record of %s (key %r) is owed: the store did not take it; it is written after "
                "the next acquire in this process",
                record.task_id, record.key,
            )
            self._keep(record)

    def flush(self, store: Store) -> None:
        """Write what is owed, oldest first, up to the first record the store does not take (it is still
        unavailable: the rest would only wait for it too). Cheap when nothing is owed."""
        while self.records and (record := self._pop()) is not None:
            if not _written(store, record):
                self._keep(record, first=True)
                return
            log.info("fence: wrote the owed record of %s (key %r)", record.task_id, record.key)

    def close(self, store: Store | None) -> None:
        """Flush, then log what is still owed (at ERROR): this process will not write it."""
        if store is not None:
            self.flush(store)
        while (record := self._pop()) is not None:
            _not_written(record, "the store did not take it before this process closed it")

    def _pop(self) -> Owed | None:
        with self._lock:
            return self.records.popleft() if self.records else None

    def _keep(self, record: Owed, first: bool = False) -> None:
        with self._lock:
            if first:
                self.records.appendleft(record)
            else:
                self.records.append(record)
            dropped = self.records.popleft() if len(self.records) > MAX_OWED else None
        if dropped is not None:
            _not_written(dropped, f"over {MAX_OWED} records owed in this process")


def _written(store: Store, record: Owed) -> bool:
    """One ``strand`` or ``release`` call; ``False`` if the store did not take it (best effort)."""
    try:
        if isinstance(record, Released):
            store.release(record.lease)  # token-checked: a takeover since makes it a no-op
            return True
        marked = store.strand(record.key, record.run, record.reason)
    except FenceError as exc:
        log.warning("fence: %s of %r failed: %s", type(record).__name__.lower(), record.key, exc)
        return False
    if not marked:  # someone leased or finished the key meanwhile: its state says more than this record
        log.info("fence: no record of %s written: key %r is no longer free", record.task_id, record.key)
    return True


def _not_written(record: Owed, why: str) -> None:
    log.error(
        "fence: record not written: %s gave up on key %r (%s); %s",
        record.task_id, record.key, record.reason, why,
    )
