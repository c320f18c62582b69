"""The fault kit's faults and checks (:mod:`celery_fence.testing` re-exports them); no pytest.

Real workers and bounded waits are in :mod:`._faults`, the TCP proxy in :mod:`._proxy`, the lost replies
in :mod:`._indeterminate`, the pytest fixtures in :mod:`._pytest_plugin`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import FenceError
from ..stores import capabilities_for
from ..stores.base import Store
from ..stores.urls import mask_url
from ..verify import verify_store
from ._faults import Worker, wait_for
from ._indeterminate import ENV as STORE_FAULTS_ENV
from ._indeterminate import Fault
from ._proxy import Proxy

__all__ = [
    "FakeClock",
    "StoreProxy",
    "assert_history_clean",
    "committed",
    "kill_mid_run",
    "paused",
    "redeliver",
    "store_faults_env",
]


class FakeClock:
    """A clock that only moves when told to: ``MemoryStore(clock=FakeClock())``."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


class StoreProxy(Proxy):
    """A TCP proxy in front of a store (PostgreSQL, Redis, etcd), to cut its connections or slow them down.

    Point the workers at :meth:`url_for` of the store's URL. ``cut()`` resets every open connection
    and refuses new ones until ``restore()``; ``delay(seconds)`` holds each chunk that long, both ways.
    It listens on ``127.0.0.1`` only, runs in threads of this process, and stops on ``close()``.
    """

    @classmethod
    def for_url(cls, url: str) -> StoreProxy:
        """A proxy in front of the host and port of a ``postgresql://`` or ``redis://`` URL."""
        return cls(*_host_port(url))

    def url_for(self, url: str) -> str:
        """``url`` with its host and port replaced by this proxy's (the rest, query included, is kept)."""
        (host, port), (target, target_port) = _host_port(url), self.target
        if port != target_port or socket.gethostbyname(host) != socket.gethostbyname(target):
            shown = mask_url(url)
            raise ValueError(f"{shown!r} does not point at this proxy's target {target}:{target_port}")
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@{self.host}:{self.port}" if userinfo else f"{self.host}:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    try:
        default = capabilities_for(url).default_port
    except FenceError:  # not a store's URL
        default = None
    if default is None or not parts.hostname:
        shown = mask_url(url)
        raise ValueError(f"expected a postgresql://, redis:// or etcd:// URL with a host, got {shown!r}")
    return parts.hostname, parts.port or default


# -- faults --


def committed(store: Store, key: str, step: str) -> Callable[[], bool]:
    """A condition for ``after=``: the run of ``key`` has committed checkpointed step ``step``."""
    return lambda: step in store.steps(key)


@contextmanager
def paused(
    worker: Worker,
    task_id: str,
    store: Store,
    key: str,
    *,
    after: Callable[[], object] | None = None,
    timeout: float = 30.0,
) -> Iterator[int]:
    """SIGSTOP the process running ``task_id`` and wait until the store says its lease on ``key`` expired;
    yields the pid; SIGCONT on exit (the run then finds out it was fenced out).

    The pid is found first, then ``after`` (if given) is awaited, then the stop lands just after the run's
    renewer renewed (seen through ``store.get(key)``), so the stopped process is not inside a renew: a
    SQLite write lock held by a stopped process would stall every other worker. With ``after`` pointing
    just past a step (:func:`committed`), it is not inside the task's own write either.
    With the solo and threads pools the task runs in the worker's main process: the whole worker stops.
    """
    pid = worker.pid_of(task_id, timeout)
    if after is not None:
        wait_for(after, timeout, f"the moment to pause {task_id}")
    wait_for(_renewed(store, key), timeout, f"a renew of {key} to pause after")
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: _expired(store, key), timeout, f"the paused lease on {key} to expire")
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def _renewed(store: Store, key: str) -> Callable[[], bool]:
    """A condition that turns true when ``key``'s remaining time goes up between two polls."""
    last = math.inf

    def renewed() -> bool:
        nonlocal last
        state = store.get(key)
        if state is None or state.done or state.expires_in is None:
            raise AssertionError(f"{key} is not leased now (finished or released): nothing to pause")
        seen, last = last, state.expires_in
        return last > seen

    return renewed


def _expired(store: Store, key: str) -> bool:
    state = store.get(key)
    return state is not None and state.expires_in is not None and state.expires_in <= 0


def kill_mid_run(
    worker: Worker, task_id: str, *, after: Callable[[], object] | None = None, timeout: float = 30.0
) -> int:
    """SIGKILL the process running ``task_id`` (once ``after`` holds, if given); returns its pid.

    With prefork the worker replaces the child; with solo or threads this kills the whole worker.
    """
    pid = worker.pid_of(task_id, timeout)
    if after is not None:
        wait_for(after, timeout, f"the moment to kill {task_id}")
    os.kill(pid, signal.SIGKILL)
    return pid


def redeliver(
    task: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None, task_id: str, **options: Any
) -> Any:
    """Send ``task`` again with the same id, as a broker redelivery does; returns its ``AsyncResult``.

    ``options`` go to ``apply_async`` (``queue=`` to land it on another worker; ``headers=`` if the
    original carried some, such as a ``fence_key``).
    """
    if not task_id:
        raise ValueError("a redelivery carries the task id of the message it repeats")
    return task.apply_async(tuple(args), dict(kwargs or {}), task_id=task_id, **options)


def assert_history_clean(store: Store, key: str | None = None) -> None:
    """Fail with every violation :func:`celery_fence.verify.verify_store` finds in the history (of ``key``,
    or of every key): a stale or duplicate write, a reused or non-increasing token, a double completion."""
    violations = verify_store(store, key)
    if violations:
        lines = "\n".join(f"  {v.key}: {v.rule}: {v.detail}" for v in violations)
        where = mask_url(store.url)
        raise AssertionError(f"{len(violations)} fencing violation(s) in {where}'s history:\n{lines}")


def store_faults_env(*faults: Fault) -> dict[str, str]:
    """The environment that makes a real worker's store calls misbehave (``CELERY_FENCE_STORE_FAULTS``):
    ``fence_worker(app, env=store_faults_env(Fault("lost", method="commit")))``. Each pool process
    counts its own calls, so an ``nth`` fault fires once per process."""
    items = [{**asdict(fault), "outcome": fault.outcome.value} for fault in faults]
    return {STORE_FAULTS_ENV: json.dumps(items)}
