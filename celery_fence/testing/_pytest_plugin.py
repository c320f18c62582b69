"""celery-fence's pytest plugin: the ``fence_*`` fixtures (docs/testing.md).

Loaded by the ``pytest11`` entry point ``celery_fence`` once the package is installed (``-p no:celery_fence``
turns it off), or by ``pytest_plugins = ["celery_fence.testing"]``. Every fixture is named ``fence_*``, so
none redefines pytest-celery's or ``celery.contrib.pytest``'s; ``fence_in_process_worker`` builds on the
latter's ``celery_app``. The ``fence_contract_*`` fixtures serve the store contract suite
(``celery_fence.testing.contract``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from ..stores import Store, open_store
from ..stores.urls import mask_url
from ._app_under_test import SendGuard, app_under_test
from ._contract_plugin import (
    fence_contract_expire,
    fence_contract_harness,
    fence_contract_seeded,
    fence_contract_store,
)
from ._faults import Worker
from ._indeterminate import Fault, IndeterminateStore
from ._inprocess import in_process_worker
from ._kit import StoreProxy

__all__ = [
    "ProxyFactory",
    "WorkerFactory",
    "fence_contract_expire",
    "fence_contract_harness",
    "fence_contract_seeded",
    "fence_contract_store",
]

# A test's store URL, by the short names fence_store_url takes through indirect parametrization.
SHORT_URLS = {"memory": "memory://", "sqlite": "sqlite:///{workdir}/fence.db"}


class WorkerFactory(Protocol):
    """The type of the ``fence_worker`` fixture."""

    def __call__(self, app_path: str, name: str | None = None, **options: Any) -> Worker: ...


class ProxyFactory(Protocol):
    """The type of the ``fence_store_proxy`` fixture."""

    def __call__(self, target: str, port: int | None = None) -> StoreProxy: ...


@pytest.fixture
def fence_workdir(tmp_path: Path) -> Path:
    """This test's folder for worker logs, a SQLite store and any state the test keeps on disk."""
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
def fence_store_proxy() -> Iterator[ProxyFactory]:
    """Make a :class:`StoreProxy`: ``fence_store_proxy(store_url)`` or ``fence_store_proxy(host, port)``;
    closed at teardown."""
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


@pytest.fixture
def fence_store_url(request: pytest.FixtureRequest, fence_workdir: Path) -> str:
    """The URL ``fence_store`` opens: ``memory://``. Parametrize it (``indirect=True``) with ``"memory"``,
    ``"sqlite"`` (a file in ``fence_workdir``) or a URL, or override the fixture."""
    name = getattr(request, "param", "memory")
    return SHORT_URLS.get(name, name).format(workdir=fence_workdir)


@pytest.fixture
def fence_store(fence_store_url: str) -> Iterator[Store]:
    """This test's fence store, migrated; closed at teardown."""
    store = open_store(fence_store_url)
    try:
        store.migrate()
        yield store
    finally:
        store.close()


@pytest.fixture
def fence_store_faults() -> list[Fault]:
    """Faults for ``fence_in_process_worker``'s store calls (none); parametrize it to lose replies. A
    fault that fires once (``nth``) and never fired by the end of the test fails it."""
    return []


@pytest.fixture
def fence_celery_config(fence_store: Store) -> dict[str, Any]:
    """Settings to merge into your ``celery_config``: ``fence_store``, and leases short enough for a test.

    A 3 s lease renewed every 0.5 s: a lease left by a stopped run expires within the test, and five
    renews can fail in a row (a busy test machine) before a healthy run counts its lease as lost. A run
    waits out an unavailable store for 10 s, not 600. Late acks and a re-queued message when a pool
    process dies, as the worker's start-up check asks.
    """
    return {
        "fence_store_url": fence_store.url,
        "fence_lease_ttl": 3.0,
        "fence_renew_interval": 0.5,
        "fence_store_wait": 10.0,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
    }


@pytest.fixture
def fence_app(request: pytest.FixtureRequest) -> Any:
    """The app ``fence_in_process_worker`` runs: pytest-celery's ``celery_app``. Return your own app instead
    (in your ``conftest.py``) to test the tasks you made with ``@app.task``: for each test the plugin
    switches it to Celery's memory broker and result backend and ``fence_celery_config``, then puts it
    back."""
    app = request.getfixturevalue("celery_app")
    request.node.stash[_CELERY_APP] = app
    return app


_CELERY_APP = pytest.StashKey[Any]()


@pytest.fixture
def fence_in_process_worker(
    request: pytest.FixtureRequest,
    fence_app: Any,
    fence_celery_config: dict[str, Any],
    celery_includes: Any,
    celery_worker_parameters: Any,
    fence_store_url: str,
    fence_store: Store,
    fence_store_faults: list[Fault],
) -> Iterator[Any]:
    """``celery.contrib.pytest``'s ``celery_worker`` (which pytest-celery's Docker ``celery_worker``
    shadows) for fenced tasks: a worker thread on ``fence_app`` whose runs use ``fence_store``, with the
    threads pool (4 threads: runs can overlap) and a stop that takes no 2 to 4 s.

    ``celery_includes`` are imported first; ``celery_worker_parameters`` go to the worker (``pool`` and
    ``concurrency`` too). pytest-celery's ``celery_app`` must be configured with ``fence_celery_config``;
    your own app (``fence_app``) is configured for the test by the plugin. A task sent through an app that
    is not the one under test fails the test, naming it.
    """
    with contextlib.ExitStack() as stack:
        if request.node.stash.get(_CELERY_APP, None) is fence_app:
            _check_configured(fence_app, fence_store_url, fence_store)
        else:
            stack.enter_context(app_under_test(fence_app, fence_celery_config))
        _poll_memory_broker_often(fence_app)
        for module in celery_includes:
            fence_app.loader.import_task_module(module)
        options = {"pool": "threads", "concurrency": 4, **celery_worker_parameters}
        faulty = IndeterminateStore(fence_store, fence_store_faults) if fence_store_faults else None
        guard = stack.enter_context(SendGuard(fence_app))
        with in_process_worker(fence_app, store=faulty or fence_store, **options) as worker:
            yield worker
    problem = guard.problem()
    if problem:
        pytest.fail(problem, pytrace=False)
    unfired = [fault for fault in faulty.faults if fault.rate is None] if faulty else []
    if faulty and unfired:  # the test passed without the fault it was written for
        pytest.fail(f"fence_store_faults never fired: {unfired}; store calls: {faulty.calls}", pytrace=False)


def _check_configured(app: Any, fence_store_url: str, fence_store: Store) -> None:
    configured = app.conf.get("fence_store_url")
    if configured not in (fence_store.url, fence_store_url):
        pytest.fail(
            f"celery_app's fence_store_url is {mask_url(configured)!r}, not fence_store's "
            f"{mask_url(fence_store.url)!r}: merge fence_celery_config into your celery_config fixture "
            "(function scope), e.g. return {**fence_celery_config, ...}",
            pytrace=False,
        )


def _poll_memory_broker_often(app: Any) -> None:
    """kombu's memory transport sleeps a second after each empty poll: each message, and the worker's
    stop, would wait up to that long. It lives in this process only, so polling it every 10 ms costs
    nothing elsewhere (on Redis the same option would mean a BRPOP every 10 ms: left alone)."""
    options = dict(app.conf.broker_transport_options or {})
    if str(app.conf.broker_url or "").startswith("memory:") and "polling_interval" not in options:
        app.conf.broker_transport_options = {**options, "polling_interval": 0.01}
