"""Your own Celery app, tested in-process: switched to Celery's memory broker and result backend and the
test's fence store for one test, then put back; and a guard against tasks sent through another app.

A task defined with ``@app.task`` is bound to ``app`` for good: its ``delay()`` publishes on ``app``'s
broker, whatever app the test's worker runs. Left on the production settings, such a test talks to the
real broker (a live worker there runs it and the test passes, falsely) or waits for nothing.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from celery import _state
from celery.signals import before_task_publish

from ..stores.urls import mask_url

__all__ = ["IN_MEMORY", "SendGuard", "app_under_test"]

# What pytest-celery's test app uses: nothing outside this process.
IN_MEMORY = {"broker_url": "memory://", "result_backend": "cache+memory://", "broker_heartbeat": 0}

_MISSING = object()


@contextlib.contextmanager
def app_under_test(app: Any, settings: dict[str, Any]) -> Iterator[Any]:
    """``app`` with ``settings`` and :data:`IN_MEMORY` over its own, as the current and default app, for the
    block; then its settings, connections and the current app are as they were."""
    changes = {**settings, **IN_MEMORY}
    saved = {name: app.conf.get(name, _MISSING) for name in changes}
    current, default = _state.get_current_app(), _state.default_app
    _drop_connections(app)  # made on the production settings, if any
    app.conf.update(changes)
    _state.set_default_app(app)
    app.set_current()
    try:
        yield app
    finally:
        _drop_connections(app)  # the memory broker's: the app's next use connects on its own settings
        for name, value in saved.items():
            if value is _MISSING:
                app.conf.pop(name, None)
            else:
                app.conf[name] = value
        _state.set_default_app(default)
        _state._set_current_app(current)


def _drop_connections(app: Any) -> None:
    """Forget the broker pool, the producer pool and the result backend (Celery's ``_after_fork`` does the
    same for a forked child), so that the next use builds them from the settings of now. The pools are
    kombu's, shared by every app on the same URL: closing one would break the others."""
    app._pool = None
    if "amqp" in vars(app):
        app.amqp._producer_pool = None
    app._backend_cache = None
    app._local.backend = None


class SendGuard:
    """While connected, notes every task sent that the app under test does not have: it was sent through
    another app, to that app's broker, and no in-process worker of this test will run it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.strays: dict[str, Any] = {}  # task name: the app it was sent through

    def __enter__(self) -> SendGuard:
        before_task_publish.connect(self._check, weak=False)
        return self

    def __exit__(self, *_: object) -> None:
        before_task_publish.disconnect(self._check)

    def _check(self, sender: str | None = None, **_: Any) -> None:
        app = _publishing_app()
        if sender and app is not None and app is not self.app:
            self.strays.setdefault(sender, app)

    def problem(self) -> str | None:
        """What went wrong and how to fix it, or None."""
        if not self.strays:
            return None
        owners = [
            f"{name} (on app {app.main!r}, broker {mask_url(str(app.conf.broker_url))!r})"
            for name, app in self.strays.items()
        ]
        return (
            f"sent through an app that is not the one under test: {', '.join(owners)}; the in-process worker "
            f"runs {self.app.main or 'celery_app'!r} on the memory broker, so it never saw them. A task made "
            "with @app.task is bound to your app: return that app from a fence_app fixture in your "
            "conftest.py, and the plugin runs it in-process on the memory broker and the test's store "
            "(docs/testing.md, 'Your own app')"
        )


def _publishing_app() -> Any:
    """The app whose ``send_task_message`` is sending now, read off its frame: the signal names only the
    task, and ``@app.task`` tasks are shared, so every app has one of that name. None if not found."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "send_task_message" and "amqp" in frame.f_code.co_freevars:
            return getattr(frame.f_locals.get("amqp"), "app", None)
        frame = frame.f_back  # type: ignore[assignment]
    return None
