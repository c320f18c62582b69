"""Check a store's audit trail against the fencing invariants: the engine of ``celery fence verify``.

:func:`verify` is pure: it reads :class:`~celery_fence.lease.HistoryEvent`\\ s in store order (the order
``store.history()`` returns) and names every violation it finds. Rules:

``token-not-increasing``  an acquire, takeover or admin release issued a token not above the key's max
``token-reused``          a token was issued twice (tokens are unique per store, across keys; on a store
                          with a ``token_scope(key)``, a Redis Cluster, unique within each scope, its slot)
``stale-write``           a write, step, complete or release accepted with a token other than the key's latest
                          issued one (or with an admin release's token, which no run holds)
``double-complete``       a second complete of one key
``write-after-complete``  a write, step or release accepted after the key's complete
``write-after-release``   a write, step, complete or release accepted after the lease was released
``step-duplicate``        the same step committed twice for one key
``step-unlogged``         a committed step (``store.steps(key)``) has no ``step`` event in the history
``reopened-after-prune``  an acquire of a key after its ``pruned`` marker: a finished run was charged again
                          (typically the broker redelivered its message after the prune)
``acquire-after-complete`` an acquire of a finished key that was never pruned (the store should have
                          answered ``AlreadyDone``)
``repeated-write``        fenced transaction writes committed under two tokens in one life of a key: two
                          attempts' ``transaction()`` writes both stayed (they commit with the completion, so
                          only the completing attempt's may)

Renews are not logged, so "no renew after a takeover" is not checked here. ``refused``, ``renew-failed``,
``recovered``, ``dead`` and ``gave-up`` (a run that gave up before it acquired: token 0 on a new key) neither
issue a token nor record an accepted write, so no rule judges them. ``prune`` replaces a finished
key's history with one ``pruned`` marker (its last token); a later acquire of the key is reported and starts
a new life of it (a new result and new steps are then expected; its tokens must still be above the marker's).
A later prune drops old markers, so a key acquired long after its prune is no longer recognised as reopened.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .lease import HistoryEvent
from .stores.base import Store

__all__ = ["RULES", "Violation", "read_store", "verify", "verify_store"]

RULES = (
    "token-not-increasing",
    "token-reused",
    "stale-write",
    "double-complete",
    "write-after-complete",
    "write-after-release",
    "step-duplicate",
    "step-unlogged",
    "reopened-after-prune",
    "acquire-after-complete",
    "repeated-write",
)
ISSUING = frozenset({"acquire", "takeover", "admin-release"})  # events that issue a new token
ACCEPTED = frozenset({"write", "step", "complete", "release"})  # events the store accepted from a holder


@dataclass(frozen=True)
class Violation:
    """One broken invariant: the key, the rule's name, what happened, and the offending event if any."""

    key: str
    rule: str
    detail: str
    event: HistoryEvent | None = None


@dataclass
class _Key:
    issued: HistoryEvent | None = None  # the latest acquire, takeover or admin release
    highest: int = 0  # the highest token issued for the key
    held: bool = False  # a lease is out (acquired and not yet released or completed)
    completed: HistoryEvent | None = None  # the complete of this life of the key
    pruned: HistoryEvent | None = None  # the prune that ended the key's last life, until the next acquire
    written: HistoryEvent | None = None  # the first committed fenced transaction write of this life
    steps: set[str] = field(default_factory=set)


def verify(
    events: Iterable[HistoryEvent],
    steps: Mapping[str, Mapping[str, Any]] | None = None,
    scope: Callable[[str], object] | None = None,
) -> list[Violation]:
    """Every violation in ``events`` (store order); ``steps`` maps a key to its committed steps; ``scope``
    (a store's ``token_scope``) names the keys whose tokens one counter issues (default: every key)."""
    keys: dict[str, _Key] = {}
    issued: dict[tuple[object, int], HistoryEvent] = {}
    logged: set[tuple[str, str]] = set()
    found: list[Violation] = []
    for event in events:
        state = keys.setdefault(event.key, _Key())
        if event.event in ISSUING:
            found += _issue(state, event, issued, None if scope is None else scope(event.key))
        elif event.event == "commit":  # a fenced commit: a token issued and the key completed in one
            found += _issue(state, event, issued, None if scope is None else scope(event.key))
            found += _accept(state, replace(event, event="complete"))
        elif event.event == "pruned":
            state.completed, state.steps, state.held, state.pruned = None, set(), False, event
            state.written = None
            state.highest = max(state.highest, event.token)
        elif event.event in ACCEPTED:
            found += _accept(state, event)
            if event.event == "step":
                logged.add((event.key, event.detail or ""))
    unlogged = [(k, name) for k, names in (steps or {}).items() for name in names if (k, name) not in logged]
    return found + [
        Violation(k, "step-unlogged", f"step {n!r} is committed but never logged") for k, n in unlogged
    ]


def _issue(
    state: _Key, event: HistoryEvent, issued: dict[tuple[object, int], HistoryEvent], scope: object
) -> list[Violation]:
    found = []
    if event.token <= state.highest:
        detail = f"{event.event} issued token {event.token}, not above token {state.highest}"
        found.append(Violation(event.key, "token-not-increasing", detail, event))
    first = issued.setdefault((scope, event.token), event)
    if first is not event:
        detail = f"token {event.token} was already issued by {first.event} of key {first.key!r}"
        found.append(Violation(event.key, "token-reused", detail, event))
    if event.event != "admin-release":
        found += _reopened(state, event)
    state.issued, state.highest = event, max(state.highest, event.token)
    state.held = event.event != "admin-release"
    return found


def _reopened(state: _Key, event: HistoryEvent) -> list[Violation]:
    """A lease issued for a key whose last life ended (pruned, or completed): reported, then a new life."""
    ended, state.pruned = state.pruned or state.completed, None
    if ended is None:
        return []
    state.completed, state.steps, state.written = None, set(), None
    if ended.event == "pruned":
        detail = f"{event.event} with token {event.token} after the key was pruned at token {ended.token}"
        return [Violation(event.key, "reopened-after-prune", detail, event)]
    detail = f"{event.event} with token {event.token} after complete with token {ended.token}, never pruned"
    return [Violation(event.key, "acquire-after-complete", detail, event)]


def _accept(state: _Key, event: HistoryEvent) -> list[Violation]:
    found = []
    stale = _stale(state, event)
    if stale:
        found.append(Violation(event.key, "stale-write", stale, event))
    what = event.event if event.detail is None else f"{event.event} {event.detail!r}"
    if state.completed is not None:
        rule = "double-complete" if event.event == "complete" else "write-after-complete"
        detail = f"{what} with token {event.token} after complete with token {state.completed.token}"
        found.append(Violation(event.key, rule, detail, event))
    elif not state.held and not stale:
        detail = f"{what} with token {event.token} accepted after the lease was released"
        found.append(Violation(event.key, "write-after-release", detail, event))
    if event.event == "write":
        first = state.written = state.written or event
        if first.token != event.token:
            detail = f"writes committed with token {first.token} and with token {event.token}"
            found.append(Violation(event.key, "repeated-write", detail, event))
    if event.event == "step":
        if event.detail in state.steps:
            detail = f"step {event.detail!r} committed again with token {event.token}"
            found.append(Violation(event.key, "step-duplicate", detail, event))
        state.steps.add(event.detail or "")
    if event.event == "complete":
        state.completed = state.completed or event
    if event.event in ("complete", "release") and not stale:
        state.held = False
    return found


def _stale(state: _Key, event: HistoryEvent) -> str:
    """Why ``event``'s token is not the key's current one, or ``""`` if it is."""
    what = f"{event.event} accepted with token {event.token}"
    if state.issued is None:
        return f"{what}, but no token was ever issued for the key"
    if event.token != state.issued.token:
        return f"{what} after {state.issued.event} issued token {state.issued.token}"
    if state.issued.event == "admin-release":
        return f"{what}, which an admin release issued to nobody"
    return ""


def read_store(store: Store, key: str | None = None) -> tuple[list[HistoryEvent], dict[str, dict[str, Any]]]:
    """``store.history(key)`` and the committed steps of every key it names or the store holds."""
    events = store.history(key)
    keys = {key} if key is not None else {e.key for e in events} | {s.key for s in store.leases()}
    return events, {k: store.steps(k) for k in sorted(keys)}


def verify_store(store: Store, key: str | None = None) -> list[Violation]:
    """:func:`verify` over a store's history (of ``key``, or of every key) and committed steps."""
    return verify(*read_store(store, key), scope=token_scope(store))


def token_scope(store: Any) -> Callable[[str], object] | None:
    """The store's ``token_scope`` (the keys one token counter serves), if it has one: a Redis Cluster."""
    scope: Callable[[str], object] | None = getattr(store, "token_scope", None)
    return scope
