"""Per-process state of celery-fence for one Celery app: its settings, its store client, its renewer, the
records it owes its store (:mod:`celery_fence._owed`).

Tied to the app, created lazily in the process that runs tasks (a prefork child after fork, never the
parent); a forked child drops its parent's (:mod:`celery_fence._process`), so no client is ever shared
across a fork. A test wraps the stores an app's runtimes open through :func:`wrap_stores`, the seam the
fault kit (:mod:`celery_fence.testing`) installs its lost replies by; this module never imports the kit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ._interrupt import Interrupter
from ._owed import OwedRecords
from ._process import forget_in_child
from .config import FenceConfig
from .lease import OwnerNames
from .renewer import Renewer
from .stores import Store, open_store

__all__ = ["FenceRuntime", "runtime_for", "settle_at_exit", "wrap_stores"]

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
