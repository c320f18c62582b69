"""celery-fence: leases, fencing tokens and atomic check-and-write for Celery tasks."""

from __future__ import annotations

from .errors import (
    AlreadyDone,
    ConfigurationError,
    FenceError,
    InvalidArgument,
    LeaseHeld,
    LeaseLost,
    NotSerializable,
    StaleToken,
    StoreUnavailable,
    TokenRewound,
)
from .lease import HistoryEvent, Lease, LeasePolicy, LeaseState
from .stores import Store, open_store

__all__ = [
    "AlreadyDone",
    "ConfigurationError",
    "FenceError",
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
    "open_store",
]

__version__ = "0.1.0"
