"""Celery's in-process worker (``celery.contrib.testing``) for the run-level contract tests, stopped at once.

Its thread stops only when its blocking loop wakes: the loop drains the broker with a 2 s timeout and, once
it has seen the stop, drains once more (``synloop`` in ``celery/worker/loops.py``), so each stop cost 2 to
4 s, about three minutes of this suite. Two no-op messages wake both drains.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.worker import state

__all__ = ["memory_app", "running_worker"]

WAKE = "celery_fence_tests.wake"


def memory_app(name: str, **conf: Any) -> Celery:
    """An app on the memory broker and result backend, polled often, with the no-op that wakes its worker."""
    app = Celery(name, broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(conf)
    app.conf.broker_transport_options = {"polling_interval": 0.01}
    app.task(name=WAKE, shared=False, ignore_result=True)(_nothing)
    return app


@contextmanager
def running_worker(app: Celery, pool: str = "solo", concurrency: int = 1) -> Iterator[None]:
    with start_worker(app, pool=pool, concurrency=concurrency, perform_ping_check=False, shutdown_timeout=10):
        yield
        state.should_terminate = 0  # what start_worker sets on the way out; the messages make the loop see it
        for _ in range(2):  # one for the drain under way, one for the drain after the stop is seen
            app.send_task(WAKE, ignore_result=True)


def _nothing() -> None:
    """The wake-up message's task."""
