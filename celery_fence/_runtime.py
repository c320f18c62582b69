"""What a worker process keeps for one Celery app: its settings, its store client, its renewer, and the
records it owes its store.

Tied to the app, created lazily in the process that runs tasks (a prefork child after fork, never the
parent); a forked child drops its parent's (:mod:`celery_fence._process`), so no client is ever shared
across a fork. A test wraps the stores an app's runtimes open through :func:`wrap_stores`, the seam the
fault kit (:mod:`celery_fence.testing`) installs its lost replies by; this module never imports the kit.

**The records it owes** (:class:`OwedRecords`): the ``strand`` of each run that gave up (an unavailable
store waited out, the fence's re-sends spent), and the release of each run that ended FAILURE, ``Reject``
or ``Ignore`` whose release did not reach the store (else its lease would expire and recovery would run it
again). The store is down when such a run ends, so the record usually cannot be written then; the runtime
keeps it and writes it once the store answers again (after the next acquire that succeeds in the process),
or when it closes. A record still owed then is logged at ``ERROR``: never dropped silently.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._delivery import Stranded
from ._interrupt import Interrupter
from ._process import forget_in_child
from .config import FenceConfig
from .errors import FenceError
from .lease import Lease, OwnerNames
from .renewer import Renewer
from .stores import Store, open_store
from .stores.base import RecoveryStore, lacking

__all__ = [
    "MAX_OWED",
    "FenceRuntime",
    "OwedRecords",
    "Released",
    "runtime_for",
    "settle_at_exit",
    "wrap_stores",
]

log = logging.getLogger(__name__)

_ATTR = "_celery_fence_runtime"
_WRAP = "_celery_fence_store_wrapper"  # on the app, so a forked child's new runtime wraps its store too
_CREATE = threading.Lock()  # serialises first creation on the threads pool; holds no state

# A task's own fence_lease_ttl, fence_on_busy and fence_interrupt (None: the app's setting).
TaskOptions = tuple[float | None, str | None, bool | None]


class FenceRuntime:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.config = FenceConfig.from_conf(app.conf)
        self._task_configs: dict[str, tuple[TaskOptions, FenceConfig]] = {}
        self.new_owner = OwnerNames()
        self._store: Store | None = None
        self._renewer: Renewer | None = None
        self._lock = threading.Lock()
        self.interrupter = Interrupter()
        self.owed = OwedRecords()  # records of runs that gave up while the store was unavailable
        # The run's clocks and its sleep, set apart so that a simulation can drive them.
        self.clock: Callable[[], float] = time.monotonic
        self.wall: Callable[[], float] = time.time  # epoch seconds: a wait's start, carried in a header
        self.sleep: Callable[[float], None] = time.sleep
        forget_in_child(self)

    def forget_after_fork(self) -> None:
        """A forked child makes its own runtime on first use: this one's store, renewer thread and owed
        records are the parent's (the store forgets its connections itself)."""
        if self.app.__dict__.get(_ATTR) is self:
            del self.app.__dict__[_ATTR]

    def config_for(self, task: str, options: TaskOptions) -> FenceConfig:
        """The settings a run of ``task`` takes: the app's under the task's own ``options``, resolved once
        per task (and again if its options change)."""
        known = self._task_configs.get(task)
        if known is None or known[0] != options:  # first run, or the task's options changed since
            known = self._task_configs[task] = (options, self.config.with_task_options(*options))
        return known[1]

    @property
    def store(self) -> Store:
        if self._store is None:
            with self._lock:
                if self._store is None:
                    store = open_store(self.config.store_url)
                    wrap: Callable[[Store], Store] | None = self.app.__dict__.get(_WRAP)
                    self._store = store if wrap is None else wrap(store)
        return self._store

    @property
    def renewer(self) -> Renewer:
        if self._renewer is None:
            store = self.store
            with self._lock:
                if self._renewer is None:
                    self._renewer = Renewer(store, self.config.policy.interval, self.clock)
        return self._renewer

    def settle(self) -> None:
        """Write what this process owes its store, or log it (ERROR): it is closing or ending."""
        self.owed.close(self._store)

    def close(self) -> None:
        if self._renewer is not None:
            self._renewer.stop()
        self.settle()  # before the store closes: the last chance to write them
        if self._store is not None:
            self._store.close()


def runtime_for(app: Any) -> FenceRuntime:
    """This process's runtime for ``app``; a forked child makes its own on first use."""
    runtime: FenceRuntime | None = app.__dict__.get(_ATTR)
    if runtime is not None:
        return runtime
    with _CREATE:
        runtime = app.__dict__.get(_ATTR)
        if runtime is None:
            runtime = FenceRuntime(app)
            setattr(app, _ATTR, runtime)
        return runtime


def settle_at_exit(app: Any) -> None:
    """A worker process ends: settle what its runtime for ``app`` owes (none made: nothing owed). The
    runtime stays open: its owner closes it, if anyone does."""
    runtime: FenceRuntime | None = app.__dict__.get(_ATTR)
    if runtime is not None:
        runtime.settle()


def wrap_stores(app: Any, wrapper: Callable[[Store], Store]) -> None:
    """A test's seam: every store a runtime for ``app`` opens from now on (in this process and the children
    it forks) is ``wrapper(store)``. The fault kit's lost replies come in this way
    (``celery_fence/testing/_in_worker.py``); a runtime that already opened its store keeps it."""
    setattr(app, _WRAP, wrapper)


# -- the records it owes its store --

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
        self._owed: deque[Owed] = deque()

    def __len__(self) -> int:
        return len(self._owed)

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
        while self._owed and (record := self._pop()) is not None:
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
            return self._owed.popleft() if self._owed else None

    def _keep(self, record: Owed, first: bool = False) -> None:
        with self._lock:
            if first:
                self._owed.appendleft(record)
            else:
                self._owed.append(record)
            dropped = self._owed.popleft() if len(self._owed) > MAX_OWED else None
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
