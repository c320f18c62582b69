"""Stores, chosen by URL scheme and imported lazily.

Third-party stores register a class under the entry point group ``celery_fence.stores``; a class is
constructed as ``cls(url)`` and must satisfy :class:`~celery_fence.stores.base.Store`.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from ..errors import ConfigurationError
from .base import FencedConnectionStore, Store
from .capabilities import Capabilities, capabilities_of
from .urls import mask_url

__all__ = [
    "DEFAULT_STORE_URL",
    "Capabilities",
    "FencedConnectionStore",
    "Store",
    "capabilities_for",
    "capabilities_of",
    "check_store_url",
    "open_store",
    "store_class",
]

DEFAULT_STORE_URL = "sqlite:///celery_fence.db"


@dataclass(frozen=True)
class _Builtin:
    target: str  # "module:Class"
    extra: str | None = None  # the celery-fence extra that brings the driver
    driver: str | None = None  # the module that extra installs


_BUILTIN = {
    "memory": _Builtin("celery_fence.stores.memory:MemoryStore"),
    "sqlite": _Builtin("celery_fence.stores.sql:SQLStore"),
    "postgresql": _Builtin("celery_fence.stores.sql:SQLStore", "postgres", "psycopg"),
    "postgres": _Builtin("celery_fence.stores.sql:SQLStore", "postgres", "psycopg"),
    "redis": _Builtin("celery_fence.stores.redis:RedisStore", "redis", "redis"),
    "rediss": _Builtin("celery_fence.stores.redis:RedisStore", "redis", "redis"),
    "etcd": _Builtin("celery_fence.stores.etcd:EtcdStore"),  # the standard library's http.client
}

_DRIVER_SUFFIX_MODULES = {
    "psycopg": "psycopg",
    "psycopg2": "psycopg2",
    "pg8000": "pg8000",
    "asyncpg": None,
}


def scheme_of(url: object) -> tuple[str, str | None]:
    """``postgresql+psycopg://...`` -> ``("postgresql", "psycopg")``."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(
            f"fence_store_url must be a URL such as {DEFAULT_STORE_URL!r} or "
            f"'postgresql+psycopg://host/db', got {mask_url(url)!r}"
        )
    scheme = url.split("://", 1)[0].lower()
    base, _, driver = scheme.partition("+")
    return base, driver or None


def open_store(url: str = DEFAULT_STORE_URL, **options: Any) -> Store:
    """Open the store named by ``url``. Refuses an unknown scheme or a missing extra at once."""
    store: Store = store_class(url)(url, **options)
    return store


def store_class(url: object) -> Any:
    """The class that opens ``url``: a built-in store, or one registered under the ``celery_fence.stores``
    entry point group. Refuses a malformed URL, an unknown scheme or a missing driver, without I/O."""
    base, driver = scheme_of(url)
    builtin = _BUILTIN.get(base)
    if builtin is None:
        return _from_entry_point(base, str(url))
    _require_driver(base, driver, builtin)
    module_name, _, cls_name = builtin.target.partition(":")
    return getattr(importlib.import_module(module_name), cls_name)


def check_store_url(url: object) -> None:
    """Refuse, without connecting, what ``open_store(url)`` would refuse before its first round trip: a
    malformed URL, an unknown scheme, a missing driver, and what the store's own ``check_url`` refuses
    (the worker's startup check calls it)."""
    check = getattr(store_class(url), "check_url", None)
    if check is not None:
        check(str(url))


def capabilities_for(url: str) -> Capabilities:
    """What the store ``url`` names declares, known before connecting (:mod:`.capabilities`)."""
    cls = store_class(url)
    declare = getattr(cls, "capabilities_for", None)
    return declare(url) if declare is not None else capabilities_of(cls)


def _require_driver(base: str, driver: str | None, builtin: _Builtin) -> None:
    if driver == "asyncpg":
        raise ConfigurationError("asyncpg is async-only; use 'postgresql+psycopg://' (Celery tasks are sync)")
    module = _DRIVER_SUFFIX_MODULES.get(driver or "", builtin.driver) if base != "sqlite" else None
    if module and importlib.util.find_spec(module) is None:
        extra = builtin.extra if module == builtin.driver else None
        fix = f"pip install 'celery-fence[{extra}]'" if extra else f"pip install {module}"
        raise ConfigurationError(f"the {base!r} store needs the {module!r} package: {fix}")


def _from_entry_point(base: str, url: str) -> Any:
    for ep in entry_points(group="celery_fence.stores"):
        if ep.name == base:
            return ep.load()
    raise _unknown_scheme(base, url)


def _unknown_scheme(base: str, url: str) -> ConfigurationError:
    known = ", ".join(sorted(_BUILTIN))
    return ConfigurationError(
        f"unknown fence store scheme {base!r} in {mask_url(url)!r}; use one of: {known}, "
        "or register a store under the 'celery_fence.stores' entry point group"
    )
