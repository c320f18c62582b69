"""celery_fence.telemetry: the fence's attributes and events on the span opentelemetry-instrumentation-celery
gives each run, here of eager runs on a memory store with a fake clock (an SDK tracer provider of the test's
own, its spans kept in memory); and nothing connected when OpenTelemetry cannot be imported. The same on a
real worker: tests/integration/test_worker_spans.py."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from celery_fence import FencedTask, LeaseHeld, StaleToken, signals, telemetry
from celery_fence._runtime import Renewer, runtime_for
from celery_fence.stores.memory import MemoryStore
from celery_fence.testing import FakeClock
from celery_fence.worker.bootstep import add_worker_steps

FENCE_SIGNALS = [getattr(signals, name) for name in signals.__all__]


def make_app(name: str, clock: FakeClock) -> Celery:
    app = Celery(name, broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.fence_store_url = "memory://"
    runtime_for(app)._store = MemoryStore(clock=clock)
    return app


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> Iterator[Celery]:
    monkeypatch.setattr(Renewer, "_ensure_thread", lambda self: None)
    app = make_app("unit-otel", clock)
    yield app
    telemetry.disconnect(app)
    runtime_for(app).close()


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """Celery instrumented with a tracer provider of this test's own (the global one is left alone)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    CeleryInstrumentor().instrument(tracer_provider=provider)
    yield exporter
    CeleryInstrumentor().uninstrument()
    provider.shutdown()


def run_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("run/")]


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return {k: v for k, v in (span.attributes or {}).items() if k.startswith("fence.")}


def events(span: ReadableSpan) -> list[tuple[str, dict[str, Any]]]:
    """The fence's span events (the instrumentation adds its own: an ``exception`` for a FAILURE)."""
    return [(e.name, dict(e.attributes or {})) for e in span.events if e.name.startswith("fence.")]


def connected(signal: Any) -> list[str]:
    """The dispatch uids of ``signal``'s receivers that are celery_fence.telemetry's."""
    return [str(key[0]) for key, _ in signal.receivers if str(key[0]).startswith("celery_fence.telemetry")]


def test_a_completed_run_and_a_duplicate_of_it_carry_the_key_token_and_ending(
    app: Celery, exporter: InMemorySpanExporter
) -> None:
    assert telemetry.connect(app)

    @app.task(base=FencedTask, bind=True, name="unit.charge", fence_key="order:{order}", shared=False)
    def charge(self: Any, order: int) -> int:
        return order

    assert charge.apply((7,)).get() == 7
    assert charge.apply((7,)).get() == 7  # the key is done: its stored result, unrun
    first, second = run_spans(exporter)
    assert attributes(first) == {
        "fence.key": "order:7", "fence.token": 1, "fence.takeover": False, "fence.ending": "completed"
    }  # fmt: skip
    assert attributes(second) == {
        "fence.key": "order:7", "fence.token": 1, "fence.duplicate.reason": "done",
        "fence.ending": "duplicate",
    }  # fmt: skip
    assert events(first) == events(second) == []


def test_a_takeover_says_how_long_the_old_lease_had_expired(
    app: Celery, exporter: InMemorySpanExporter, clock: FakeClock
) -> None:
    telemetry.connect(app)

    @app.task(base=FencedTask, bind=True, name="unit.take", fence_key="k", shared=False)
    def take(self: Any) -> int:
        return int(self.fence.token)

    runtime_for(app).store.acquire("k", "a dead worker", 5.0)
    clock.advance(7.5)
    assert take.apply().get() == 2
    (span,) = run_spans(exporter)
    assert attributes(span) == {
        "fence.key": "k", "fence.token": 2, "fence.takeover": True, "fence.takeover.expired_for": 2.5,
        "fence.ending": "completed",
    }  # fmt: skip


def test_a_refused_write_is_an_event_and_the_ending(app: Celery, exporter: InMemorySpanExporter) -> None:
    telemetry.connect(app)
    store = runtime_for(app).store

    @app.task(base=FencedTask, bind=True, name="unit.late", fence_key="k", shared=False)
    def late(self: Any) -> str:
        store.force_release(self.fence.key)  # an operator fences this run out while it works
        return "late"

    result = late.apply()
    assert isinstance(result.result, StaleToken)
    (span,) = run_spans(exporter)
    assert attributes(span) == {
        "fence.key": "k", "fence.token": 1, "fence.takeover": False, "fence.ending": "refused"
    }  # fmt: skip
    assert events(span) == [("fence.write_refused", {"fence.reason": "completion", "fence.token": 1})]


def test_a_lease_lost_in_another_thread_is_an_event_of_the_runs_span(
    app: Celery, exporter: InMemorySpanExporter
) -> None:
    """The renewer reports a lost lease from its own thread, where the run's span is not the current one."""
    telemetry.connect(app)

    @app.task(base=FencedTask, bind=True, name="unit.lost", fence_key="k", shared=False)
    def lost(self: Any) -> int:
        fields = {"key": "k", "token": self.fence.token, "task_id": self.request.id}
        fields["reason"] = "renew refused"
        renewer = threading.Thread(target=lambda: signals.lease_lost.send(sender=self, **fields))
        renewer.start()
        renewer.join()
        return 1

    lost.apply()
    (span,) = run_spans(exporter)
    assert events(span) == [("fence.lease_lost", {"fence.reason": "renew refused", "fence.token": 1})]


def test_a_busy_key_under_on_busy_fail_ends_raised_without_a_token(
    app: Celery, exporter: InMemorySpanExporter
) -> None:
    telemetry.connect(app)

    @app.task(base=FencedTask, bind=True, name="unit.busy", fence_key="k", fence_on_busy="fail", shared=False)
    def busy(self: Any) -> None:
        pass

    runtime_for(app).store.acquire("k", "someone-else", 30)
    assert isinstance(busy.apply().result, LeaseHeld)
    (span,) = run_spans(exporter)
    assert attributes(span) == {"fence.key": "k", "fence.ending": "raised"}


def test_another_apps_runs_are_left_alone(
    app: Celery, exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    other = make_app("unit-otel-other", clock)
    telemetry.connect(other)
    try:

        @app.task(base=FencedTask, bind=True, name="unit.mine", shared=False)
        def mine(self: Any) -> int:
            return 1

        mine.apply()
        (span,) = run_spans(exporter)
        assert attributes(span) == {}
    finally:
        telemetry.disconnect(other)
        runtime_for(other).close()


def test_connecting_twice_connects_once_and_disconnect_removes_them(app: Celery) -> None:
    telemetry.connect(app)
    telemetry.connect(app)
    assert sum(len(connected(signal)) for signal in FENCE_SIGNALS) == 6
    telemetry.disconnect(app)
    assert sum(len(connected(signal)) for signal in FENCE_SIGNALS) == 0


def test_without_opentelemetry_nothing_is_connected(app: Celery, monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenTelemetry not installed (its imports fail): the worker's start connects no receiver to the fence's
    signals, so a run calls nothing of celery_fence.telemetry, and nothing of OpenTelemetry is imported."""
    for name in [n for n in sys.modules if n == "opentelemetry" or n.startswith("opentelemetry.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import opentelemetry... raises ImportError
    assert telemetry.connect(app) is False
    add_worker_steps(instance=SimpleNamespace(app=app))  # what celeryd_init does at a worker's start
    assert [uid for signal in FENCE_SIGNALS for uid in connected(signal)] == []
    assert [n for n in sys.modules if n.startswith("opentelemetry.")] == []
