"""Celery's in-process worker for the run-level contract tests: the plugin's ``in_process_worker`` (stopped at
once), on an app with the memory broker and result backend; gates that hold a run in its body."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest
from celery import Celery

from celery_fence._runtime import Renewer, runtime_for
from celery_fence.testing import in_process_worker

__all__ = ["Gates", "eager_app", "memory_app", "running_worker"]


def memory_app(name: str, **conf: Any) -> Celery:
    """An app on the memory broker and result backend, polled often (kombu's default sleeps 1 s)."""
    app = Celery(name, broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(conf)
    app.conf.broker_transport_options = {"polling_interval": 0.01}
    return app


@contextmanager
def eager_app(name: str, store: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Celery]:
    """An app whose fenced tasks run in process (``task.apply()``) on ``store``, with no background renews;
    the store stays open for its own fixture to close."""
    monkeypatch.setattr(Renewer, "_ensure_thread", lambda self: None)
    app = Celery(name, broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.fence_store_url = store.url
    runtime = runtime_for(app)
    runtime._store = store
    try:
        yield app
    finally:
        runtime._store = None
        runtime.close()


def running_worker(app: Celery, pool: str = "solo", concurrency: int = 1) -> AbstractContextManager[Any]:
    """One task at a time unless asked: these tests set the app's runtime store themselves."""
    return in_process_worker(app, pool=pool, concurrency=concurrency, shutdown_timeout=10)


class Gates:
    """A run named ``tag`` waits in its body until the test opens its gate."""

    def __init__(self) -> None:
        self._gates: dict[str, threading.Event] = {}
        self.entered: set[str] = set()

    def wait(self, tag: str) -> None:
        self.entered.add(tag)
        self._gates.setdefault(tag, threading.Event()).wait(30)

    def open(self, tag: str) -> None:
        self._gates.setdefault(tag, threading.Event()).set()
