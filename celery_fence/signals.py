"""Celery signals sent by celery-fence, in the process that runs the task.

Receivers get ``sender`` (the task) and keyword arguments ``key``, ``token``, ``task_id`` and, for
``lease_lost`` and ``write_refused``, ``reason``.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = ["lease_acquired", "lease_lost", "write_refused"]

lease_acquired = Signal(name="lease_acquired", providing_args={"key", "token", "task_id"})
lease_lost = Signal(name="lease_lost", providing_args={"key", "token", "task_id", "reason"})
write_refused = Signal(name="write_refused", providing_args={"key", "token", "task_id", "reason"})
