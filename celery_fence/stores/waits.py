"""How long a store may wait for a lock that another client holds, bounded for a block of code.

SQLite serialises writers: a write waits for the database's write lock (the connection's busy timeout,
``SessionLimits.lock``) while another process's transaction holds it, and a process stopped inside a
transaction holds it until it resumes or dies. Callers that must not be held hostage by such a transaction
bound the wait of their own statements with :func:`lock_wait`:

- the renewer, by the time left before the lease's local deadline (``LeasePolicy.lock_wait``): a renew
  that can no longer land in time gives up and is retried, instead of returning after the deadline;
- the admin commands and the worker's recovery pass, by :data:`ADMIN_LOCK_WAIT`.

A store that waits for locks reads the bound (:data:`LOCK_WAIT`) before each statement, honours it (never
waiting longer than its own limit) and raises ``StoreUnavailable`` past it: transient, nothing was written.
A store that does not wait for locks (memory, Redis, etcd) ignores it. The bound belongs to the current
thread (a ``ContextVar``), so a renewer's bound never shortens another thread's statements.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["ADMIN_LOCK_WAIT", "LOCK_WAIT", "lock_wait"]

# An admin command or recovery pass gives up on a lock held longer than this (the fence's own writes hold
# it for milliseconds), and says who holds it, rather than hang behind a stopped process.
ADMIN_LOCK_WAIT = 2.0

# The bound set by the innermost lock_wait() of this thread, or None (the store's own limit): a store that
# waits for locks reads it (``LOCK_WAIT.get()``) before each statement; only lock_wait() sets it.
LOCK_WAIT: ContextVar[float | None] = ContextVar("celery_fence_lock_wait", default=None)


@contextmanager
def lock_wait(seconds: float) -> Iterator[None]:
    """Within this block, store statements wait at most ``seconds`` for a lock another client holds
    (0: not at all). Nested blocks keep the shorter bound."""
    outer = LOCK_WAIT.get()
    bound = max(0.0, seconds) if outer is None else min(outer, max(0.0, seconds))
    token = LOCK_WAIT.set(bound)
    try:
        yield
    finally:
        LOCK_WAIT.reset(token)
