"""Celery's in-process worker (``celery.contrib.testing.worker.start_worker``), stopped at once; no pytest.

Its thread stops only when its blocking loop wakes: the loop drains the broker with a 2 s timeout and, once
it has seen the stop, drains once more (``synloop`` in ``celery/worker/loops.py``), so each stop costs 2 to
4 s. Two no-op messages on a queue the worker consumes wake both drains.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from celery.contrib.testing.worker import start_worker
from celery.signals import setup_logging
from celery.worker import state

from .._runtime import _ATTR, runtime_for
from ..stores.base import Store

__all__ = ["WAKE", "in_process_worker"]

WAKE = "celery_fence.testing.wake"


@contextmanager
def in_process_worker(
    app: Any, *, pool: str = "threads", concurrency: int = 4, store: Store | None = None, **options: Any
) -> Iterator[Any]:
    """Run ``app``'s worker in a thread of this process while the block runs; yields its ``WorkController``.

    ``store``: the fence store its runs use, this very object (a ``memory://`` store exists only as the
    object: ``open_store`` makes a new one each time); the worker never closes it. ``options`` go to
    ``start_worker`` (``perform_ping_check`` is off: it needs Celery's test app). The test process's
    logging is left alone: Celery's set-up would empty the root logger's handlers (pytest's capture, so
    ``caplog`` too), set its level to ERROR and stop ``celery.task`` propagating to it.
    """
    if WAKE not in app.tasks:
        app.task(name=WAKE, shared=False, ignore_result=True)(_nothing)
    runtime = None
    if store is not None:
        runtime = runtime_for(app)
        runtime._store = cast(Store, _Lent(store))
    options = {"perform_ping_check": False, **options}
    try:
        with contextlib.ExitStack() as stack:
            setup_logging.connect(_keep_logging)  # a receiver: Celery then configures no logger
            try:
                worker = stack.enter_context(start_worker(app, pool=pool, concurrency=concurrency, **options))
            finally:
                setup_logging.disconnect(_keep_logging)
            try:
                yield worker
            finally:
                _wake(app)
    finally:
        if runtime is not None:
            runtime.close()  # its renewer; the lent store stays open
            vars(app).pop(_ATTR, None)  # the app's next worker starts a runtime of its own


def _keep_logging(**_: Any) -> None:
    """Celery's ``setup_logging`` receiver while an in-process worker starts: logging stays pytest's."""


def _wake(app: Any) -> None:
    state.should_terminate = 0  # what start_worker sets on the way out; the messages make the loop see it
    queue = next(iter(app.amqp.queues.consume_from), None)  # the worker's -Q, else every queue
    with contextlib.suppress(Exception):  # a broker that refuses them only makes the stop slower
        for _ in range(2):  # one for the drain under way, one for the drain after the stop is seen
            app.send_task(WAKE, queue=queue, ignore_result=True)


def _nothing() -> None:
    """The wake-up message's task."""


class _Lent:
    """A store lent to the worker's runtime: every call goes through, ``close()`` is left to its owner."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def close(self) -> None:
        """The owner closes it (the test, ``fence_store``'s teardown)."""
