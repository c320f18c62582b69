"""Celery signals sent by celery-fence.

Run signals are sent in the process that runs the task, with ``sender`` the task and keyword arguments
``key``, ``token`` and ``task_id``, plus:

- ``lease_acquired``: nothing more (a takeover also sends ``lease_takeover``);
- ``lease_takeover``: ``expired_for``, seconds the taken-over lease had been expired by the store's clock,
  or ``None`` when the store does not tell (sent only by stores that report takeovers on acquire);
- ``lease_renewed``: nothing more (one per lease per successful renew);
- ``lease_lost`` and ``write_refused``: ``reason``;
- ``lease_duplicate``: ``reason``, ``"done"`` (the key is finished: the stored result is returned) or
  ``"held"`` (a live lease holds the key: this delivery is absorbed) or ``"ended"`` (a late copy of a task
  id whose ending is stored, met on a busy key or an unavailable store); ``token`` is 0 unless done;
- ``lease_released``: ``held``, seconds from the acquire to the end of the run, whatever its outcome
  (completed, released on an exception or retry, refused, or handed back).

``store_wait_exhausted`` is sent in the process that runs the task, with ``sender`` the task and ``key``,
``task_id`` and ``waited`` (seconds), when a run gave up waiting out an unavailable store before its body
started (``fence_store_wait``); the task then ends ``FAILURE`` with ``StoreUnavailable``.

``run_ended`` is sent in the process that runs the task, with ``sender`` the task and ``key``, ``task_id``
and ``ending``, once per delivery, when the run has decided how it ends (before the task carries that out),
whether or not it acquired: ``"completed"`` (the run's result was stored), ``"duplicate"`` (after
``lease_duplicate``), ``"refused"`` (after ``write_refused``; the run may be sent again), ``"requeued"`` (the
fence sent the message again: an unknown outcome, a busy key under ``fence_on_busy="retry"``, an
unavailable store), ``"gave_up"`` (the fence stopped waiting or re-sending and left a record), ``"raised"``
(an exception takes Celery's course: the body's own, ``self.retry()``, ``fence_on_busy="fail"``) or
``"ignored"`` (the task ends with ``Ignore``: nothing left to do).

``run_recovered`` is sent where recovery runs (``celery fence recover`` or ``--fence-recover``), with
``sender`` the app and ``key``, ``task`` (the task's name), ``task_id`` and ``attempt``.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = [
    "lease_acquired",
    "lease_duplicate",
    "lease_lost",
    "lease_released",
    "lease_renewed",
    "lease_takeover",
    "run_ended",
    "run_recovered",
    "store_wait_exhausted",
    "write_refused",
]

_RUN = {"key", "token", "task_id"}
lease_acquired = Signal(name="lease_acquired", providing_args=_RUN)
lease_takeover = Signal(name="lease_takeover", providing_args=_RUN | {"expired_for"})
lease_renewed = Signal(name="lease_renewed", providing_args=_RUN)
lease_lost = Signal(name="lease_lost", providing_args=_RUN | {"reason"})
write_refused = Signal(name="write_refused", providing_args=_RUN | {"reason"})
lease_duplicate = Signal(name="lease_duplicate", providing_args=_RUN | {"reason"})
lease_released = Signal(name="lease_released", providing_args=_RUN | {"held"})
run_ended = Signal(name="run_ended", providing_args={"key", "task_id", "ending"})
store_wait_exhausted = Signal(name="store_wait_exhausted", providing_args={"key", "task_id", "waited"})
run_recovered = Signal(name="run_recovered", providing_args={"key", "task", "task_id", "attempt"})
