"""What belongs to one process (connections, threads, names that carry its pid), and a forked child.

An object that must not be shared across ``fork`` registers once with :func:`forget_in_child`. In a forked
child, ``os.register_at_fork`` calls each one's ``forget_after_fork()`` before the child runs anything
else: it drops what is the parent's (never closing it: the parent still uses it) and makes its own on
next use. One registry for the package, instead of an ``os.getpid()`` comparison on every call.

The registry is process-wide state on purpose (fork is), and holds weak references, so it keeps nothing
alive. A Celery prefork worker forks its pool from the main process, where the recovery step's store and
the runtime may already exist; ``multiprocessing`` and billiard's fork start methods both run these hooks.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol

__all__ = ["ForkAware", "forget_in_child"]


class ForkAware(Protocol):
    def forget_after_fork(self) -> None:
        """In a forked child: drop (do not close) what the parent owns."""


_OWNERS: weakref.WeakSet[ForkAware] = weakref.WeakSet()


def forget_in_child(owner: ForkAware) -> None:
    """Have ``owner.forget_after_fork()`` called in every child forked from now on."""
    _OWNERS.add(owner)


def _after_fork_in_child() -> None:
    for owner in list(_OWNERS):
        owner.forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
