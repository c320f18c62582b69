"""The findings of FINDINGS-8908ba9.md (the eight the simulation was written for, and those it found
besides) as programs written by hand: each names its decisions by label (``chooser.Scripted``), so it
keeps meaning the same thing when the run's code makes other store calls than it did on 8908ba9."""

from __future__ import annotations

from typing import Any

__all__ = ["FINDINGS"]


def _queued(option: Any) -> bool:
    return option != "new"  # a nested delivery of a message already queued


def _nth_queued(n: int) -> Any:
    """The n-th message in the queue (a nested delivery's options are "new", then each queued serial)."""
    seen = [0]

    def match(option: Any) -> bool:
        seen[0] = 0 if option == "new" else seen[0] + 1
        return seen[0] == n and option != "new"

    return match


def _task(suffix: str) -> Any:
    return lambda option: getattr(option, "id", "").endswith(suffix)


END = ("action", "end")
DELIVER = ("action", "deliver")

# finding -> (store, the program's decisions by label)
FINDINGS: dict[str, tuple[str, list[tuple[str, Any]]]] = {
    "1 a caught exception in the first transaction() block": (
        "sqlite", [END, ("body op", "tx_caught"), ("body op", "return")],
    ),
    "2 a time limit while the completion's reply is in flight": (
        "memory", [DELIVER, ("body op", "return"), ("complete outcome", "base"), END],
    ),
    "2 a time limit after the completion answered": ("memory", [DELIVER, ("body op", "late_base"), END]),
    "3 an operator's release with no retries left": (
        "memory",
        [DELIVER, ("body op", "retry"), ("retry countdown", 0), DELIVER, ("body op", "admin_release"),
         ("body op", "return"), END],
    ),
    "4 recovery re-runs a FAILURE whose release was lost": (
        "memory", [DELIVER, ("body op", "raise"), ("release outcome", "before"), END],
    ),
    "5 an attempt's wait clock inherited by its retry": (
        "memory",
        [("action", "outage"), DELIVER, ("action", "outage"), DELIVER, ("body op", "retry"),
         ("retry countdown", 180), ("action", "outage"), DELIVER, END],
    ),
    "6 a busy duplicate of another task id fails LeaseHeld": (
        "memory",
        [DELIVER, ("body op", "nested"), ("nested delivery", "new"), ("key", 0), ("body op", "nested"),
         ("nested delivery", _queued), ("body op", "return"), END],
    ),
    "7 a step's function after the lease is known lost": (
        "memory", [DELIVER, ("body op", "lose"), ("body op", "step"), ("body op", "return"), END],
    ),
    "8 a repeated owner string gets a live lease's token": (
        "memory", [DELIVER, ("body op", "owner_reuse"), ("body op", "return"), END],
    ),
    "8 a repeated owner string gets an expired, locked lease's token": (
        "postgresql",
        [DELIVER, ("body op", "tx"), ("body op", "expire"), ("body op", "owner_reuse"), ("body op", "return"),
         END],
    ),
    "N1 links fire per delivery of a task id another finished": (
        "memory",
        [("action", "send_new"), DELIVER, ("message", _task("t2")), ("action", "duplicate"),
         ("message", _task("t1")), END],
    ),
    "N2 a committed completion not delivered with no retries left": (
        "memory",
        [DELIVER, ("body op", "retry"), ("retry countdown", 0), DELIVER, ("body op", "return"),
         ("complete outcome", "lost"), ("get outcome", "hang"), ("get outcome", "before"), END],
    ),
    "N3 links fire again when a duplicate cannot read the key": (
        "memory", [DELIVER, ("action", "duplicate"), ("get outcome", "before"), END],
    ),
    "N4 a broker's second delivery re-runs a FAILURE": (
        "memory", [("action", "duplicate"), ("body op", "raise"), END],
    ),
    "N5 the fence's look-again copy re-runs a FAILURE": (
        "memory",
        [("action", "duplicate"), ("body op", "nested"), ("nested delivery", _queued), ("body op", "raise"),
         END],
    ),
    "N6 a late copy's busy wait stores RETRY over a FAILURE, and a later copy runs": (
        "memory",
        [("action", "duplicate"), ("body op", "raise"), ("action", "send_new"), DELIVER,
         ("message", _task("t2")), ("body op", "return"), ("complete outcome", "die"), END],
    ),
    "N7 a time limit after a lost completion reply was read back done": (
        "memory", [DELIVER, ("body op", "late_base"), ("complete outcome", "lost"), END],
    ),
    "N8 a time limit after a completion's unknown outcome sent the run again": (
        "memory",
        [DELIVER, ("body op", "late_base"), ("complete outcome", "late"), ("get outcome", "before"), END],
    ),
    "N9 a stale run of a task id fails after its copy succeeded": (
        "memory",
        [("action", "duplicate"), ("body op", "nested"), ("nested delivery", _queued),
         ("acquire outcome", "late"), ("body op", "return"), ("body op", "raise"), END],
    ),
    "N9 a stale run of a task id fails after its copy succeeded, the key unreadable": (
        "memory",
        [("action", "duplicate"), ("body op", "nested"), ("nested delivery", _queued),
         ("acquire outcome", "late"), ("body op", "return"), ("body op", "raise"), ("get outcome", "before"),
         END],
    ),
    "N11 a stale run fails, its key unreadable, after its copy's completion committed unconfirmed": (
        "memory",
        [("action", "duplicate"), ("body op", "expire"), ("body op", "nested"), ("nested delivery", _queued),
         ("body op", "return"), ("complete outcome", "late"), ("get outcome", "before"),
         ("body op", "soft_limit"), ("get outcome", "before"), END],
    ),
    "N11 the same after an operator's release the stale run was not told of": (
        "memory",
        [("action", "duplicate"), ("body op", "admin_release"), ("body op", "nested"),
         ("nested delivery", _queued), ("body op", "return"), ("complete outcome", "base"),
         ("get outcome", "before"), ("body op", "soft_limit"), ("get outcome", "before"), END],
    ),
    "N10 two stale copies of a task id, each refused, each returned the winner's result": (
        "memory",
        [("action", "send_new"), ("action", "duplicate"), ("message", _task("t2")), ("body op", "expire"),
         ("body op", "nested"), ("nested delivery", _nth_queued(2)), ("body op", "expire"),
         ("body op", "nested"), ("nested delivery", _nth_queued(1)),
         ("body op", "return"), ("body op", "return"), ("body op", "return"), END],
    ),
    # fence_mode="commit" (found by its simulation, fixed): two copies of one task id run at once (a
    # broker's redelivery while the first still runs); with no lease, the copy whose body raised ended
    # FAILURE, then the other claimed the key and ended SUCCESS. Now a FAILURE marks the key ended by
    # its task id first, and the other copy's claim is refused (it ends quietly).
    "C1 a copy of a task id fails while another copy of it runs, which then commits": (
        "memory_commit",
        [("action", "duplicate"), ("body op", "nested"), ("nested delivery", _queued), ("body op", "raise"),
         ("body op", "return"), END],
    ),
    # fence_mode="commit" (found by its soak, sqlite_commit:0.0.0.2.0.6.25.28.0.0, fixed): the FAILURE's mark
    # landed (its reply lost) and the worker died before Celery stored the FAILURE; the redelivered message
    # ran its body again and its claim was refused by the mark, so it ended quietly and the task id stayed
    # PENDING. Now a copy meets the mark before its body (FailedBefore), waits a ttl for the FAILURE to be
    # stored, then ends with it.
    "C2 a failed run's worker dies between its mark and its FAILURE": (
        "sqlite_commit",
        [DELIVER, ("body op", "raise"), ("strand outcome", "lost"), ("get outcome", "die"), END],
    ),
}
