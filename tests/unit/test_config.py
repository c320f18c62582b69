"""``fence_*`` settings: defaults, refusals, and a task's own options over the app's."""

from __future__ import annotations

from typing import Any

import pytest

from celery_fence.config import DEFAULTS, FenceConfig, check_prune_age, prune_min_age
from celery_fence.errors import ConfigurationError, InvalidArgument


def test_an_empty_conf_gives_the_documented_defaults() -> None:
    config = FenceConfig.from_conf({})
    assert config.store_url == "sqlite:///celery_fence.db"
    assert config.policy.ttl == 30.0
    assert config.policy.interval == pytest.approx(10.0)
    assert config.on_busy == "retry"
    assert config.interrupt is False
    assert config.max_recoveries == 3
    assert config.send_events is True


def test_a_setting_of_none_reads_as_unset() -> None:
    conf = {name: None for name in DEFAULTS}
    assert FenceConfig.from_conf(conf) == FenceConfig.from_conf({})


def test_every_fence_setting_given_is_read() -> None:
    config = FenceConfig.from_conf(
        {
            "fence_store_url": "memory://",
            "fence_lease_ttl": 12,
            "fence_renew_interval": 2,
            "fence_on_busy": "fail",
            "fence_interrupt": True,
            "fence_max_recoveries": 0,
            "fence_send_events": False,
        }
    )
    assert config.store_url == "memory://"
    assert (config.policy.ttl, config.policy.interval) == (12.0, 2.0)
    assert config.on_busy == "fail"
    assert config.interrupt is True
    assert config.max_recoveries == 0
    assert config.send_events is False


@pytest.mark.parametrize("on_busy", ["RETRY", "skip", "", 1, True])
def test_a_bad_on_busy_is_refused(on_busy: Any) -> None:
    with pytest.raises(ConfigurationError, match="fence_on_busy"):
        FenceConfig.from_conf({"fence_on_busy": on_busy})


@pytest.mark.parametrize("value", [-1, 1.5, "3", True, False])
def test_a_bad_max_recoveries_is_refused(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="fence_max_recoveries"):
        FenceConfig.from_conf({"fence_max_recoveries": value})


@pytest.mark.parametrize("url", ["celery_fence.db", "localhost:5432", 5, ""])
def test_a_malformed_store_url_is_refused(url: Any) -> None:
    with pytest.raises(ConfigurationError, match="fence_store_url"):
        FenceConfig.from_conf({"fence_store_url": url})


def test_an_impossible_renew_interval_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="fence_renew_interval"):
        FenceConfig.from_conf({"fence_lease_ttl": 30, "fence_renew_interval": 15})


def test_a_bad_ttl_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="fence_lease_ttl"):
        FenceConfig.from_conf({"fence_lease_ttl": -5})


def test_celery_conf_is_accepted() -> None:
    from celery import Celery

    app = Celery("cfg", set_as_current=False)
    app.conf.fence_store_url = "memory://"
    app.conf.fence_lease_ttl = 60
    config = FenceConfig.from_conf(app.conf)
    assert config.store_url == "memory://"
    assert config.policy.ttl == 60.0
    assert config.on_busy == "retry"


@pytest.fixture
def app_config() -> FenceConfig:
    return FenceConfig.from_conf(
        {"fence_store_url": "memory://", "fence_lease_ttl": 30, "fence_renew_interval": 5}
    )


def test_no_task_options_keep_the_app_config(app_config: FenceConfig) -> None:
    assert app_config.with_task_options(None, None, None) is app_config


def test_a_task_ttl_overrides_and_its_interval_is_a_third(app_config: FenceConfig) -> None:
    config = app_config.with_task_options(90, None, None)
    assert config.policy.ttl == 90.0
    assert config.policy.interval == pytest.approx(30.0)
    assert (config.store_url, config.on_busy, config.interrupt) == ("memory://", "retry", False)


def test_a_task_on_busy_keeps_the_app_policy(app_config: FenceConfig) -> None:
    config = app_config.with_task_options(None, "ignore", None)
    assert config.on_busy == "ignore"
    assert config.policy == app_config.policy
    assert config.policy.interval == 5.0


def test_a_task_interrupt_overrides(app_config: FenceConfig) -> None:
    assert app_config.with_task_options(None, None, True).interrupt is True
    on = FenceConfig.from_conf({"fence_store_url": "memory://", "fence_interrupt": True})
    assert on.with_task_options(None, None, False).interrupt is False


def test_task_options_keep_the_other_settings() -> None:
    base = FenceConfig.from_conf(
        {"fence_store_url": "memory://", "fence_max_recoveries": 7, "fence_send_events": False}
    )
    config = base.with_task_options(10, "fail", True)
    assert (config.max_recoveries, config.send_events, config.store_url) == (7, False, "memory://")


@pytest.mark.parametrize(("ttl", "on_busy"), [(0, None), (None, "later")])
def test_bad_task_options_are_refused(app_config: FenceConfig, ttl: Any, on_busy: Any) -> None:
    with pytest.raises(ConfigurationError):
        app_config.with_task_options(ttl, on_busy, None)


@pytest.mark.parametrize("addr", ["", "  ", 5, ["127.0.0.1"]])
def test_a_metrics_address_that_is_not_a_host_is_refused(addr: object) -> None:
    with pytest.raises(ConfigurationError, match="fence_metrics_addr"):
        FenceConfig.from_conf({"fence_store_url": "memory://", "fence_metrics_addr": addr})


@pytest.mark.parametrize(
    ("conf", "floor"),
    [
        ({}, 3600.0),  # no visibility_timeout (AMQP, or kombu's Redis default): an hour
        ({"broker_transport_options": {"visibility_timeout": 43200}}, 43200.0),  # the broker's window
        ({"broker_transport_options": {}}, 3600.0),
        ({"fence_prune_min_age": 600, "broker_transport_options": {"visibility_timeout": 43200}}, 600.0),
        ({"fence_prune_min_age": 0}, 0.0),
    ],
)
def test_the_prune_floor_is_the_setting_else_the_brokers_window(conf: dict[str, Any], floor: float) -> None:
    assert prune_min_age(conf) == floor
    assert check_prune_age(conf, floor) == floor


def test_a_prune_younger_than_the_floor_is_refused_unless_forced() -> None:
    conf = {"broker_transport_options": {"visibility_timeout": 7200}}
    with pytest.raises(InvalidArgument, match=r"fence_prune_min_age \(7200s\).*--older-than 7200s.*--force"):
        check_prune_age(conf, 7199.0)
    assert check_prune_age(conf, 0.0, force=True) == 7200.0


@pytest.mark.parametrize("value", [-1, "1h", True, float("nan"), float("inf")])
def test_a_bad_prune_min_age_is_refused(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="fence_prune_min_age must be a number of seconds"):
        FenceConfig.from_conf({"fence_prune_min_age": value})
    with pytest.raises(ConfigurationError, match=r"broker_transport_options\['visibility_timeout'\]"):
        prune_min_age({"broker_transport_options": {"visibility_timeout": value}})


@pytest.mark.parametrize("value", [-1, "10m", True, float("nan"), float("inf")])
def test_a_bad_store_wait_is_refused(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="fence_store_wait must be a number of seconds"):
        FenceConfig.from_conf({"fence_store_wait": value})
    assert FenceConfig.from_conf({"fence_store_wait": 0}).store_wait == 0.0  # 0: never wait
