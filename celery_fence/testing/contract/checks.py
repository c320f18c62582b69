"""Helpers of the store contract suite: a dump of everything a store holds, the check that a refused call
raised a FenceError and changed nothing, token scopes, and processes racing on one store."""

from __future__ import annotations

import contextlib
import multiprocessing
from typing import Any

import pytest

from celery_fence import FenceError
from celery_fence.stores.base import AdminStore, AuditStore, RecoveryStore, lacking

TTL = 30.0
MAX_TOKEN = 2**53 - 1
# The roles beyond the run role; a module of the suite names those its tests need in REQUIRES.
EVERY_ROLE = (AuditStore, AdminStore, RecoveryStore)


def audits(store: Any) -> bool:
    """Whether ``store`` keeps a history (``AuditStore``): a run-only store's contract skips those checks."""
    return not lacking(store, AuditStore)


def in_scopes(harness: Any, issued: list[tuple[str, int]]) -> dict[object, list[int]]:
    """Tokens ``(key, token)`` in the order issued, by the scope one counter orders (``token_scope``: the
    whole store, or a Redis Cluster slot): within each, tokens strictly increase."""
    scopes: dict[object, list[int]] = {}
    for key, token in issued:
        scopes.setdefault(harness.token_scope(key), []).append(token)
    return scopes


def keys_in_one_scope(harness: Any, base: str, count: int, like: str | None = None) -> list[str]:
    """``count`` keys named ``base<n>`` whose tokens one counter orders (the scope of ``like``, or of the
    first): on a one-counter store simply ``base0``, ``base1``, ..."""
    names = (f"{base}{n}" for n in range(10**7))
    scope = harness.token_scope(like) if like is not None else None
    found: list[str] = []
    for name in names:
        if like is None and not found:
            scope = harness.token_scope(name)
        if harness.token_scope(name) == scope:
            found.append(name)
            if len(found) == count:
                return found
    raise AssertionError(f"no {count} keys in one scope")


def dump(store: Any) -> Any:
    """Everything a store holds, except the seconds left on live leases (time passes while we look)."""
    states = [
        (s.key, s.token, s.owner, s.done, s.result, s.dead, s.expires_in is None) for s in store.leases()
    ]
    return states, store.history(), {s[0]: store.steps(s[0]) for s in states}


def seed(store: Any, expire: Any) -> Any:
    """A live lease, a finished key, a step and a refusal, so there is something to break."""
    done = store.acquire("done", "a", TTL)
    store.save_step(done, "one", 1)
    store.complete(done, {"ok": True})
    old = store.acquire("live", "a", TTL)
    expire()
    live = store.acquire("live", "b", TTL)
    with contextlib.suppress(FenceError):
        store.complete(old, "stale")
    return store, live


def abandon(store: Any, expire: Any) -> Any:
    """A run on key ``k`` whose lease expired, as recovery sees it (an ``Abandoned``)."""
    store.acquire("k", "a", TTL, {"task": "t", "id": "1", "args": [], "kwargs": {}})
    expire()
    (seen,) = store.abandoned(0.0)
    return seen


def lease_calls(store: Any, lease: Any) -> list[Any]:
    """Every call that takes a lease, with that lease."""
    return [
        lambda: store.renew([lease], TTL),
        lambda: store.complete(lease, 1),
        lambda: store.release(lease),
        lambda: store.save_step(lease, "s", 1),
        lambda: store.refuse(lease, "x"),
    ]


def refused_cleanly(store: Any, call: Any, *errors: type[BaseException]) -> FenceError:
    before = dump(store)
    with pytest.raises(FenceError) as info:
        call()
    assert isinstance(info.value, errors or (FenceError,)), repr(info.value)
    assert dump(store) == before, "bad input changed the store"
    return info.value


def in_processes(target: Any, args: list[tuple[Any, ...]]) -> list[Any]:
    """Run ``target(*each, out)`` in one forked process per ``each``; what each put on ``out``, in order
    of arrival. Every process must exit cleanly."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*each, out)) for each in args]
    for p in procs:
        p.start()
    reports = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return reports
