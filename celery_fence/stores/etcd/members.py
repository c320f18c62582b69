"""The members of an etcd cluster as the store reaches them: the URL's endpoint list and the failover order.

``etcd://h1:2379,h2:2379,h3:2379/prefix/`` names every member's client endpoint; one endpoint is a cluster of
one. Calls go to the preferred member; a member that refused the connection, reset it or timed out is passed
over and the next one becomes preferred, so the following calls start there. Which requests may go on to the
next member is :meth:`Gateway.call`'s decision (:mod:`.gateway`): any request that never reached a member,
only a read (or a repeatable lease call) once it did.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from urllib.parse import unquote, urlsplit

from ..._process import forget_in_child
from ...errors import ConfigurationError
from ..urls import mask_url
from .http import Transport

__all__ = ["Members", "parse_url"]

log = logging.getLogger(__name__)

_FORM = "etcd://host:2379[,host2:2379,...][/prefix/]"


def parse_url(url: str, prefix: object = None) -> tuple[list[str], str]:
    """``etcd://h1:p1,h2:p2/prefix/`` -> ``(["h1:p1", "h2:p2"], "prefix/")``: port 2379 where none is given,
    prefix ``fence/`` by default; a ``prefix`` given apart wins over the URL's."""
    parts = urlsplit(url)
    if parts.scheme != "etcd" or "@" in parts.netloc or parts.query or parts.fragment or not parts.netloc:
        raise ConfigurationError(f"an etcd store URL is {_FORM}, got {mask_url(url)!r}")
    members = [_endpoint(url, entry) for entry in parts.netloc.split(",")]
    if len(set(members)) != len(members):
        raise ConfigurationError(f"an etcd store URL names each member once ({_FORM}), got {mask_url(url)!r}")
    prefix = prefix if prefix is not None else unquote(parts.path.lstrip("/")) or "fence/"
    if not isinstance(prefix, str) or not prefix.strip("/"):
        raise ConfigurationError(f"an etcd key prefix is a non-empty str such as 'fence/', got {prefix!r}")
    return members, prefix if prefix.endswith("/") else f"{prefix}/"


def _endpoint(url: str, entry: str) -> str:
    """``host[:port]`` of one member, checked as ``urlsplit`` checks a single netloc; ``host:port`` back."""
    parts = urlsplit(f"//{entry}")
    try:
        port = parts.port or 2379
    except ValueError as exc:
        raise ConfigurationError(f"bad port in etcd store URL {mask_url(url)!r}: {exc}") from exc
    if not entry or not parts.hostname:
        raise ConfigurationError(
            f"an etcd store URL is {_FORM}, each member host:port with no empty entry, got {mask_url(url)!r}"
        )
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port}"


class Members:
    """One :class:`Transport` per member and which one to ask first (shared by the process's threads: a
    hint, which a forked child keeps)."""

    def __init__(self, base_urls: Sequence[str], timeout: tuple[float, float]) -> None:
        self.transports = [Transport(url.rstrip("/"), timeout) for url in base_urls]
        self._lock, self._preferred = threading.Lock(), 0
        forget_in_child(self)

    def forget_after_fork(self) -> None:
        """A lock another thread of the parent held at the fork would never be released in the child."""
        self._lock = threading.Lock()

    def in_order(self) -> list[Transport]:
        """Every member once, the preferred first, then the ones after it."""
        with self._lock:
            start = self._preferred
        return [*self.transports[start:], *self.transports[:start]]

    def pass_over(self, member: Transport, why: object) -> None:
        """``member`` failed: the next one becomes preferred (unless another thread moved on already)."""
        index, moved = self.transports.index(member), None
        with self._lock:
            if self._preferred == index and len(self.transports) > 1:
                self._preferred = moved = (index + 1) % len(self.transports)
        if moved is not None:  # once per move, so an operator sees a member in trouble
            log.warning("etcd member %s failed (%s); passing over to %s", member.base_url, why,
                        self.transports[moved].base_url)

    @property
    def preferred(self) -> Transport:
        with self._lock:
            return self.transports[self._preferred]

    def close(self) -> None:
        for transport in self.transports:
            transport.close()
