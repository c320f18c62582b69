"""The headers a fenced run puts on the copies of itself that it sends, and reads back from them.

Each header carries what one attempt learned for the next delivery of the same message: a copy sent by a
run cannot ask that run, and the store cannot tell a copy's attempts apart.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AWAITED", "HANDOFF", "LOOKS", "WAITING_SINCE", "WAITS", "seconds", "whole"]

HANDOFF = "fence_handoff"  # the token an attempt hands to the copy of itself that it sends
WAITING_SINCE = "fence_waiting_since"  # when a run first found the store unavailable (epoch s)
WAITS = "fence_waits"  # how many times it was sent again to wait the store out
LOOKS = "fence_looks"  # how many times a copy of a running task id was sent again to look
AWAITED = "fence_awaited"  # the finished token whose delivery (SUCCESS stored) a copy already waited for


def whole(request: Any, header: str) -> int | None:
    """``header`` of the message ``request`` runs, if it is a positive int (a token or a count)."""
    value = getattr(request, header, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def seconds(request: Any, header: str) -> float | None:
    """``header`` of the message ``request`` runs, if it is a positive number (a time)."""
    value = getattr(request, header, None)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value)
