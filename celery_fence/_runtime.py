"""What a worker process keeps for one Celery app: its settings, its store client, its renewer thread, and
the records it owes its store (:mod:`._owed`). No Celery import.

Tied to the app, created lazily in the process that runs tasks (a prefork child after fork, never the
parent); a forked child drops its parent's (:mod:`celery_fence._process`), so no client is ever shared
across a fork. A test wraps the stores an app's runtimes open through :func:`wrap_stores`, the seam the
fault kit (:mod:`celery_fence.testing`) installs its lost replies by; this module never imports the kit.

**The renewer** (:class:`Renewer`): one thread renews every lease held in its process that is due, one store
round trip per ttl per interval. A lease is lost when the store refuses its renew, or when no renew
succeeded before its local monotonic deadline (the store may be unreachable; the worker must then assume the
store expired it). Loss is never silent: the callback given to :meth:`Renewer.track` runs (the task layer
logs, signals and sends an event). The heartbeat only lets a worker stop early; the store's token check is
what keeps data safe.

A lease whose run holds its fenced transaction open is *pinned*: its row is locked by that transaction, so it
is alive by that lock (no one can take it over until the transaction ends, and the server ends an idle one
after a ttl). The renewer neither renews it (the renew would wait behind the run's own lock) nor expires it
locally until it is unpinned.

A renew never waits for a lock that another client holds (SQLite's write lock, held by another process's
transaction) past the point where it could still land before the lease's local deadline
(``LeasePolicy.lock_wait``, set with ``stores.waits.lock_wait``): it gives up with ``StoreUnavailable`` and is
retried, so the renewer is back in time to renew again or to report the loss, whatever the store's own busy
timeout. Groups are renewed earliest deadline first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import _failpoints
from ._interrupt import Interrupter
from ._owed import OwedRecords
from ._process import forget_in_child
from .config import FenceConfig
from .errors import StoreUnavailable
from .lease import Lease, LeasePolicy, OwnerNames
from .stores import Store, open_store
from .stores.waits import lock_wait

__all__ = [
    "FenceRuntime",
    "Renewer",
    "runtime_for",
    "settle_at_exit",
    "wrap_stores",
]

log = logging.getLogger("celery_fence.renewer")  # only the renewer logs here: the name users filter on

_ATTR = "_celery_fence_runtime"
_WRAP = "_celery_fence_store_wrapper"  # on the app, so a forked child's new runtime wraps its store too
_CREATE = threading.Lock()  # serialises first creation on the threads pool; holds no state

# A task's own fence_lease_ttl, fence_on_busy and fence_interrupt (None: the app's setting).
TaskOptions = tuple[float | None, str | None, bool | None, str | None]


class FenceRuntime:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.config = FenceConfig.from_conf(app.conf)
        self._task_configs: dict[str, tuple[FenceConfig, TaskOptions, FenceConfig]] = {}
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
        per task (and again if either changes: a test may set a task's options or the runtime's config)."""
        known = self._task_configs.get(task)
        if known is None or known[0] is not self.config or known[1] != options:
            known = self._task_configs[task] = (self.config, options, self.config.with_task_options(*options))
        return known[2]

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

    def flush_owed(self, store: Store) -> None:
        """The store answered: write what this process owes it. Nothing owed (the rule) costs no call."""
        if self.owed.records:
            self.owed.flush(store)

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


# -- the renewer --

OnLost = Callable[[Lease, str], None]
OnRenewed = Callable[[Lease], None]


@dataclass
class _Tracked:
    policy: LeasePolicy
    deadline: float  # local monotonic time after which the lease counts as lost
    on_lost: OnLost
    sent_at: float  # when its acquire or last successful renew was sent
    on_renewed: OnRenewed | None = None
    pinned: bool = False

    def due(self, now: float) -> bool:
        """Skip a lease renewed (or acquired) under half an interval ago: a short task is never renewed.

        The next pass comes within an interval, so a skipped lease is renewed by 1.5 intervals (< 0.75 ttl),
        before its local deadline (0.9 ttl).
        """
        return not self.pinned and now - self.sent_at >= self.policy.interval / 2


class Renewer:
    """Renews tracked leases in the background. ``tick()`` is one pass, callable directly in tests."""

    def __init__(
        self,
        store: Store,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
        background: bool = True,
    ) -> None:
        self.store, self.interval, self.clock = store, interval, clock
        self._leases: dict[Lease, _Tracked] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = not background  # no thread: whoever made it calls tick() (a simulation)
        self.round_trips = 0  # renew calls sent: observable by tests and benchmarks
        self.restarts = 0  # threads that died and were replaced: observable by tests

    def track(
        self,
        lease: Lease,
        policy: LeasePolicy,
        sent_at: float,
        on_lost: OnLost,
        on_renewed: OnRenewed | None = None,
    ) -> None:
        """Renew ``lease`` until :meth:`untrack`; ``sent_at`` is when its acquire was sent.

        ``on_lost`` runs once if the lease is lost; ``on_renewed`` after each successful renew of it.
        """
        with self._lock:
            self._leases[lease] = _Tracked(policy, policy.deadline(sent_at), on_lost, sent_at, on_renewed)
            self.interval = min(self.interval, policy.interval)
        self._ensure_thread()

    def untrack(self, lease: Lease) -> None:
        with self._lock:
            self._leases.pop(lease, None)

    def deadline(self, lease: Lease) -> float | None:
        """The lease's local monotonic deadline, or ``None`` when it is not tracked (any more) or pinned.

        Asked by every ``check()``: also the watchdog that restarts a renewer thread found dead."""
        self._ensure_thread()
        with self._lock:
            tracked = self._leases.get(lease)
            return None if tracked is None or tracked.pinned else tracked.deadline

    def pin(self, lease: Lease) -> None:
        """The run's open transaction locks the lease row: alive by that lock, not renewed meanwhile."""
        self._set_pinned(lease, True)

    def unpin(self, lease: Lease) -> None:
        """The transaction ended without completing: renew at the next pass; the deadline it had stands."""
        self._set_pinned(lease, False)

    def _set_pinned(self, lease: Lease, pinned: bool) -> None:
        with self._lock:
            tracked = self._leases.get(lease)
            if tracked is not None:
                tracked.pinned = pinned
                if not pinned:
                    tracked.sent_at = float("-inf")  # due

    def held(self) -> list[Lease]:
        with self._lock:
            return list(self._leases)

    def tick(self) -> None:
        """Renew every tracked lease (one call per distinct ttl), then expire overdue ones locally."""
        now = self.clock()
        by_ttl: dict[float, list[Lease]] = {}
        first: dict[float, _Tracked] = {}  # the lease of each group whose deadline comes first
        with self._lock:
            for lease, tracked in self._leases.items():
                if tracked.due(now):
                    ttl = tracked.policy.ttl
                    by_ttl.setdefault(ttl, []).append(lease)
                    if ttl not in first or tracked.deadline < first[ttl].deadline:
                        first[ttl] = tracked
            deadlines = {ttl: tracked.deadline for ttl, tracked in first.items()}
        try:
            for ttl in sorted(by_ttl, key=deadlines.__getitem__):  # earliest deadline first
                self._renew(by_ttl[ttl], first[ttl].policy, deadlines[ttl])
        finally:  # whatever a store raised, overdue leases are still reported lost
            self._expire_overdue()

    def _renew(self, leases: list[Lease], policy: LeasePolicy, deadline: float) -> None:
        """Renew ``leases`` (one ttl); ``deadline`` is the earliest of their local deadlines."""
        if _failpoints.armed:
            _failpoints.failpoint("before-renew")
        sent_at = self.clock()
        self.round_trips += 1
        try:
            with lock_wait(policy.lock_wait(deadline, sent_at)):  # back in time, whatever holds a lock
                lost = set(self.store.renew(leases, policy.ttl))
        except StoreUnavailable as exc:
            log.warning("fence renew of %d leases failed, retrying: %s", len(leases), exc)
            return
        except Exception:  # an untranslated driver error must not stop the other ttl groups
            log.exception("fence renew of %d leases failed", len(leases))
            return
        for lease in leases:
            if lease in lost:
                self._lose(lease, "renew refused: the lease was taken over or released")
            else:
                with self._lock:
                    tracked = self._leases.get(lease)
                    if tracked is not None:
                        tracked.deadline, tracked.sent_at = tracked.policy.deadline(sent_at), sent_at
                if tracked is not None and tracked.on_renewed is not None:
                    self._call(tracked.on_renewed, lease)

    def _expire_overdue(self) -> None:
        now = self.clock()
        with self._lock:
            overdue = [lease for lease, t in self._leases.items() if t.deadline <= now and not t.pinned]
        for lease in overdue:
            self._lose(lease, "no successful renew before the local deadline")

    def _lose(self, lease: Lease, reason: str) -> None:
        with self._lock:
            tracked = self._leases.pop(lease, None)
        if tracked is not None:
            self._call(tracked.on_lost, lease, reason)

    @staticmethod
    def _call(callback: Callable[..., None], lease: Lease, *args: str) -> None:
        try:
            callback(lease, *args)
        except Exception:  # a failing callback must not stop renewing the other leases
            log.exception("fence renewer callback failed for %s", lease.key)

    def _ensure_thread(self) -> None:
        """Start the thread if there is none, or restart a dead one (the watchdog)."""
        thread = self._thread
        if self._stopping or (thread is not None and thread.is_alive()):
            return
        with self._lock:
            if self._thread is thread:  # nobody replaced it meanwhile
                self._start_locked(restart=thread is not None)

    def _start_locked(self, restart: bool) -> None:
        thread = threading.Thread(target=self._run, name="celery-fence-renewer", daemon=True)
        self.restarts += restart
        thread.start()
        self._thread = thread  # published started: stop() may join it from any thread at any moment

    def _run(self) -> None:
        why = "the renewer thread ended"
        try:
            while not self._wake.wait(self._next_wait()):
                try:
                    self.tick()
                except Exception:  # never die silently: log and keep going
                    log.exception("fence renewer pass failed")
        except BaseException as exc:  # SystemExit from a callback, KeyboardInterrupt...: never silent
            why = f"the renewer thread died: {exc!r}"  # logged below; a replacement takes over
        finally:  # only stop() ends the loop on purpose; anything else is reported and replaced at once
            if not self._stopping:
                self._died(why)
                with self._lock:
                    if not self._stopping and threading.current_thread() is self._thread:
                        self._start_locked(restart=True)

    def _died(self, why: str) -> None:
        """Report every tracked lease lost: nothing renewed them while the thread was gone."""
        with self._lock:
            lost, self._leases = list(self._leases.items()), {}
        if lost:
            log.critical("fence renewer: %s; %d leases reported lost; restarting it", why, len(lost))
        else:
            log.error("fence renewer: %s; restarting it", why)
        for lease, tracked in lost:
            try:
                tracked.on_lost(lease, why)
            except BaseException:  # one callback's failure must not hide the other losses
                log.exception("fence renewer callback failed for %s", lease.key)

    def _next_wait(self) -> float:
        """Wake at the interval, or earlier when a local deadline comes first."""
        with self._lock:
            deadlines = [t.deadline for t in self._leases.values() if not t.pinned]
        until_deadline = min(deadlines, default=float("inf")) - self.clock()
        return max(0.0, min(self.interval, until_deadline))

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
