"""celery-fence: leases, fencing tokens and atomic check-and-write for Celery tasks."""

from __future__ import annotations

from .dao import fenced_update
from .errors import (
    AlreadyDone,
    ConfigurationError,
    FailedBefore,
    FenceError,
    GaveUp,
    InvalidArgument,
    LeaseHeld,
    LeaseLost,
    NotSerializable,
    StaleToken,
    StoreUnavailable,
    TokenRewound,
    UsageError,
)
from .fence import Fence
from .lease import HistoryEvent, Lease, LeasePolicy, LeaseState
from .metrics import FenceMetrics
from .stores import Store, open_store
from .task import FencedTask

__all__ = [
    "AlreadyDone",
    "ConfigurationError",
    "FailedBefore",
    "Fence",
    "FenceError",
    "FenceMetrics",
    "FencedTask",
    "GaveUp",
    "HistoryEvent",
    "InvalidArgument",
    "Lease",
    "LeaseHeld",
    "LeaseLost",
    "LeasePolicy",
    "LeaseState",
    "NotSerializable",
    "StaleToken",
    "Store",
    "StoreUnavailable",
    "TokenRewound",
    "UsageError",
    "fenced_update",
    "open_store",
]

__version__ = "0.1.0"
