from __future__ import annotations

from typing import Any

import pytest

from celery_fence import ConfigurationError
from celery_fence.startup import check_settings

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
