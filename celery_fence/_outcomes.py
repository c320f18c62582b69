"""What happened to a run, as the decide table's events, and what the run asks of its host.

The task maps Celery's control flow to the table (docs/guarantees.md#every-exit): which exception left the
body, how the run's transaction stands when the body returned, how a completion failed. ``RunHost`` is the
little a run needs of its Celery task: the body, the result backend's word, and someone to tell.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from celery.exceptions import Ignore, Reject, Retry, SoftTimeLimitExceeded, TimeLimitExceeded

from ._decide import Event
from .errors import StaleToken, StoreUnavailable
from .fence import Fence

__all__ = ["ENDED_STATES", "FAILED_STATES", "RunHost", "body_event", "completion_event", "returned_event"]

log = logging.getLogger(__name__)

FAILED_STATES = frozenset({"FAILURE", "REVOKED"})  # a task id Celery reported ended without success
ENDED_STATES = FAILED_STATES | {"SUCCESS"}  # a task id whose ending Celery delivered: a copy adds nothing


class RunHost(Protocol):
    """What a run needs of its task: the body, the result backend's word, and someone to tell."""

    def body(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any: ...
    def outcome(self) -> str | None: ...  # this task id's state in the result backend; None: nothing tells
    def acquired(self, fence: Fence) -> None: ...
    def released(self, fence: Fence) -> None: ...
    def report(self, what: str, key: str, token: int, **fields: Any) -> None: ...


def body_event(exc: BaseException) -> Event:
    """What the body's exception means to Celery (and so to the run)."""
    if isinstance(exc, Retry):
        return Event.RETRIED
    if isinstance(exc, Reject):
        return Event.REJECTED
    if isinstance(exc, Ignore):
        return Event.IGNORED
    if isinstance(exc, (SoftTimeLimitExceeded, TimeLimitExceeded)) or not isinstance(exc, Exception):
        return Event.INTERRUPTED
    return Event.RAISED


def returned_event(fence: Fence) -> Event:
    if fence.work_lost:
        return Event.RETURNED_WORK_LOST
    return Event.RETURNED_BLOCK_UNDONE if fence.block_undone else Event.RETURNED


def completion_event(exc: StaleToken | StoreUnavailable) -> Event:
    if isinstance(exc, StaleToken):
        return Event.COMPLETE_REFUSED
    log.warning("fence: completion unconfirmed, reading the key: %s", exc)
    return Event.COMPLETE_UNKNOWN
