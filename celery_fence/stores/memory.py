"""The in-memory store: a lock and a dict. The executable specification every other store is tested against.

State lives in the handle (``memory://`` gives each ``open_store`` call its own), so it serves unit tests and
users' tests of their own tasks, not several processes. Time comes from an injectable clock.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from .. import codec
from ..errors import (
    AlreadyDone,
    FailedBefore,
    InvalidArgument,
    LeaseHeld,
    StaleToken,
    StoreUnavailable,
    UsageError,
)
from ..lease import MAX_TOKEN, Abandoned, HistoryEvent, Lease, LeaseState, marking_task_id
from .base import out_of_tokens, past_the_range
from .capabilities import Capabilities
from .memory_rows import Row, is_abandoned, lease_state

__all__ = ["MemoryCommit", "MemoryStore"]


class MemoryStore:
    """Reference implementation of :class:`celery_fence.stores.base.Store`.

    Its arguments come checked: ``open_store`` puts every store behind the front of
    :mod:`celery_fence.stores.front`, which refuses a bad key, lease, ttl, name or number with
    ``InvalidArgument`` before a method here runs. What is left is what a store must do itself."""

    max_value_bytes = codec.MAX_VALUE_BYTES
    capabilities = Capabilities(name="memory", fenced_commit="emulated")

    def __init__(self, url: str = "memory://", clock: Callable[[], float] = time.time) -> None:
        self.url = url
        self.clock = clock
        self._lock = threading.Lock()
        self._rows: dict[str, Row] = {}
        self._steps: dict[str, dict[str, str]] = {}
        self._history: list[HistoryEvent] = []
        self._counter = 0

    def migrate(self) -> None:
        """Nothing to create."""

    def acquire(self, key: str, owner: str, ttl: float, run: Mapping[str, Any] | None = None) -> Lease:
        run_text = codec.dumps_mapping(run, self.max_value_bytes)
        with self._lock:
            now, row = self.clock(), self._rows.get(key)
            if row is not None and row.done:
                raise AlreadyDone(key, row.token, codec.loads(row.result))
            if row is not None and row.expires_at is not None and row.expires_at > now:
                if row.owner == owner:  # our own acquire, retried after a lost reply
                    return Lease(key, row.token, owner)
                raise LeaseHeld(key, row.owner, row.expires_at - now)
            expired_at = None if row is None else row.expires_at
            self._next_token()
            # This acquire starts the key's pending recovery copy, if any: from now on it counts.
            recoveries = 0 if row is None else row.recoveries + (1 if row.sent else 0)
            self._rows[key] = Row(self._counter, owner, now + ttl, run=run_text, recoveries=recoveries)
            self._log(key, "acquire" if expired_at is None else "takeover", self._counter, owner, now)
            gap = None if expired_at is None else now - expired_at
            return Lease(key, self._counter, owner, taken_over=expired_at is not None, expired_for=gap)

    def renew(self, leases: Sequence[Lease], ttl: float) -> list[Lease]:
        lost = []
        with self._lock:
            now = self.clock()
            for lease in leases:
                row = self._current(lease)
                if row is None:
                    lost.append(lease)
                    if not self._finished_by(lease):  # its own completion won the race: no failure
                        self._log(lease.key, "renew-failed", lease.token, lease.owner, now)
                else:
                    row.expires_at = now + ttl
        return lost

    def complete(self, lease: Lease, result: Any) -> None:
        text = codec.dumps(result, self.max_value_bytes)
        with self._lock:
            row = self._require_current(lease, "complete")
            now = self.clock()
            row.done, row.result, row.expires_at, row.finished_at = True, text, None, now
            self._log(lease.key, "complete", lease.token, lease.owner, now)

    def release(self, lease: Lease) -> None:
        with self._lock:
            row = self._current(lease)
            if row is not None:
                row.expires_at = None
                self._log(lease.key, "release", lease.token, lease.owner, self.clock())

    def save_step(self, lease: Lease, name: str, value: Any) -> None:
        text = codec.dumps(value, self.max_value_bytes)
        with self._lock:
            self._require_current(lease, f"step {name}")
            steps = self._steps.setdefault(lease.key, {})
            if name in steps:
                raise InvalidArgument(f"step {name!r} of key {lease.key!r} is already committed")
            steps[name] = text
            self._log(lease.key, "step", lease.token, lease.owner, self.clock(), name)

    def steps(self, key: str) -> dict[str, Any]:
        with self._lock:
            return {name: codec.loads(text) for name, text in self._steps.get(key, {}).items()}

    def refuse(self, lease: Lease, what: str) -> None:
        with self._lock:
            self._log(lease.key, "refused", lease.token, lease.owner, self.clock(), what)

    def get(self, key: str) -> LeaseState | None:
        with self._lock:
            row = self._rows.get(key)
            return None if row is None else lease_state(key, row, self.clock())

    def history(self, key: str | None = None) -> list[HistoryEvent]:
        with self._lock:
            return [copy.copy(e) for e in self._history if key is None or e.key == key]

    def leases(self) -> list[LeaseState]:
        with self._lock:
            now = self.clock()
            return [lease_state(key, row, now) for key, row in sorted(self._rows.items())]

    def force_release(self, key: str) -> int:
        with self._lock:
            row = self._rows.get(key)
            if row is None:
                raise InvalidArgument(f"no lease for key {key!r}")
            self._next_token()
            row.token, row.owner, row.expires_at = self._counter, None, None
            self._log(key, "admin-release", row.token, None, self.clock())
            return row.token

    def prune(self, older_than: float) -> int:
        with self._lock:
            now = self.clock()
            cutoff = now - older_than
            gone = {k: r for k, r in self._rows.items() if r.done and (r.finished_at or 0) <= cutoff}
            # Their history goes with them, and so do the markers of earlier prunes older than the
            # cutoff (before this prune writes its own): growth stays bounded.
            self._history = [
                e for e in self._history if e.key not in gone and not (e.event == "pruned" and e.at <= cutoff)
            ]
            for key, row in gone.items():
                del self._rows[key]
                self._steps.pop(key, None)
                self._log(key, "pruned", row.token, None, now)
            return len(gone)

    def advance(self, gap: int) -> int:
        with self._lock:
            if self._counter + gap > MAX_TOKEN:
                raise past_the_range(gap, self._counter)
            self._counter += gap
            return self._counter

    def abandoned(self, grace: float, limit: int = 100) -> list[Abandoned]:
        with self._lock:
            now = self.clock()
            rows = [(k, r) for k, r in self._rows.items() if is_abandoned(r, now, grace)]
            rows.sort(key=lambda item: item[1].expires_at or 0)
            return [Abandoned(k, r.token, codec.loads(r.run), r.recoveries, r.sent) for k, r in rows[:limit]]

    def recover(self, seen: Abandoned, max_recoveries: int, reason: str = "") -> int | None:
        key, token = seen.key, seen.token
        with self._lock:
            now, row = self.clock(), self._rows.get(key)
            seen_now = None if row is None else (row.token, row.recoveries, row.sent)
            unchanged = seen_now == (token, seen.recoveries, seen.sent)
            if row is None or not unchanged or not is_abandoned(row, now, 0.0):
                return None
            row.recovered_at = now
            if row.recoveries >= max_recoveries:
                self._mark_dead(key, row, "dead", reason or f"gave up after {row.recoveries} recoveries", now)
                return 0
            row.sent += 1
            self._log(key, "recovered", token, row.owner, now, str(row.recoveries + 1))
            return row.recoveries + 1

    def strand(self, key: str, run: Mapping[str, Any] | None, reason: str) -> bool:
        run_text = codec.dumps_mapping(run, self.max_value_bytes)
        with self._lock:
            row = self._rows.get(key)
            if row is not None and (row.done or row.expires_at is not None):
                return False  # finished, or leased (an expired lease is recovery's)
            if row is not None and marking_task_id(run) is not None and _ended_by_a_copy(row, run):
                return False  # a fenced commit's FAILURE: a run of its task id marked it first
            row = self._rows[key] = row or Row(0, None, None)  # a new key: no token issued
            row.owner, row.run = None, run_text
            self._mark_dead(key, row, "gave-up", reason, self.clock())
            return True

    # -- fence_mode="commit", emulated: the claim is atomic, but no transaction holds the body's writes --

    def begin_commit(
        self, key: str, owner: str, ttl: float, run: Mapping[str, Any] | None = None
    ) -> MemoryCommit:
        with self._lock:
            row = self._rows.get(key)
            if row is not None and row.done:
                raise AlreadyDone(key, row.token, codec.loads(row.result))
            if row is not None and row.expires_at is not None and row.expires_at > self.clock():
                raise LeaseHeld(key, row.owner, row.expires_at - self.clock())
            if row is not None and row.dead is not None and _ended_by_a_copy(row, run):
                raise FailedBefore(key, row.token, row.dead)
        return MemoryCommit(self, Lease(key, 0, owner), run)

    def claim(self, key: str, owner: str, result: Any, run: Mapping[str, Any] | None = None) -> int:
        text = codec.dumps(result, self.max_value_bytes)
        run_text = codec.dumps_mapping(run, self.max_value_bytes)
        with self._lock:
            now, row = self.clock(), self._rows.get(key)
            if row is not None and (row.done or _leased(row, now) or _ended_by_a_copy(row, run)):
                self._log(key, "refused", 0, owner, now, "commit")
                raise StaleToken(key, 0, row.token, "commit", recorded=True)
            token = self._next_token()
            self._rows[key] = Row(token, owner, None, True, text, run_text, now)
            self._log(key, "commit", token, owner, now)
            return token

    def close(self) -> None:
        """Nothing to close; state stays readable."""

    # -- internals (callers hold the lock) --

    def _next_token(self) -> int:
        if self._counter >= MAX_TOKEN:
            raise out_of_tokens()
        self._counter += 1
        return self._counter

    def _current(self, lease: Lease) -> Row | None:
        row = self._rows.get(lease.key)
        live = row is not None and row.token == lease.token and not row.done
        return row if live and row is not None and row.expires_at is not None else None

    def _finished_by(self, lease: Lease) -> bool:
        row = self._rows.get(lease.key)
        return row is not None and row.done and row.token == lease.token

    def _require_current(self, lease: Lease, what: str) -> Row:
        row = self._current(lease)
        if row is None:
            current = self._rows[lease.key].token if lease.key in self._rows else None
            self._log(lease.key, "refused", lease.token, lease.owner, self.clock(), what)
            raise StaleToken(lease.key, lease.token, current, what, recorded=True)
        return row

    def _mark_dead(self, key: str, row: Row, event: str, reason: str, now: float) -> None:
        row.dead = reason
        self._log(key, event, row.token, row.owner, now, reason)

    def _log(
        self,
        key: str,
        event: str,
        token: int,
        owner: str | None,
        at: float,
        detail: str | None = None,
    ) -> None:
        self._history.append(HistoryEvent(at, event, token, owner, detail, key=key))


def _leased(row: Row, now: float) -> bool:
    return row.expires_at is not None and row.expires_at > now


def _ended_by_a_copy(row: Row, run: Mapping[str, Any] | None) -> bool:
    """A copy of this run's task id ended it FAILURE, and marked the key dead with its run record."""
    task_id = (run or {}).get("id")
    if row.dead is None or task_id is None or not row.run:
        return False
    return bool((codec.loads(row.run) or {}).get("id") == task_id)


class MemoryCommit:
    """The memory store's fenced commit: its completion is the atomic claim; it has no transaction, so a
    body's writes elsewhere are not undone with a refused claim (the start-up check warns)."""

    def __init__(self, store: MemoryStore, lease: Lease, run: Mapping[str, Any] | None) -> None:
        self.store, self.lease, self.run = store, lease, run
        self.token: int | None = None
        self.open, self.lost_work = True, False

    @contextmanager
    def block(self) -> Iterator[None]:
        if not self.open:
            raise StoreUnavailable("the run's emulated commit ended before its completion")
        yield None

    def save_step(self, name: str, value: Any) -> None:
        raise UsageError("fence_mode='commit' keeps no steps: use fence_mode='lease' for a checkpointed task")

    def complete(self, result: Any) -> None:
        try:
            self.token = self.store.claim(self.lease.key, self.lease.owner, result, self.run)
        finally:
            self.open = False

    def close(self) -> None:
        self.open = False
