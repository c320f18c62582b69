"""Deterministic failpoints, so fault tests force a race instead of hoping for it.

Off unless the environment variable ``CELERY_FENCE_FAILPOINTS`` names a folder, as read once per process at
the first point reached (a process forked later keeps its parent's answer). Off, :data:`armed` turns false,
and a point its caller guards (``if _failpoints.armed: failpoint(NAME)``) costs not even a call. On, at a
point named ``NAME``, the process writes ``<folder>/NAME.<pid>.reached`` and, while ``<folder>/NAME.block``
exists, waits: a test creates the block file, waits for the ``reached`` file, does its damage (SIGKILL, a
killed connection, a takeover) and removes the block file.

Points: ``before-acquire``, ``after-acquire``, ``before-renew``, ``before-complete``, ``after-guard``
(a fenced transaction checked and locked the lease row; the caller's writes come next), ``before-commit``
(a SQL run's transaction is about to send its completion and commit; on PostgreSQL in one round trip),
``after-mark`` (a ``fence_mode="commit"`` run that failed marked its key, Celery has not stored the FAILURE).
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

__all__ = ["ENV", "armed", "failpoint"]

ENV = "CELERY_FENCE_FAILPOINTS"

armed = True  # until the first point reached in this process finds failpoints off


@functools.cache
def _folder() -> Path | None:
    global armed  # noqa: PLW0603 (the one answer of this process, cached with the folder)
    value = os.environ.get(ENV)
    armed = bool(value)
    return Path(value) if value else None


def failpoint(name: str) -> None:
    """Block at ``name`` while a test holds it; nothing at all when failpoints are off."""
    folder = _folder()
    if folder is None:
        return
    block = folder / f"{name}.block"
    if not block.exists():
        return
    (folder / f"{name}.{os.getpid()}.reached").write_text(str(time.time()))
    while block.exists():
        time.sleep(0.01)
