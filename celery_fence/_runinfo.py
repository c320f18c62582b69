"""What recovery needs to send a run's message again, recorded with its lease at acquire.

Recovery must re-send the *same* message, not just the same call: a chain's next tasks, a chord's body and
a group's bookkeeping travel in the message (``chain``, ``link``, ``chord``, ``group``...), and a message
routed through an exchange by a routing key that differs from its queue's name must come back to that queue.
So the record holds the task's name, id and arguments, the execution options Celery itself re-sends on a
retry (``Context.as_execution_options``), and the route: exchange, routing key, priority, and the queue the
message came on when this process can tell it (a queue it consumes bound to that exchange and key).

An ``eta`` is not kept (the run already started: its copy is due at once); ``expires`` is, so a copy of an
expired message is revoked as the original would have been.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import codec
from .errors import NotSerializable

__all__ = ["resend_options", "run_info"]

# Execution options that are the sender's or the worker's, not the message's: a re-send sets its own.
_NOT_KEPT = ("task_id", "origin")


def run_info(task: Any, request: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> codec.Encoded:
    """The run's record, encoded once here (the store keeps this text instead of encoding it again).

    Arguments and options that JSON cannot carry are left out (``args`` is then ``None``): the run still
    runs, but recovery cannot send it again and says so.
    """
    info: dict[str, Any] = {"task": task.name, "id": request.id, "args": list(args), "kwargs": dict(kwargs)}
    if getattr(request, "fence_key", None) is not None:
        info["fence_key"] = request.fence_key
    sent = request.as_execution_options().items()
    options = {k: v for k, v in sent if v is not None and k not in _NOT_KEPT}
    if not options.get("headers"):
        options.pop("headers", None)
    options.update(_route(task.app, request.delivery_info or {}))
    info["options"] = options
    try:
        return codec.Encoded(info)
    except NotSerializable as exc:
        info.update(args=None, kwargs=None, options=None, dropped=str(exc))
        return codec.Encoded(info)


def _route(app: Any, delivery: Mapping[str, Any]) -> dict[str, Any]:
    """Exchange, routing key, priority, and the queue the message came on when it can be told."""
    route = {k: delivery[k] for k in ("exchange", "routing_key", "priority") if delivery.get(k) is not None}
    queue = _queue_of(app, route.get("exchange"), route.get("routing_key"))
    if queue is not None:
        route["queue"] = queue
    return route


def _queue_of(app: Any, exchange: str | None, routing_key: str | None) -> str | None:
    """The queue bound to ``exchange`` by ``routing_key``, preferring the ones this worker consumes."""
    if not routing_key:
        return None
    if not exchange:  # the default (anonymous) exchange routes by queue name
        return routing_key
    queues = app.amqp.queues
    for candidates in (queues.consume_from or {}, queues):
        found = [
            name
            for name, queue in dict(candidates).items()
            if queue.exchange is not None
            and queue.exchange.name == exchange
            and queue.routing_key == routing_key
        ]
        if len(found) == 1:
            return str(found[0])
    return None


def resend_options(run: Mapping[str, Any]) -> dict[str, Any]:
    """``send_task`` options that send the recorded message again: same id, options and route.

    Records written before the options were kept carry a ``queue`` only: sent there, as then.
    """
    options = dict(run.get("options") or {})
    if not run.get("options") and run.get("queue"):
        options["queue"] = run["queue"]
    if run.get("fence_key") is not None:
        options["headers"] = {**(options.get("headers") or {}), "fence_key": run["fence_key"]}
    return {"args": run["args"], "kwargs": run["kwargs"], "task_id": run["id"], **options}
