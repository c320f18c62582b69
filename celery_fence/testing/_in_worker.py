"""Loaded into a real worker the fault kit starts (``celery worker -I celery_fence.testing._in_worker``, see
:class:`~celery_fence.testing.Worker`): when ``CELERY_FENCE_STORE_FAULTS`` asks for lost replies, the worker's
app wraps every store its runtimes open in an :class:`~celery_fence.testing.IndeterminateStore`, through the
runtime's seam :func:`celery_fence._runtime.wrap_stores`.

Importing it connects one receiver to Celery's ``worker_init``: loading it into a worker is its only use.
Each store gets the faults afresh, so each pool process counts its own calls.
"""

from __future__ import annotations

from typing import Any

from celery.signals import worker_init

from .._runtime import wrap_stores
from ..stores import Store
from ._indeterminate import IndeterminateStore, faults_from_env

__all__ = ["install_store_faults"]


def _with_faults(store: Store) -> Store:
    wrapped: Store = IndeterminateStore(store, faults_from_env())  # delegates what it does not wrap
    return wrapped


def install_store_faults(sender: Any = None, **_: Any) -> None:
    """``worker_init`` receiver: the worker's app wraps its stores if the environment names faults."""
    if faults_from_env():
        wrap_stores(sender.app, _with_faults)


worker_init.connect(install_store_faults, weak=False, dispatch_uid="celery_fence.testing.store_faults")
