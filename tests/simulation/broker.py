"""A simulated broker: every message the app sends is captured here, and delivered when the program says,
through Celery's own tracer as a worker's pool process runs it (``trace_task_ret``, eager=False)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery.app.trace import trace_task_ret
from kombu.serialization import dumps

__all__ = ["Message", "SimBroker"]


@dataclass
class Message:
    name: str
    headers: dict[str, Any]
    body: Any
    content_type: str
    encoding: str
    due: float  # the clock reading before which a worker does not run it (countdown / eta)
    redelivered: bool = False
    serial: int = 0  # the order it was sent in
    origin: str = ""  # "recovery": sent by a recovery pass
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return str(self.headers["id"])

    def describe(self) -> str:
        looks = {k: v for k, v in self.headers.items() if k.startswith("fence_")}
        retries = self.headers.get("retries") or 0
        args = self.headers.get("argsrepr")
        fence = f" {looks}" if looks else ""
        return f"{self.name}{args}[{self.id}] retries={retries} due={self.due:g}{fence}"


class SimBroker:
    """Installs itself on ``app``: ``app.send_task`` records the countdown, ``amqp.send_task_message``
    captures the message (JSON round trip, as a real transport does) and hands it to ``on_send``."""

    def __init__(self, app: Any, now: Callable[[], float], on_send: Callable[[Message], None]) -> None:
        self.app, self.now, self.on_send = app, now, on_send
        self._countdown: list[float] = []
        self._serial = 0
        send_task = app.send_task

        def send(*args: Any, **options: Any) -> Any:
            self._countdown.append(float(options.get("countdown") or 0.0))
            try:
                return send_task(*args, **options)
            finally:
                self._countdown.pop()

        app.send_task = send
        app.amqp.send_task_message = self._capture

    def _capture(self, producer: Any, name: str, message: Any, **options: Any) -> None:
        headers, properties, body, _ = message
        headers = {**headers, **(options.get("headers") or {})}  # as send_task_message merges them
        content_type, encoding, data = dumps(body, serializer="json")
        headers = json.loads(json.dumps(headers, default=str))
        countdown = self._countdown[-1] if self._countdown else 0.0
        self._serial += 1
        self.on_send(
            Message(headers["task"], headers, data, content_type, encoding, self.now() + countdown,
                    serial=self._serial, extra={"properties": dict(properties)})
        )

    def deliver(self, message: Message, hostname: str = "sim@worker") -> tuple[int, Any]:
        """Run ``message`` as a prefork pool process does; returns ``(failed, result)`` of the tracer."""
        request = dict(message.headers)
        properties = message.extra.get("properties", {})
        request.update(
            properties=properties,
            reply_to=properties.get("reply_to"),
            correlation_id=properties.get("correlation_id"),
            hostname=hostname,
            delivery_info={"exchange": "", "routing_key": "celery", "priority": 0,
                           "redelivered": message.redelivered},
        )
        failed, result, _ = trace_task_ret(
            message.name, message.id, request, message.body, message.content_type, message.encoding,
            app=self.app,
        )
        return failed, result
