"""OpenTelemetry for celery-fence (extra ``otel``): the fence's attributes and events on each task's span.

opentelemetry-instrumentation-celery's ``CeleryInstrumentor`` gives every task run a span (``run/<task>``).
``connect(app)`` puts on the spans of ``app``'s fenced runs, from celery-fence's own signals
(:mod:`celery_fence.signals`): ``fence.key``; ``fence.token`` once the run holds a lease (a duplicate of a
finished key: the key's token); ``fence.ending``, ``run_ended``'s word for how the delivery ended
(``completed``, ``duplicate``, ``refused``, ``requeued``, ``gave_up``, ``raised``, ``ignored``);
``fence.takeover`` (``True`` when the run took over an expired lease, with ``fence.takeover.expired_for`` when
the store tells how long it had been expired); ``fence.duplicate.reason`` (``done``, ``held``, ``ended``); and
the span events ``fence.lease_lost`` and ``fence.write_refused``, each with ``fence.reason`` and
``fence.token``.

The span is the one the instrumentation keeps for the task id (its ``utils.retrieve_context``), not the
current span: a lease is lost in the renewer's thread. No span (the task not instrumented) or a span that is
not recording: nothing is done. Each app has its own receivers (Celery keys them by the app), which ignore
the signals of other apps' tasks; they hold no OpenTelemetry state, so a worker connects them in its main
process before the pool forks and each pool process uses the tracer provider it set up itself.

When opentelemetry-instrumentation-celery cannot be imported, ``connect`` connects nothing and returns
``False``: the fence's signals keep no receiver of this module, and a run calls nothing of it.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

from . import signals

__all__ = [
    "DUPLICATE_REASON",
    "ENDING",
    "EXPIRED_FOR",
    "KEY",
    "LEASE_LOST",
    "REASON",
    "TAKEOVER",
    "TOKEN",
    "WRITE_REFUSED",
    "connect",
    "disconnect",
]

log = logging.getLogger(__name__)

KEY, TOKEN, ENDING = "fence.key", "fence.token", "fence.ending"
TAKEOVER, EXPIRED_FOR = "fence.takeover", "fence.takeover.expired_for"
DUPLICATE_REASON = "fence.duplicate.reason"
LEASE_LOST, WRITE_REFUSED, REASON = "fence.lease_lost", "fence.write_refused", "fence.reason"

# (task, task id) -> (span, activation, token) or None: how the instrumentation finds a task run's span.
Lookup = Callable[[Any, str], Any]


def _span_lookup() -> Lookup | None:
    """The instrumentation's own lookup of a run's span, or ``None`` when it cannot be imported."""
    try:
        utils: Any = importlib.import_module("opentelemetry.instrumentation.celery.utils")
    except ImportError:
        return None
    lookup: Lookup | None = getattr(utils, "retrieve_context", None)
    if lookup is None:  # a release that no longer keeps spans this way: say so once, at connect
        log.warning("celery-fence: opentelemetry-instrumentation-celery lacks retrieve_context: no spans")
    return lookup


class _Spans:
    """The receivers of one app: each signal of one of its tasks' runs, onto that run's span."""

    def __init__(self, app: Any, lookup: Lookup) -> None:
        self.app, self.lookup = app, lookup

    def receivers(self) -> list[tuple[Any, Callable[..., None]]]:
        return [
            (signals.lease_acquired, self.acquired),
            (signals.lease_takeover, self.takeover),
            (signals.lease_lost, self.event(LEASE_LOST)),
            (signals.write_refused, self.event(WRITE_REFUSED)),
            (signals.lease_duplicate, self.duplicate),
            (signals.run_ended, self.ended),
        ]

    def span(self, sender: Any, task_id: Any) -> Any:
        """The recording span of ``task_id``'s run if ``sender`` is a task of this app, else ``None``."""
        if getattr(sender, "app", None) is not self.app or not task_id:
            return None
        found = self.lookup(sender, task_id)
        span = found[0] if found else None
        return span if span is not None and span.is_recording() else None

    def acquired(
        self, sender: Any = None, key: str = "", token: int = 0, task_id: str = "", **_: Any
    ) -> None:
        if (span := self.span(sender, task_id)) is not None:
            span.set_attributes({KEY: key, TOKEN: token, TAKEOVER: False})

    def takeover(
        self, sender: Any = None, task_id: str = "", expired_for: float | None = None, **_: Any
    ) -> None:
        if (span := self.span(sender, task_id)) is not None:
            span.set_attribute(TAKEOVER, True)
            if expired_for is not None:
                span.set_attribute(EXPIRED_FOR, max(0.0, float(expired_for)))

    def event(self, name: str) -> Callable[..., None]:
        def receive(
            sender: Any = None, token: int = 0, task_id: str = "", reason: str = "", **_: Any
        ) -> None:
            if (span := self.span(sender, task_id)) is not None:
                span.add_event(name, {REASON: str(reason), TOKEN: token})

        return receive

    def duplicate(
        self, sender: Any = None, key: str = "", token: int = 0, task_id: str = "", reason: str = "", **_: Any
    ) -> None:
        if (span := self.span(sender, task_id)) is not None:
            found: dict[str, Any] = {KEY: key, DUPLICATE_REASON: reason}
            if token:  # 0: the delivery met a key it never held (a finished key names its token)
                found[TOKEN] = token
            span.set_attributes(found)

    def ended(self, sender: Any = None, key: str = "", task_id: str = "", ending: str = "", **_: Any) -> None:
        if (span := self.span(sender, task_id)) is not None:
            span.set_attributes({KEY: key, ENDING: ending})


def _uid(app: Any, signal: Any) -> str:
    return f"celery_fence.telemetry.{id(app)}.{signal.name}"


def connect(app: Any) -> bool:
    """Put the fence's attributes and events on the spans of ``app``'s runs; idempotent per app.

    ``False``: opentelemetry-instrumentation-celery cannot be imported, and nothing was connected.
    """
    lookup = _span_lookup()
    if lookup is None:
        return False
    for signal, receiver in _Spans(app, lookup).receivers():
        signal.connect(receiver, weak=False, dispatch_uid=_uid(app, signal))
    return True


def disconnect(app: Any) -> None:
    for signal, _ in _Spans(app, lambda task, task_id: None).receivers():
        signal.disconnect(dispatch_uid=_uid(app, signal))
