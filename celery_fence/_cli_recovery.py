"""What ``celery fence`` says about recovery beyond one pass: the expired leases a ``recover`` pass left alone
and why, and what became of a key's recovery copies (the ``RECOVERY`` column of ``leases``).

The library's own keys (``celery-fence:...``, the recoverer's election) are never a user's run: they are
left out of what is counted here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from .lease import HistoryEvent, LeaseState, recovery_backoff
from .recovery import RecoveryReport
from .worker.election import RESERVED_PREFIX

__all__ = ["Skipped", "copy_started_by_holder", "internal", "lost_copies", "skipped"]

# The most expired leases one ``recover`` explains; past that it says how many it did not look at.
EXPLAINED = 1000
ACQUIRES = ("acquire", "takeover")


def internal(key: str) -> bool:
    """A key of the library's own (the recoverer's election), not a user's run."""
    return key.startswith(RESERVED_PREFIX)


@dataclass(frozen=True)
class Skipped:
    """Expired leases a pass did not re-send, for one reason; ``due``: when a pass would take them."""

    keys: list[str]
    reason: str
    due: datetime | None = None


def skipped(store: Any, report: RecoveryReport, grace: float, default_grace: bool) -> list[Skipped]:
    """The expired, unfinished, not-dead leases that the pass just made neither re-sent nor marked dead.

    ``abandoned(0)`` lists every one of them (no grace, no backoff), oldest first; each is then read once
    for how long it has been expired (by the store's clock) and, for a copy that has not started, when the
    last copy was sent (its history)."""
    handled = {*report.resent, *report.dead}
    waiting = [a for a in store.abandoned(0.0, EXPLAINED) if a.key not in handled and not internal(a.key)]
    early: list[tuple[str, float]] = []
    queued: list[tuple[str, datetime | None]] = []
    other: list[str] = []
    now = datetime.now(timezone.utc)
    for seen in waiting:
        state = store.get(seen.key)
        if state is None or state.expires_in is None or state.done or state.dead:
            continue  # finished, released or marked dead since: nothing skipped
        expired_for = -state.expires_in
        if expired_for < grace:
            early.append((seen.key, grace - expired_for))
        elif state.recovery_sent:
            queued.append((seen.key, _copy_due(store, seen.key, state, grace)))
        else:
            other.append(seen.key)
    groups = []
    if early:
        given = f"--grace {grace:g}s" + (" (the default: the lease ttl)" if default_grace else "")
        due = now + timedelta(seconds=max(left for _, left in early))
        reason = f"expired less than {given} ago; run again after {_clock(due)} or pass --grace 0"
        groups.append(Skipped([k for k, _ in early], reason, due))
    if queued:
        dues = [d for _, d in queued if d is not None]
        latest = max(dues) if dues else None
        after = f"; run again after {_clock(latest)}" if latest is not None else ""
        reason = (
            "a copy sent by an earlier pass has not started yet (queued): the next is sent no sooner than "
            f"1, 1, 2, 4 ... 32 graces after the last{after}"
        )
        groups.append(Skipped([k for k, _ in queued], reason, latest))
    if other:
        groups.append(
            Skipped(other, "taken by another recoverer meanwhile, or past this pass's first 100; run again")
        )
    return groups


def _copy_due(store: Any, key: str, state: LeaseState, grace: float) -> datetime | None:
    """When the key's next copy may be sent, by the store's clock: the wait after its last ``recovered``
    claim. ``None`` if the store keeps no history to say when that was."""
    history = getattr(store, "history", None)
    claims = [] if history is None else [e.at for e in history(key) if e.event == "recovered"]
    if not claims:
        return None
    return datetime.fromtimestamp(claims[-1] + grace * recovery_backoff(state.recovery_sent), timezone.utc)


def _clock(moment: datetime) -> str:
    return moment.strftime("%H:%M:%S UTC")


def copy_started_by_holder(events: Sequence[HistoryEvent]) -> bool:
    """Whether the key's last acquire started a recovery copy: a ``recovered`` claim came between it and
    the acquire before it (the store counts that acquire in ``recoveries``, and the copy is then the
    lease's holder, or the run that completed or released it)."""
    acquires = [i for i, e in enumerate(events) if e.event in ACQUIRES]
    if not acquires:
        return False
    for event in reversed(events[: acquires[-1]]):
        if event.event in ACQUIRES:
            return False
        if event.event == "recovered":
            return True
    return False


def lost_copies(state: LeaseState, events: Sequence[HistoryEvent] | None) -> tuple[int, str | None]:
    """How many of the key's started recovery copies were lost, and what became of the last one if it was
    not (``running``, ``completed``, ``released``). ``events``: the key's history, or ``None`` when the
    store keeps none (then every started copy is counted, as the store counts them)."""
    if not state.recoveries or events is None or not copy_started_by_holder(events):
        return state.recoveries, None
    if state.done:
        return state.recoveries - 1, "completed"
    if state.dead:
        return state.recoveries, None
    if state.expires_in is None:
        return state.recoveries - 1, "released"
    if state.expires_in > 0:
        return state.recoveries - 1, "running"
    return state.recoveries, None  # the copy's lease expired too: lost
