"""The headers a fenced run puts on the copies of itself that it sends, and reads back from them.

Each header carries what one attempt learned for the next delivery of the same message: a copy sent by a
run cannot ask that run, and the store cannot tell a copy's attempts apart.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AWAITED", "HANDOFF", "LOOKS", "WAITING_SINCE", "WAITS", "seconds_or_none", "token_or_none"]

HANDOFF = "fence_handoff"  # the token an attempt hands to the copy of itself that it sends
WAITING_SINCE = "fence_waiting_since"  # when a run first found the store unavailable (epoch s)
WAITS = "fence_waits"  # how many times it was sent again to wait the store out
LOOKS = "fence_looks"  # how many times a copy of a running task id was sent again to look
AWAITED = "fence_awaited"  # the finished token whose delivery (SUCCESS stored) a copy already waited for


def token_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def seconds_or_none(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    return float(value) if ok else None
