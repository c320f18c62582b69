"""Helpers for testing fenced tasks: a fake clock for the memory store (more fixtures arrive with the
fault kit)."""

from __future__ import annotations

import threading

__all__ = ["FakeClock"]


class FakeClock:
    """A clock that only moves when told to: ``MemoryStore(clock=FakeClock())``."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
