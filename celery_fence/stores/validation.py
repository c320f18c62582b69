"""Argument checks shared by every store: bad input is refused before anything is sent."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..errors import InvalidArgument
from ..lease import Lease, validate_key

__all__ = ["check_age", "check_gap", "check_lease", "check_leases", "check_step_name"]

MAX_STEP_NAME = 200


def check_lease(lease: object) -> Lease:
    if not isinstance(lease, Lease):
        raise InvalidArgument(f"expected a Lease returned by acquire(), not {type(lease).__name__}")
    validate_key(lease.key)
    if isinstance(lease.token, bool) or not isinstance(lease.token, int) or lease.token <= 0:
        raise InvalidArgument(f"a lease token is a positive int, got {lease.token!r}")
    return lease


def check_leases(leases: Sequence[Lease]) -> list[Lease]:
    return [check_lease(lease) for lease in leases]


def check_step_name(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_STEP_NAME:
        raise InvalidArgument(f"a step name is a str of 1 to {MAX_STEP_NAME} characters, got {name!r}")
    return name


def check_age(seconds: object) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        raise InvalidArgument(f"an age is a finite number of seconds, got {seconds!r}")
    if seconds < 0:
        raise InvalidArgument(f"an age cannot be negative, got {seconds!r}")
    return float(seconds)


def check_gap(gap: object) -> int:
    if isinstance(gap, bool) or not isinstance(gap, int) or gap <= 0:
        raise InvalidArgument(f"gap must be a positive int, got {gap!r}")
    return gap
