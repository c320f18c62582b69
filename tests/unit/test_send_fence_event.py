"""``send_fence_event``: who sends, and ``fence_send_events`` turning every fence event off."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_fence._events import send_fence_event
from celery_fence._runtime import runtime_for
from celery_fence.testing import free_port


class Dispatcher:
    def __init__(self, sent: list[tuple[str, dict[str, Any]]]) -> None:
        self.sent = sent

    def __enter__(self) -> Dispatcher:
        return self

    def __exit__(self, *_: Any) -> None:
        return None

    def send(self, kind: str, **fields: Any) -> None:
        self.sent.append((kind, fields))


def _task(send_events: bool | None) -> tuple[Any, list[tuple[str, dict[str, Any]]]]:
    app = Celery("events", set_as_current=False)
    app.conf.fence_store_url = "memory://"
    if send_events is not None:
        app.conf.fence_send_events = send_events
    sent: list[tuple[str, dict[str, Any]]] = []
    app.events.default_dispatcher = lambda **_: Dispatcher(sent)  # type: ignore[method-assign]
    return SimpleNamespace(app=app), sent


WORKER_RUN = SimpleNamespace(id="t1", hostname="w@h", is_eager=False)


@pytest.mark.parametrize("send_events", [None, True])
def test_a_worker_run_sends_its_fence_events(send_events: bool | None) -> None:
    task, sent = _task(send_events)
    send_fence_event(
        runtime_for(task.app).config, task, WORKER_RUN, "refused", key="k", token=3, exception="stale"
    )
    assert [(kind, f["uuid"], f["key"]) for kind, f in sent] == [("task-fence-refused", "t1", "k")]


def test_fence_send_events_false_sends_none() -> None:
    task, sent = _task(False)
    for kind in ("acquired", "lost", "refused", "duplicate"):
        send_fence_event(runtime_for(task.app).config, task, WORKER_RUN, kind, key="k", token=3)
    assert sent == []


def test_an_eager_run_sends_nothing() -> None:
    task, sent = _task(True)
    eager = SimpleNamespace(id="t1", hostname=None, is_eager=True)
    send_fence_event(runtime_for(task.app).config, task, eager, "lost", key="k", token=1)
    assert sent == []


def test_a_broker_that_does_not_answer_drops_the_event_with_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Sending never fails the run: the broker refuses the connection, the event is dropped and said."""
    app = Celery("events", broker=f"redis://127.0.0.1:{free_port()}/0", set_as_current=False)
    app.conf.fence_store_url = "memory://"
    app.conf.task_publish_retry_policy = {"max_retries": 0}
    with caplog.at_level(logging.WARNING, logger="celery_fence"):
        config = runtime_for(app).config
        send_fence_event(
            config, SimpleNamespace(app=app), WORKER_RUN, "refused", key="k", token=3, exception="stale"
        )
    (record,) = [r for r in caplog.records if r.name.startswith("celery_fence")]
    assert record.getMessage().startswith("could not send task-fence-refused for t1: ")


@pytest.mark.parametrize(
    ("reason", "token", "detail", "says"),
    [
        ("held", 0, None, "absorbed: held (a copy of this task id holds the key: this delivery looks"),
        ("held", 0, "lease 'k' is held by w:1:x, expires in 2.0s", "held (lease 'k' is held by w:1:x"),
        ("ended", 0, None, "absorbed: ended (this task id already ended"),
        ("done", 0, None, "absorbed: done (the key is finished)"),
        ("done", 7, None, "absorbed: done (the key finished with token 7)"),
    ],
)
def test_the_log_line_of_an_absorbed_delivery_says_what_happened(
    caplog: pytest.LogCaptureFixture, reason: str, token: int, detail: str | None, says: str
) -> None:
    """Never "held (token 0)": a delivery absorbed before it acquired has no token."""
    from celery_fence.task import _Host

    task, _ = _task(True)
    task.name = "shop.charge"
    host = _Host(task, SimpleNamespace(id="t1", hostname=None, is_eager=True), runtime_for(task.app))
    extra = {} if detail is None else {"detail": detail}
    with caplog.at_level("INFO", logger="celery_fence.task"):
        host.report("duplicate", "k", token, reason=reason, **extra)
    (line,) = [r.getMessage() for r in caplog.records if "absorbed" in r.getMessage()]
    assert line.startswith("fence: duplicate delivery of k absorbed: ") and says in line
    assert "token 0" not in line
