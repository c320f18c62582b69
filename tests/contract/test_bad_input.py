"""Bad configuration: a clear ``ConfigurationError`` at once (bad input at every store's entry points ships
in ``celery_fence.testing.contract.bad_input``, run by test_store_suite.py on every store)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from celery_fence import ConfigurationError, LeasePolicy, open_store
from celery_fence.config import FenceConfig


@pytest.mark.parametrize(
    "url",
    [
        "",
        "nope",
        "nope://x",
        "mysql://localhost/db",
        "postgresql+asyncpg://localhost/db",
        "sqlite://",
        "sqlite:///:memory:",
        None,
        42,
    ],
)
def test_malformed_urls_are_refused_at_once(url: Any) -> None:
    with pytest.raises(ConfigurationError):
        open_store(url)


@pytest.mark.parametrize(
    ("ttl", "interval"),
    [
        (0, None),
        (-5, None),
        (10, 5),
        (10, 6),
        (10, 0),
        (10, -1),
        (math.nan, None),
        (10, math.nan),
        ("10", None),
    ],
)
def test_ttl_and_interval_combinations(ttl: Any, interval: Any) -> None:
    with pytest.raises(ConfigurationError):
        LeasePolicy(ttl, interval)
    with pytest.raises(ConfigurationError):
        FenceConfig.from_conf({"fence_lease_ttl": ttl, "fence_renew_interval": interval})
