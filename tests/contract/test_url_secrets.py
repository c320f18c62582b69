"""No secret in errors: every kind of bad store URL, with a password in it, is opened
and used; no message, ``repr``, chained cause or log record may show the password."""

from __future__ import annotations

import logging
import traceback
from typing import Any

import pytest

from celery_fence import ConfigurationError, FenceError, open_store
from celery_fence.config import FenceConfig
from celery_fence.fence import Fence
from celery_fence.stores.urls import mask_url
from celery_fence.testing import StoreProxy

SECRET = "Pa55-w0rd-xyzzy"

BAD_URLS = {
    "unknown scheme": f"nope://app:{SECRET}@db.example/shop",
    "unknown scheme, no host": f"mysql://app:{SECRET}@/shop",
    "unloadable driver suffix": f"postgresql+nosuchdriver://app:{SECRET}@127.0.0.1/shop",
    "async driver": f"postgresql+asyncpg://app:{SECRET}@127.0.0.1/shop",
    "non-numeric port": f"postgresql://app:{SECRET}@127.0.0.1:abc/shop",
    "malformed host": f"postgresql://app:{SECRET}@[::1/shop",
    "nothing listens (postgresql)": f"postgresql://app:{SECRET}@127.0.0.1:1/shop",
    "in-memory sqlite": f"sqlite://app:{SECRET}@/:memory:",
    "redis, non-numeric port": f"redis://:{SECRET}@127.0.0.1:abc/0",
    "redis, unknown parameter": f"redis://:{SECRET}@127.0.0.1/0?bogus=1",
    "redis, bad database": f"redis://:{SECRET}@127.0.0.1/zero",
    "redis, nothing listens": f"redis://:{SECRET}@127.0.0.1:1/0",
    "etcd with userinfo": f"etcd://app:{SECRET}@127.0.0.1:2379/fence/",
    "etcd, bad port": f"etcd://app:{SECRET}@127.0.0.1:abc/fence/",
    "a secret in the query": f"postgresql://app@127.0.0.1:1/shop?password={SECRET}",
}


def _texts(exc: BaseException | None) -> list[str]:
    """The message and repr of ``exc`` and of every exception chained to it, and its whole traceback."""
    texts = []
    seen = exc
    if exc is not None:
        texts.append("".join(traceback.format_exception(exc)))
    while seen is not None:
        texts += [str(seen), repr(seen)]
        seen = seen.__cause__ or seen.__context__
    return texts


def _use(url: str) -> None:
    store = open_store(url)
    try:
        assert SECRET not in repr(store)
        store.get("k")
    finally:
        store.close()


@pytest.mark.parametrize("url", BAD_URLS.values(), ids=BAD_URLS.keys())
def test_no_password_in_any_error_or_log(url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(FenceError) as info:
        _use(url)
    for text in _texts(info.value):
        assert SECRET not in text, text
    for record in caplog.records:
        assert SECRET not in record.getMessage()
        assert SECRET not in "".join(_texts(record.exc_info[1] if record.exc_info else None))


# Each way a configuration holding one of BAD_URLS is refused when read (FenceConfig.from_conf checks only
# the URL's shape; a store is opened later): the URL itself malformed (no "://", so the error quotes it,
# masked), or another setting beside it that cannot work.
BROKEN_CONF = {
    "malformed url": lambda url: {"fence_store_url": url.replace("://", ":", 1)},
    "bad ttl": lambda url: {"fence_store_url": url, "fence_lease_ttl": -1},
    "bad renew interval": lambda url: {"fence_store_url": url, "fence_renew_interval": 1e9},
    "bad on_busy": lambda url: {"fence_store_url": url, "fence_on_busy": "sometimes"},
}


@pytest.mark.parametrize("broken", BROKEN_CONF.values(), ids=BROKEN_CONF.keys())
@pytest.mark.parametrize("url", BAD_URLS.values(), ids=BAD_URLS.keys())
def test_no_password_in_configuration_errors(url: str, broken: Any) -> None:
    conf = broken(url)
    with pytest.raises(ConfigurationError) as info:
        FenceConfig.from_conf(conf)
    for text in _texts(info.value):
        assert SECRET not in text, text
    if "://" not in conf["fence_store_url"]:  # the refusal quotes the URL: masked, not left out
        assert "***" in str(info.value), str(info.value)


@pytest.mark.parametrize("url", [f"sqlite://app:{SECRET}@/x.db", f"memory://app:{SECRET}@x"])
def test_the_fault_kit_masks_urls_too(url: str) -> None:
    with pytest.raises(ValueError) as info:
        StoreProxy.for_url(url)
    assert SECRET not in str(info.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"postgresql://app:{SECRET}@db/shop", "postgresql://app:***@db/shop"),
        (f"redis://:{SECRET}@cache:6379/0?prefix=x", "redis://:***@cache:6379/0?prefix=x"),
        (f"redis://cache/0?password={SECRET}", "redis://cache/0?password=***"),
        (f"postgresql://app:a/b@c{SECRET}@db/shop", "postgresql://app:***@db/shop"),
        ("sqlite:///fence.db", "sqlite:///fence.db"),
        ("etcd://127.0.0.1:2379/fence/", "etcd://127.0.0.1:2379/fence/"),
        (None, "None"),
    ],
)
def test_mask_url_hides_the_password_of_every_url_form(url: Any, shown: str) -> None:
    assert mask_url(url) == shown


def test_a_sql_only_step_on_another_store_names_its_scheme_alone() -> None:
    """The handle's refusal of SQL work on a store without transactions quotes the scheme, never the URL."""
    store = open_store(f"memory://app:{SECRET}@x/shop")
    fence = Fence(store, store.acquire("k", "w", 30.0))
    with pytest.raises(ConfigurationError) as info:
        fence.atomic_step("charge", lambda conn: None)
    assert str(info.value) == (
        "this needs a SQL lease store, not memory://; use celery_fence.fenced_update(conn, table, values, "
        "where, self.fence.token) on your own database instead"
    )
