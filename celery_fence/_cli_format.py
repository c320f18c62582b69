"""How ``celery fence`` shows things: a key's state, plain-text tables, times, values."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import click

from .lease import LeaseState

__all__ = ["VALUE_WIDTH", "count", "iso", "recovery", "release_effect", "seconds", "state", "table", "value"]

VALUE_WIDTH = 100  # a result or step value longer than this is cut, with "..."


def state(s: LeaseState) -> str:
    if s.dead:
        return "dead"
    if s.done:
        return "done"
    if s.expires_in is None:
        return "released"
    return "live" if s.expires_in > 0 else "expired"


def release_effect(s: LeaseState, done: bool = True) -> str:
    """What ``fence release`` does to a key in state ``s`` (said before it, ``done=False``, and after). It
    bumps the token and frees the key; a finished key stays finished (``AlreadyDone`` to the next run)."""
    if s.done:
        return (
            "the key is done: nobody holds it, so no run is fenced out, and a new delivery still returns its "
            "stored result"
        )
    if s.expires_in is None:  # released, or marked dead with no lease: no holder to fence out
        return "nobody holds the key: no run is fenced out; the next delivery acquires it"
    return "writes with older tokens are refused" if done else "its holder's writes will be refused"


def recovery(s: LeaseState, lost: int | None = None, last: str | None = None) -> str:
    """Recovery copies: started and lost (they count against fence_max_recoveries), the last started one
    when it was not lost (``last``: running, completed, released), sent and not started. ``lost``: from
    the key's history (:func:`celery_fence._cli_recovery.lost_copies`), else every started copy."""
    lost = s.recoveries if lost is None else lost
    parts = [f"{lost} lost"] if lost else []
    parts += [f"1 {last}"] if last else []
    parts += [f"{s.recovery_sent} sent, not started"] if s.recovery_sent else []
    return ", ".join(parts) or "-"


def count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "") -> None:
    """Print plain-text columns; nothing at all when there are no rows."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows] if rows else []:
        click.echo(indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def iso(at: float) -> str:
    moment = datetime.fromtimestamp(at, timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def value(value: Any) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= VALUE_WIDTH else text[: VALUE_WIDTH - 3] + "..."
