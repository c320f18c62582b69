"""What a store can do and what it needs, declared by the store and asked by the rest (the startup check,
the CLI, ``self.fence``), so that nothing outside ``stores/`` branches on which store it is.

A store class may define ``capabilities_for(url)`` (known before connecting) and ``check_url(url)``
(refuse, without a round trip, what cannot work), and give its instances a ``capabilities`` attribute. A
third-party store that defines none of them gets the defaults: nothing declared, nothing checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["NOTHING_DECLARED", "Capabilities", "capabilities_of"]


@dataclass(frozen=True)
class Capabilities:
    name: str = "the store"  # for messages: "SQLite", "etcd"
    transactions: bool = False  # self.fence.transaction(): the lease rows share a SQL database with yours
    min_ttl: float = 0.0  # the shortest lease the store keeps; a shorter fence_lease_ttl is rounded up
    whole_second_ttl: bool = False  # leases are whole seconds; a fractional ttl is rounded up
    write_lock_wait: float | None = None  # one write lock for every writer, waited for up to this long
    local_file: Path | None = None  # the file the store lives in, which a read must not create empty
    default_port: int | None = None  # the server's port when the URL names none (a proxy goes there)
    django_alias: str | None = None  # the run's transaction is Django's on this database: self.fence.atomic()
    # fence_mode="commit": "yes" (the claim commits with the run's transaction), "emulated" (a claim with
    # no transaction around the body's writes: the memory store), or "no"
    fenced_commit: str = "no"

    def commit_mode_refusal(self, task: str) -> str | None:
        """Why ``task``'s ``fence_mode="commit"`` cannot work on this store, if it cannot."""
        if self.fenced_commit != "no":
            return None
        return (
            f"{task}: fence_mode='commit' is not available on {self.name}: it needs a SQL store whose "
            "database holds the task's tables (PostgreSQL or SQLite); or use fence_mode='lease'"
        )

    def ttl_warning(self, ttl: float) -> str | None:
        """What the store does to ``ttl``, if it keeps it otherwise than asked."""
        rounded = ttl < self.min_ttl or (self.whole_second_ttl and ttl != int(ttl))
        if not rounded:
            return None
        unit = "whole seconds, " if self.whole_second_ttl else ""
        return f"fence_lease_ttl={ttl}: {self.name} leases are {unit}at least {self.min_ttl:g}; rounded up"


NOTHING_DECLARED = Capabilities()


def capabilities_of(store: Any) -> Capabilities:
    """A store's capabilities (a wrapper that forwards attributes answers for the store it wraps)."""
    found = getattr(store, "capabilities", None)
    return found if isinstance(found, Capabilities) else NOTHING_DECLARED
