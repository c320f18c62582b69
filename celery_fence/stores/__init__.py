"""Stores, chosen by URL scheme and imported lazily.

Every store, built-in or third-party, is a class registered under the entry point group
``celery_fence.stores`` by its URL scheme; it is constructed as ``cls(url)`` and must satisfy
:class:`~celery_fence.stores.base.RunStore` (the other roles are optional). ``open_store`` puts it behind
its checked front (:mod:`.front`), which refuses bad arguments before the store sees them.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any, cast

from ..errors import ConfigurationError
from .base import FencedConnectionStore, Store, StoreClass
from .capabilities import Capabilities, capabilities_of
from .drivers import missing_driver
from .front import checked
from .urls import mask_url

__all__ = [
    "DEFAULT_STORE_URL",
    "Capabilities",
    "FencedConnectionStore",
    "Store",
    "capabilities_for",
    "capabilities_of",
    "open_store",
    "store_class",
]

DEFAULT_STORE_URL = "sqlite:///celery_fence.db"
_GROUP = "celery_fence.stores"  # the one registry: setup.cfg registers the built-in stores there too


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
    """Open the store named by ``url``, behind its checked front. Refuses an unknown scheme or a missing
    extra at once."""
    return checked(store_class(url)(url, **options))


def store_class(url: object) -> StoreClass:
    """The class registered for ``url``'s scheme under the ``celery_fence.stores`` entry point group (the
    built-in stores too). Refuses a malformed URL, an unknown scheme, a missing driver and what the store's
    own ``check_url`` refuses, without I/O."""
    base, _ = scheme_of(url)
    registered: dict[str, Any] = {}
    for ep in entry_points(group=_GROUP):  # a built-in scheme is never taken over by another package
        if ep.name not in registered or ep.module.startswith("celery_fence."):
            registered[ep.name] = ep
    if base not in registered:
        raise _unknown_scheme(base, str(url), sorted(registered))
    cls = cast(StoreClass, _load(registered[base]))  # an entry point loads whatever it names
    check = getattr(cls, "check_url", None)
    if check is not None:
        check(str(url))
    return cls


def capabilities_for(url: str) -> Capabilities:
    """What the store ``url`` names declares, known before connecting (:mod:`.capabilities`)."""
    cls = store_class(url)
    declare = getattr(cls, "capabilities_for", None)
    return declare(url) if declare is not None else capabilities_of(cls)


def _load(ep: Any) -> Any:
    try:
        return ep.load()
    except ModuleNotFoundError as exc:  # the store's driver: name the extra its entry point declares
        if not exc.name or exc.name.split(".")[0] in ("celery_fence", ep.module.split(".")[0]):
            raise
        extras = getattr(ep, "extras", None) or [None]
        raise missing_driver(ep.name, exc.name.split(".")[0], extras[0]) from exc


def _unknown_scheme(base: str, url: str, known: list[str]) -> ConfigurationError:
    return ConfigurationError(
        f"unknown fence store scheme {base!r} in {mask_url(url)!r}; use one of: {', '.join(known)}, "
        f"or register a store under the {_GROUP!r} entry point group"
    )
