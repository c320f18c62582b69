from __future__ import annotations

import re
import sys
from typing import Any

import pytest

from celery_fence import ConfigurationError
from celery_fence.lease import LeasePolicy
from celery_fence.stores.sql.engine import SessionLimits
from celery_fence.worker.startup import check_settings

SAFE: dict[str, Any] = {"task_acks_late": True, "task_reject_on_worker_lost": True}


def test_safe_settings_have_no_warning() -> None:
    assert check_settings(SAFE) == []


def test_a_renew_interval_that_cannot_work_is_an_error() -> None:
    with pytest.raises(ConfigurationError, match="fence_renew_interval"):
        check_settings({**SAFE, "fence_lease_ttl": 10, "fence_renew_interval": 5})


@pytest.mark.parametrize(
    ("conf", "names"),
    [
        ({"task_acks_late": False}, "task_acks_late"),
        ({"task_reject_on_worker_lost": False}, "task_reject_on_worker_lost"),
        ({"broker_transport_options": {"visibility_timeout": 5}}, "visibility_timeout"),
        ({"task_time_limit": 10}, "task_time_limit"),
        ({"fence_store_url": "etcd://127.0.0.1:2379", "fence_lease_ttl": 1.5}, "etcd"),
    ],
)
def test_each_risky_setting_is_one_warning_naming_it(conf: dict[str, Any], names: str) -> None:
    warnings = check_settings({**SAFE, **conf})
    assert len(warnings) == 1
    assert names in warnings[0]


def test_retry_on_worker_lost_is_as_good_as_reject() -> None:
    assert check_settings({"task_acks_late": True, "task_retry_on_worker_lost": True}) == []


def test_interrupt_on_gevent_is_a_warning() -> None:
    assert "gevent" in check_settings({**SAFE, "fence_interrupt": True}, pool="gevent")[0]


@pytest.mark.parametrize(
    ("conf", "enough"),
    [
        ({"fence_lease_ttl": 9}, 10),  # a renew every 3 s may wait 4.65 s: below the busy timeout (5 s)
        ({"fence_lease_ttl": 2}, 10),
        ({"fence_lease_ttl": 6, "fence_renew_interval": 1}, 8),  # 4.1 s
    ],
)
def test_a_ttl_short_against_sqlites_busy_timeout_is_a_warning(conf: dict[str, Any], enough: int) -> None:
    """A renew waits for SQLite's write lock no later than it can land before the local deadline; a write
    of another process may hold that lock up to the busy timeout, so a shorter wait loses healthy leases."""
    warnings = check_settings({**SAFE, "fence_store_url": "sqlite:///fence.db", **conf})
    assert len(warnings) == 1
    assert "SQLite's busy timeout (5s)" in warnings[0]
    assert f"raise fence_lease_ttl to {enough}s or more" in warnings[0]
    assert check_settings({**SAFE, **conf, "fence_lease_ttl": enough}) == []
    interval = conf.get("fence_renew_interval")
    slack = LeasePolicy(enough - 1, interval).renew_slack
    assert slack < SessionLimits().lock <= LeasePolicy(enough, interval).renew_slack  # the least whole ttl


@pytest.mark.parametrize("url", ["memory://", "redis://127.0.0.1:6379/0", "postgresql+psycopg://h/db"])
def test_a_short_ttl_on_a_store_without_a_write_lock_is_no_warning(url: str) -> None:
    assert check_settings({**SAFE, "fence_store_url": url, "fence_lease_ttl": 3}) == []


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("nosuchstore://host/db", "unknown fence store scheme 'nosuchstore'"),
        ("postgresql+pg8000://db/shop", "pip install pg8000"),  # a driver that is not installed
        ("sqlite://", "in-memory SQLite"),
        ("postgresql+asyncpg://db/shop", "asyncpg"),
    ],
)
def test_a_store_url_that_cannot_work_is_an_error_without_connecting(url: str, names: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(names)):
        check_settings({**SAFE, "fence_store_url": url})


def test_a_missing_extra_is_an_error_naming_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)  # not installed: importing it fails
    for name in [n for n in sys.modules if n.startswith("celery_fence.stores.redis")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ConfigurationError, match=re.escape("pip install 'celery-fence[redis]'")):
        check_settings({**SAFE, "fence_store_url": "redis://localhost:6379/0"})
