"""The fault kit: test your own fenced tasks on real workers, against real faults.

Enable the fixtures in your top-level ``conftest.py`` (the kit needs pytest; ``import celery_fence`` alone
never imports it)::

    pytest_plugins = ["celery_fence.testing"]

Then a test starts real ``celery -A <your app> worker`` processes, injects a fault into the very process
that runs a task, and checks the store's audit trail::

    from celery_fence import open_store
    from celery_fence.testing import assert_history_clean, committed, paused, redeliver, wait_for
    from myapp.tasks import app, charge   # fence_key="invoice:{invoice_id}"

    def test_a_paused_run_is_fenced_out(fence_worker):
        store = open_store(app.conf.fence_store_url)
        a = fence_worker("myapp.tasks", name="a", queues="a")
        fence_worker("myapp.tasks", name="b", queues="b")
        result = charge.apply_async((7,), queue="a")
        with paused(a, result.id, store, "invoice:7", after=committed(store, "invoice:7", "total")):
            redeliver(charge, (7,), {}, result.id, queue="b")  # the broker's copy, elsewhere
            wait_for(lambda: store.get("invoice:7").done, 30, "the copy to finish")
        wait_for(lambda: "refused" in [e.event for e in store.history("invoice:7")], 30, "the refusal")
        assert_history_clean(store)

The workers get the environment you pass them (``env=``); configure the app object in the test process
the same way (same broker), since :meth:`Worker.pid_of` asks the worker through remote control.
See ``docs/testing.md`` for every fixture and fault.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import pytest

from ._faults import Worker, wait_for
from ._indeterminate import Fault, IndeterminateStore, Outcome
from ._proxy import Proxy
from .stores.base import Store
from .stores.urls import mask_url
from .verify import verify_store

__all__ = [
    "FakeClock",
    "Fault",
    "IndeterminateStore",
    "Outcome",
    "ProxyFactory",
    "StoreProxy",
    "Worker",
    "WorkerFactory",
    "assert_history_clean",
    "committed",
    "fence_workdir",
    "fence_worker",
    "kill_mid_run",
    "paused",
    "redeliver",
    "store_proxy",
    "wait_for",
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
    defaults = {"postgresql": 5432, "postgres": 5432, "redis": 6379, "rediss": 6379, "etcd": 2379}
    scheme = parts.scheme.split("+", 1)[0]
    if scheme not in defaults or not parts.hostname:
        shown = mask_url(url)
        raise ValueError(f"expected a postgresql://, redis:// or etcd:// URL with a host, got {shown!r}")
    return parts.hostname, parts.port or defaults[scheme]


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


# -- pytest fixtures --


class WorkerFactory(Protocol):
    """The type of the ``fence_worker`` fixture."""

    def __call__(self, app_path: str, name: str | None = None, **options: Any) -> Worker: ...


class ProxyFactory(Protocol):
    """The type of the ``store_proxy`` fixture."""

    def __call__(self, target: str, port: int | None = None) -> StoreProxy: ...


@pytest.fixture
def fence_workdir(tmp_path: Path) -> Path:
    """This test's folder for worker logs and any state the test keeps on disk."""
    return tmp_path


@pytest.fixture
def fence_worker(fence_workdir: Path, request: pytest.FixtureRequest) -> Iterator[WorkerFactory]:
    """Start real workers: ``fence_worker("myapp.tasks", name="a", queues="a", pool="prefork",
    concurrency=1, env={...}, args=["--fence-recover"])`` returns a started :class:`Worker`.

    Every worker is stopped at teardown, also when the test fails; then their logs are printed.
    """
    workers: list[Worker] = []
    failed_before = request.session.testsfailed

    def start(app_path: str, name: str | None = None, **options: Any) -> Worker:
        worker = Worker(app_path, name or f"worker{len(workers) + 1}", fence_workdir, **options)
        workers.append(worker)
        return worker.start()

    try:
        yield start
    finally:
        with contextlib.ExitStack() as stack:  # stops them all, whichever stop raises
            for worker in workers:
                worker.terminate()  # all at once: a warm shutdown takes seconds
                stack.callback(worker.stop)
        if request.session.testsfailed > failed_before:
            for worker in workers:
                print(f"\n----- {worker.nodename}: {worker.log_path} -----\n{worker.log_text()[-8000:]}")


@pytest.fixture
def store_proxy() -> Iterator[ProxyFactory]:
    """Make a :class:`StoreProxy`: ``store_proxy(store_url)`` or ``store_proxy(host, port)``; closed at
    teardown."""
    proxies: list[StoreProxy] = []

    def make(target: str, port: int | None = None) -> StoreProxy:
        proxy = StoreProxy.for_url(target) if port is None else StoreProxy(target, port)
        proxies.append(proxy)
        return proxy

    try:
        yield make
    finally:
        for proxy in proxies:
            proxy.close()
