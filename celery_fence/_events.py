"""``task-fence-*`` monitoring events (Flower shows a task in the state the event names).

- ``task-fence-takeover``: a run took over a lease whose holder went silent (``expired_for`` seconds).
- ``task-fence-lost``: a run's lease was lost while it ran.
- ``task-fence-refused``: a run's write or completion was refused; the standard ``exception`` field says why.
- ``task-fence-duplicate``: a delivery found its key held by the same task id, or already done.

What a monitor keeps after the run is the last event's fields merged over the earlier ones' (Celery's
``events.State``, which Flower uses). So the worker's own end-of-run events of a fenced task
(:func:`final_fields`) clear what an earlier delivery left and carry what the message says the fence did.

An ordinary run sends none: its key and token are in the store's history (``celery fence show KEY``), and
an event per run would be one more broker publish per task. Every event carries ``key`` and ``token``.
Sending never raises: monitoring must not fail a task.
``fence_send_events = False`` turns all of them off (Flower then shows fenced runs in Celery's own states).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ._delivery import AWAITED, LOOKS, RECOVERED, RESENDS, WAITS, non_negative_int
from .config import FenceConfig

__all__ = ["final_fields", "send_fence_event"]

log = logging.getLogger(__name__)


def send_fence_event(config: FenceConfig, task: Any, request: Any, kind: str, **fields: Any) -> None:
    """Send ``task-fence-<kind>`` for ``request`` (captured by the run: the renewer thread sends too), unless
    ``config`` (the run's) turns fence events off."""
    if getattr(request, "is_eager", False) or not getattr(request, "hostname", None):
        return  # not in a worker: nobody is listening
    if not config.send_events:
        return
    policy = task.app.conf.task_publish_retry_policy
    try:
        with task.app.events.default_dispatcher(hostname=request.hostname) as dispatcher:
            dispatcher.send(f"task-fence-{kind}", uuid=request.id, retry=False, retry_policy=policy, **fields)
    except Exception as exc:  # the broker may be down; the task's outcome must not depend on it
        log.warning("could not send task-fence-%s for %s: %s", kind, request.id, exc)


def final_fields(kind: str, headers: Mapping[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """The fields of the worker's ``task-succeeded`` or ``task-failed`` for a fenced task, given the
    message's ``headers`` (the main process sends these, with what the run returned or raised).

    A ``task-succeeded`` clears ``exception`` and ``traceback``: a monitor keeps those of an earlier
    delivery of the same task id (a refused write, a busy key's RETRY) on the SUCCESS row otherwise. Both
    carry ``fence``, what the fence did to this message before it ended (sent again, recovered, waited),
    when it did anything; a SUCCESS row shows it after the result, since Flower displays no other field."""
    story = fence_story(headers)
    if kind == "task-succeeded":
        fields = {**fields, "exception": None, "traceback": None}
        if story and isinstance(fields.get("result"), str):
            fields["result"] = f"{fields['result']}  [fence: {story}]"
    if story:
        fields["fence"] = story
    return fields


def fence_story(headers: Mapping[str, Any]) -> str:
    """What the fence headers of a message say happened to its task id before this delivery."""

    def count(name: str) -> int:
        value = headers.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    parts = []
    if count(RECOVERED):
        parts.append(f"re-sent by recovery (attempt {count(RECOVERED)})")
    if count(RESENDS):
        parts.append(f"sent again by the fence {_times(count(RESENDS))}, no retry spent")
    if count(WAITS):
        parts.append(f"waited out an unavailable store {_times(count(WAITS))}")
    if count(LOOKS):
        parts.append(f"looked again at its held key {_times(count(LOOKS))}")
    if non_negative_int(headers.get(AWAITED)) is not None:  # a token, 0 for a key that never had one
        parts.append("waited for the finished run's ending to be stored")
    return "; ".join(parts)


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"
