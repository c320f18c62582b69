"""``task-fence-*`` monitoring events (Flower shows a task in the state the event names).

- ``task-fence-takeover``: a run took over a lease whose holder went silent (``expired_for`` seconds).
- ``task-fence-lost``: a run's lease was lost while it ran.
- ``task-fence-refused``: a run's write or completion was refused; the standard ``exception`` field says why.
- ``task-fence-duplicate``: a delivery found its key held by the same task id, or already done.

An ordinary run sends none: its key and token are in the store's history (``celery fence show KEY``), and
an event per run would be one more broker publish per task. Every event carries ``key`` and ``token``.
Sending never raises: monitoring must not fail a task.
``fence_send_events = False`` turns all of them off (Flower then shows fenced runs in Celery's own states).
"""

from __future__ import annotations

import logging
from typing import Any

from ._runtime import runtime_for

__all__ = ["absorbed_because", "send_fence_event"]

log = logging.getLogger(__name__)


def send_fence_event(task: Any, request: Any, kind: str, **fields: Any) -> None:
    """Send ``task-fence-<kind>`` for ``request`` (captured by the run: the renewer thread sends too)."""
    if getattr(request, "is_eager", False) or not getattr(request, "hostname", None):
        return  # not in a worker: nobody is listening
    if not runtime_for(task.app).config.send_events:
        return
    policy = task.app.conf.task_publish_retry_policy
    try:
        with task.app.events.default_dispatcher(hostname=request.hostname) as dispatcher:
            dispatcher.send(f"task-fence-{kind}", uuid=request.id, retry=False, retry_policy=policy, **fields)
    except Exception as exc:  # the broker may be down; the task's outcome must not depend on it
        log.warning("could not send task-fence-%s for %s: %s", kind, request.id, exc)


def absorbed_because(reason: str, token: int, detail: str | None = None) -> str:
    """What the log says of an absorbed delivery: the reason word (``done``, ``held``, ``ended``), then what
    happened in words. A token is named only when the key has one to name: an absorbed delivery that never
    acquired has none (it was reported as 0)."""
    if reason == "done":
        return f"done (the key finished with token {token})" if token else "done (the key is finished)"
    if reason == "ended":
        return "ended (this task id already ended: this late copy does not run)"
    if detail and detail != reason:  # fence_on_busy="ignore": who holds the key
        return f"{reason} ({detail}; fence_on_busy='ignore')"
    return f"{reason} (a copy of this task id holds the key: this delivery looks at it again later)"
