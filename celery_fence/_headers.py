"""The headers a fenced run puts on the copies of itself that it sends, and reads back from them.

Each header carries what one attempt learned for the next delivery of the same message: a copy sent by a
run cannot ask that run, and the store cannot tell a copy's attempts apart. Two kinds, kept apart:

- the **lineage** (``LINEAGE``): what every later copy of the task id must know, whoever sends it (the token
  handed over, how many times the fence sent the run again);
- the **attempt** (``ATTEMPT``): the clock and count of one wait before a run acquires (an outage waited
  out, a busy key polled). Only the wait that set them carries them on; every other copy, Celery's own
  ``retry`` included, is sent without them, so a later wait starts its own clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "ATTEMPT",
    "AWAITED",
    "BUSY_SINCE",
    "HANDOFF",
    "LINEAGE",
    "LOOKS",
    "RECOVERED",
    "RESENDS",
    "WAITING_SINCE",
    "WAITS",
    "Attempt",
    "attempt_of",
    "lineage",
    "positive_int",
    "run_name",
    "seconds",
]

HANDOFF = "fence_handoff"  # the token an attempt hands to the copy of itself that it sends
RESENDS = "fence_resends"  # how many times the fence sent this task id again after a run (fence_max_resends)
WAITING_SINCE = "fence_waiting_since"  # when a run first found the store unavailable (epoch s)
WAITS = "fence_waits"  # how many times it was sent again to wait the store out
BUSY_SINCE = "fence_busy_since"  # when a run first found its key held by another task id (epoch s)
LOOKS = "fence_looks"  # how many times a copy was sent again to look at a held key
AWAITED = "fence_awaited"  # the finished token whose delivery (SUCCESS stored) a copy already waited for
RECOVERED = "fence_recovered"  # recovery's attempt number, on the message it sent again

LINEAGE = (HANDOFF, RESENDS)
ATTEMPT = (WAITING_SINCE, WAITS, BUSY_SINCE, LOOKS, AWAITED, RECOVERED)


@dataclass(frozen=True)
class Attempt:
    """What one delivery of a fenced task knows of itself: its message, as the run reads it."""

    task_id: str
    name: str = ""  # the task's name
    eager: bool = False
    retries: int = 0
    handoff: int | None = None
    resends: int = 0
    waiting_since: float | None = None
    waits: int = 0
    busy_since: float | None = None
    looks: int = 0
    awaited_token: int | None = None  # the finished token whose delivery a copy already waited for
    redelivered: bool = False  # the broker says it delivered this message before
    recovered: int | None = None  # recovery sent this message again (its attempt)

    @property
    def copy(self) -> bool:
        """A copy of an earlier delivery: redelivered by the broker, sent again by the fence or recovery."""
        sent_again = (self.recovered, self.handoff, self.resends, self.waits, self.looks, self.awaited_token)
        return self.redelivered or any(sent_again) or bool(self.busy_since)


def attempt_of(request: Any, name: str) -> Attempt:
    """The :class:`Attempt` of the message ``request`` of task ``name`` runs."""
    return Attempt(
        task_id=request.id,
        name=name,
        eager=bool(request.is_eager),
        retries=request.retries or 0,
        handoff=positive_int(request, HANDOFF),
        resends=positive_int(request, RESENDS) or 0,
        waiting_since=seconds(request, WAITING_SINCE),
        waits=positive_int(request, WAITS) or 0,
        busy_since=seconds(request, BUSY_SINCE),
        looks=positive_int(request, LOOKS) or 0,
        awaited_token=positive_int(request, AWAITED),
        redelivered=bool((request.delivery_info or {}).get("redelivered")),
        recovered=positive_int(request, RECOVERED),
    )


def run_name(attempt: Attempt) -> str:
    """``name[task id]``, as Celery's own log lines name a run."""
    return f"{attempt.name}[{attempt.task_id}]"


def lineage(headers: dict[str, Any] | None) -> dict[str, Any]:
    """``headers`` without the attempt's own (what every copy inherits)."""
    return {name: value for name, value in (headers or {}).items() if name not in ATTEMPT}


def positive_int(request: Any, header: str) -> int | None:
    """``header`` of the message ``request`` runs, if it is a positive int (a token or a count)."""
    value = getattr(request, header, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def seconds(request: Any, header: str) -> float | None:
    """``header`` of the message ``request`` runs, if it is a positive number (a time)."""
    value = getattr(request, header, None)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value)
