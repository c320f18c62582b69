"""The pure lease model: policy validation, local-deadline arithmetic, key/ttl checks, owner names."""

from __future__ import annotations

import math
import os
import socket
import uuid

import pytest

from celery_fence.errors import ConfigurationError, InvalidArgument
from celery_fence.lease import MAX_KEY_LENGTH, LeasePolicy, new_owner, validate_key, validate_ttl


@pytest.mark.parametrize("ttl", [0, 0.0, -1, -0.5, math.nan, math.inf, -math.inf, True, False, "30", None])
def test_policy_refuses_a_bad_ttl(ttl: object) -> None:
    with pytest.raises(ConfigurationError, match="fence_lease_ttl"):
        LeasePolicy(ttl)  # type: ignore[arg-type]


@pytest.mark.parametrize(("ttl", "interval"), [(30, 15), (30, 15.0), (30, 20), (10, 5), (30, math.inf)])
def test_policy_refuses_an_interval_of_half_the_ttl_or_more(ttl: float, interval: float) -> None:
    with pytest.raises(ConfigurationError, match="fence_renew_interval") as info:
        LeasePolicy(ttl, interval)
    assert "fence_lease_ttl" in str(info.value)


@pytest.mark.parametrize("interval", [0, -1, math.nan, True, "5"])
def test_policy_refuses_a_non_positive_or_non_numeric_interval(interval: object) -> None:
    with pytest.raises(ConfigurationError, match="fence_renew_interval"):
        LeasePolicy(30, interval)  # type: ignore[arg-type]


def test_policy_default_interval_is_a_third_of_the_ttl() -> None:
    policy = LeasePolicy(30)
    assert policy.interval == pytest.approx(10.0)
    assert policy.renew_interval == pytest.approx(10.0)
    assert LeasePolicy(9).interval == pytest.approx(3.0)


def test_policy_accepts_an_interval_just_below_half() -> None:
    policy = LeasePolicy(30, 14.99)
    assert policy.interval == 14.99
    assert isinstance(policy.ttl, float) and policy.ttl == 30.0


def test_policy_normalises_ints_to_floats() -> None:
    policy = LeasePolicy(12, 2)
    assert type(policy.ttl) is float and type(policy.renew_interval) is float


def test_margin_is_a_tenth_of_the_ttl() -> None:
    assert LeasePolicy(30).margin == pytest.approx(3.0)
    assert LeasePolicy(7).margin == pytest.approx(0.7)


@pytest.mark.parametrize(
    ("ttl", "sent_at", "expected"), [(30, 100.0, 127.0), (10, 0.0, 9.0), (5, 50.5, 55.0)]
)
def test_deadline_is_sent_at_plus_ttl_minus_margin(ttl: float, sent_at: float, expected: float) -> None:
    assert LeasePolicy(ttl).deadline(sent_at) == pytest.approx(expected)


def test_deadline_is_before_the_earliest_store_expiry() -> None:
    policy = LeasePolicy(30)
    assert policy.deadline(1000.0) < 1000.0 + policy.ttl


@pytest.mark.parametrize("expires_in", [None, 0, 0.0, -3.0])
def test_busy_countdown_falls_back_to_the_interval(expires_in: float | None) -> None:
    assert LeasePolicy(30, 7).busy_countdown(expires_in) == 7.0


def test_busy_countdown_waits_for_the_remaining_ttl() -> None:
    assert LeasePolicy(30).busy_countdown(12.5) == 12.5


def test_a_copy_of_a_running_task_id_looks_again_soon_then_less_often() -> None:
    """A renew interval, doubled each look, capped at the holder's remaining ttl."""
    policy = LeasePolicy(30)  # renew interval 10 s
    assert [policy.look_again_countdown(29.0, looks) for looks in range(4)] == [10.0, 20.0, 29.0, 29.0]
    assert policy.look_again_countdown(4.0, 0) == 4.0  # the holder's lease runs out sooner
    assert policy.look_again_countdown(None, 5) == 10.0  # unknown: one interval, as busy_countdown
    assert policy.look_again_countdown(29.0, 10_000) == 29.0  # no overflow however many looks


def test_validate_key_accepts_one_to_max_characters() -> None:
    assert validate_key("k") == "k"
    longest = "x" * MAX_KEY_LENGTH
    assert validate_key(longest) == longest
    assert MAX_KEY_LENGTH == 1024


@pytest.mark.parametrize("key", ["", "x" * (MAX_KEY_LENGTH + 1), None, 7, b"key", ["k"]])
def test_validate_key_refuses_bad_keys(key: object) -> None:
    with pytest.raises(InvalidArgument) as info:
        validate_key(key)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(("ttl", "expected"), [(1, 1.0), (0.25, 0.25), (30.0, 30.0)])
def test_validate_ttl_returns_a_float(ttl: float, expected: float) -> None:
    result = validate_ttl(ttl)
    assert result == expected and type(result) is float


@pytest.mark.parametrize("ttl", [0, -1, math.nan, math.inf, True, "1", None])
def test_validate_ttl_refuses_bad_ttls(ttl: object) -> None:
    with pytest.raises(InvalidArgument):
        validate_ttl(ttl)


def test_new_owner_is_host_pid_uuid4() -> None:
    host, pid, ident = new_owner().rsplit(":", 2)
    assert host == socket.gethostname()
    assert pid == str(os.getpid())
    assert uuid.UUID(ident).version == 4
    assert str(uuid.UUID(ident)) == ident


def test_new_owner_differs_per_call() -> None:
    owners = {new_owner() for _ in range(100)}
    assert len(owners) == 100
