"""Argument checks shared by every store: bad input is refused before anything is sent.

Numbers are compared as they are, never converted first: ``float(10**400)`` raises ``OverflowError`` and
``math.isfinite`` does too, and NaN fails every comparison. Text goes through ``validate_text`` (no NUL, no
lone surrogate), so every store refuses the same strings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeGuard

from ..errors import ConfigurationError, InvalidArgument
from ..lease import MAX_SECONDS, MAX_TOKEN, Abandoned, Lease, validate_key, validate_text

__all__ = [
    "MAX_RECOVERIES",
    "check_abandoned",
    "check_age",
    "check_gap",
    "check_lease",
    "check_leases",
    "check_limit",
    "check_owner",
    "check_recoveries",
    "check_step_name",
    "check_text",
    "check_token",
    "out_of_tokens",
    "past_the_range",
]

MAX_STEP_NAME = 200
MAX_OWNER = 512  # the SQL stores' owner column
MAX_RECOVERIES = 2**31 - 1  # the recovery count is a 32-bit column on the SQL stores
MAX_LIMIT = 10**6


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def check_token(token: object, what: str = "a lease token") -> int:
    if not _is_int(token) or not 1 <= token <= MAX_TOKEN:
        raise InvalidArgument(f"{what} is an int from 1 to 2**53 - 1 ({MAX_TOKEN}), got {token!r}")
    return token


def check_lease(lease: object) -> Lease:
    if not isinstance(lease, Lease):
        raise InvalidArgument(f"expected a Lease returned by acquire(), not {type(lease).__name__}")
    validate_key(lease.key)
    check_token(lease.token)
    check_owner(lease.owner)
    return lease


def check_owner(owner: object) -> str:
    if isinstance(owner, str) and len(owner) > MAX_OWNER:
        raise InvalidArgument(f"an owner name has at most {MAX_OWNER} characters, got {len(owner)}")
    return validate_text(owner, "an owner name")


def check_leases(leases: Sequence[Lease]) -> list[Lease]:
    if isinstance(leases, (str, bytes)) or not isinstance(leases, Sequence):
        raise InvalidArgument(f"expected a sequence of Leases, not {type(leases).__name__}")
    return [check_lease(lease) for lease in leases]


def check_step_name(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_STEP_NAME:
        raise InvalidArgument(f"a step name is a str of 1 to {MAX_STEP_NAME} characters, got {name!r}")
    return validate_text(name, "a step name")


def check_text(text: object, what: str) -> str:
    return validate_text(text, what)


def check_age(seconds: object) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InvalidArgument(f"an age is a number of seconds, got {seconds!r}")
    if not 0 <= seconds <= MAX_SECONDS:
        raise InvalidArgument(f"an age is a number of seconds from 0 to {MAX_SECONDS}, got {seconds!r}")
    return float(seconds)


def check_gap(gap: object) -> int:
    if not _is_int(gap) or not 1 <= gap <= MAX_TOKEN:
        raise InvalidArgument(f"gap must be a positive int up to 2**53 - 1, got {gap!r}")
    return gap


def check_limit(limit: object) -> int:
    if not _is_int(limit) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidArgument(f"limit must be an int from 1 to {MAX_LIMIT}, got {limit!r}")
    return limit


def check_recoveries(count: object, what: str = "max_recoveries") -> int:
    if not _is_int(count) or not 0 <= count <= MAX_RECOVERIES:
        raise InvalidArgument(f"{what} must be an int from 0 to {MAX_RECOVERIES}, got {count!r}")
    return count


def check_abandoned(seen: object, max_recoveries: object, reason: object) -> Abandoned:
    """The arguments of ``recover``: an ``Abandoned`` as ``abandoned()`` returned it, a bound, a reason."""
    if not isinstance(seen, Abandoned):
        raise InvalidArgument(f"expected an Abandoned returned by abandoned(), not {type(seen).__name__}")
    validate_key(seen.key)
    check_token(seen.token, "an abandoned run's token")
    check_recoveries(seen.recoveries, "an abandoned run's recovery count")
    check_recoveries(max_recoveries)
    validate_text(reason, "a recovery reason")
    return seen


def past_the_range(gap: int, counter: int | None = None) -> InvalidArgument:
    """An ``advance`` refused (nothing changed): the counter would leave [1, 2**53 - 1]."""
    at = "" if counter is None else f" (it is at {counter})"
    return InvalidArgument(
        f"advance({gap}) would move the token counter past 2**53 - 1{at}; nothing changed: use a smaller gap"
    )


def out_of_tokens() -> ConfigurationError:
    """The counter reached 2**53 - 1 (only an ``advance`` close to it gets there): permanent."""
    return ConfigurationError(
        "the store's token counter reached 2**53 - 1 and cannot issue another token; "
        "point fence_store_url at a new store"
    )
