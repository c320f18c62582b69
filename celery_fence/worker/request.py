"""The worker's main-process side of a fenced task: when a pool process dies mid-run, release its lease at
once instead of leaving it to expire by its ttl; and the end-of-run events monitors keep (Flower).

Celery tells the main process (``WorkerLostError``), not the task. The main process derives the run's key,
reads the key's state and, if the holder is the dead process (owners are ``host:pid:uuid``), releases it with
the token it read: a token-checked release, so a takeover in between makes it a no-op.
"""

from __future__ import annotations

import logging
import socket
from types import SimpleNamespace
from typing import Any

from billiard.exceptions import WorkerLostError
from celery.worker.request import Request

from .._delivery import derive_key
from .._events import final_fields
from .._runtime import runtime_for
from ..errors import FenceError
from ..lease import Lease
from ..stores import open_store

__all__ = ["FencedRequest"]

log = logging.getLogger(__name__)


class FencedRequest(Request):  # type: ignore[misc]  # celery ships no type information
    def send_event(self, type: str, **fields: Any) -> None:  # Celery's own signature
        """The end of a fenced run, as monitors keep it (``_events.final_fields``)."""
        if type in ("task-succeeded", "task-failed"):
            fields = final_fields(type, self._request_dict, fields)
        super().send_event(type, **fields)

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> Any:
        outcome = super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
        exc = getattr(exc_info.exception, "exc", exc_info.exception)  # billiard wraps it for pickling
        if isinstance(exc, WorkerLostError) and self.worker_pid:
            try:
                release_dead_holder(
                    self.task, self.id, self.args, self.kwargs, self._request_dict, self.worker_pid
                )
            except (FenceError, ValueError) as exc:  # the lease then expires by its ttl
                log.warning("fence: could not release the lease of lost %s[%s]: %s", self.name, self.id, exc)
        return outcome


def release_dead_holder(
    task: Any, task_id: str, args: Any, kwargs: Any, message: dict[str, Any], pid: int
) -> bool:
    """Release ``task_id``'s lease if process ``pid`` of this host holds it. True if released."""
    request = SimpleNamespace(
        id=task_id, fence_key=(message.get("headers") or {}).get("fence_key", message.get("fence_key"))
    )
    shim = SimpleNamespace(request=request, fence_key=task.fence_key, name=task.name, run=task.run)
    key, _ = derive_key(shim, tuple(args or ()), dict(kwargs or {}))
    store = open_store(runtime_for(task.app).config.store_url)  # short-lived: no client outlives a fork
    try:
        state = store.get(key)
        dead = f"{socket.gethostname()}:{pid}:"
        if (
            state is None
            or state.done
            or state.expires_in is None
            or not (state.owner or "").startswith(dead)
        ):
            return False
        store.release(Lease(key, state.token, state.owner or ""))
        log.warning("fence: released %s (token %d) of lost pool process %d", key, state.token, pid)
        return True
    finally:
        store.close()
