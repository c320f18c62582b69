"""``fenced_app``'s app with ``fence_mode="commit"`` tasks, for tests/integration/test_commit_mode_worker.py
and the chaos cases of the mode (tests/chaos/test_commit_mode_faults.py).

A module of its own: a worker refuses to start when a commit-mode task is registered on a store that cannot
fence a commit (Redis, etcd), and ``fenced_app``'s workers run on every store. Only a worker started with
``-A tests.integration.commit_app`` has this task.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery_fence import FencedTask

from .fenced_app import INSERT, MARKS, app, mark

__all__ = ["app", "chaos_commit", "commit_write", "commit_write_then_fail", "commit_write_unrejected"]
COMMIT = {"base": FencedTask, "bind": True, "fence_key": "commit:{item}", "fence_mode": "commit"}


def _write(self: Any, item: str) -> dict[str, Any]:
    """One row in ``fence_it_effects`` through ``transaction()``: it commits with the claim of the key, or
    not at all. Marks ``started`` (``redelivered`` too: the broker delivered the message again), ``wrote``."""
    mark(self, "started")
    if (self.request.delivery_info or {}).get("redelivered"):
        mark(self, "redelivered")
    with self.fence.transaction() as conn:
        run = {"id": self.request.id, "pid": os.getpid()}
        conn.execute(INSERT, {"k": self.fence.key, "t": self.fence.token, **run})
    mark(self, "wrote")
    return {"item": item, "by": self.request.id, "pid": os.getpid()}


@app.task(name="commit_app.commit_write", shared=False, **COMMIT)
def commit_write(self: Any, item: str) -> dict[str, Any]:
    """The app's ``task_reject_on_worker_lost``: a lost pool process's message goes back to the broker."""
    return _write(self, item)


@app.task(name="commit_app.commit_write_unrejected", reject_on_worker_lost=False, shared=False, **COMMIT)
def commit_write_unrejected(self: Any, item: str) -> dict[str, Any]:
    """Without ``reject_on_worker_lost``: Celery's default decides what becomes of a lost run's message."""
    return _write(self, item)


@app.task(name="commit_app.commit_write_then_fail", shared=False, **COMMIT)
def commit_write_then_fail(self: Any, item: str) -> dict[str, Any]:
    """Writes as ``commit_write`` does, then raises: the run ends FAILURE, and nothing of it commits."""
    _write(self, item)
    raise RuntimeError(f"{item}: failed after its write")


@app.task(name="commit_app.chaos_commit", base=FencedTask, bind=True, fence_mode="commit", shared=False)
def chaos_commit(self: Any, item: Any, pause: float = 0.0) -> dict[str, Any]:
    """The chaos cases' fenced commit, keyed by its task id: one ``fence_it_effects`` row (no unique key,
    so a doubled commit shows as two rows) that commits with the claim. The first run of an id sleeps
    ``pause`` s in its body, its transaction open; a copy delivered again runs at once."""
    first_run = not any(MARKS.glob(f"{self.request.id}.*.started"))
    mark(self, "started")
    if first_run:
        time.sleep(pause)
    with self.fence.transaction() as conn:
        conn.execute(INSERT, {"k": self.fence.key, "t": 0, "id": self.request.id, "pid": os.getpid()})
    mark(self, "wrote")
    return {"item": item, "pid": os.getpid()}
