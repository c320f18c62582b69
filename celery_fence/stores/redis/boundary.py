"""The Redis store's URL parsing and its one error boundary, where redis-py exceptions become celery-fence
errors (``raise ... from``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.connection import URL_QUERY_ARGUMENT_PARSERS
from redis.exceptions import ClusterError, NoPermissionError, RedisClusterException, TryAgainError

from ... import errors
from ..base import out_of_tokens
from ..urls import mask_url

__all__ = ["USAGE", "split_url", "translated"]


USAGE = "redis[s]://[[user]:password@]host[:port][/db][?prefix=...], or for a Redis Cluster "
USAGE += "redis[s]://[[user]:password@]host[:port][,host[:port]...][/0]?cluster=true[&prefix=...]"
_FLAGS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def split_url(url: str) -> tuple[str, str | None, list[tuple[str, int]] | None]:
    """``(URL for redis-py, key prefix, cluster seed nodes or None for one server)``."""
    try:
        parts = urlsplit(url)
        query, db = parse_qsl(parts.query, keep_blank_values=True), parts.path.strip("/")
        unknown = {k for k, _ in query} - {*URL_QUERY_ARGUMENT_PARSERS, "prefix", "cluster"}
        if unknown or parts.scheme not in ("redis", "rediss") or not (db.isdigit() or not db):
            raise ValueError(f"unknown parameters {sorted(unknown)}" if unknown else "not Redis")
        flag = dict(query).get("cluster", "false")
        if flag.lower() not in _FLAGS:
            raise ValueError(f"cluster={flag!r} is not true or false")
        nodes = _nodes(parts.netloc) if _FLAGS[flag.lower()] else None
        if nodes is None:
            parts.port  # noqa: B018 (raises ValueError for a bad port)
        elif db not in ("", "0"):
            raise ValueError(f"a Redis Cluster has only database 0, not {db}")
    except (TypeError, ValueError) as exc:
        raise errors.ConfigurationError(f"bad Redis URL {mask_url(url)} ({exc}): use {USAGE}") from exc
    rest = urlencode([(name, value) for name, value in query if name not in ("prefix", "cluster")])
    if nodes is not None:  # redis-py gets the first node in the URL, all of them as startup nodes
        user, at, hosts = parts.netloc.rpartition("@")
        parts = parts._replace(netloc=f"{user}{at}{hosts.split(',')[0]}", path="")
    return urlunsplit(parts._replace(query=rest)), dict(query).get("prefix"), nodes  # the last one wins


def _nodes(netloc: str) -> list[tuple[str, int]]:
    hosts = netloc.rpartition("@")[2].split(",")
    seeds = [urlsplit(f"//{host}") for host in hosts]
    if not all(seed.hostname for seed in seeds):
        raise ValueError("a cluster node without a host")
    return [(str(seed.hostname), seed.port or 6379) for seed in seeds]


@contextmanager
def translated(url: str) -> Iterator[None]:
    """The one boundary where redis-py exceptions become celery-fence errors (``raise from``)."""
    try:
        yield
    except errors.FenceError:
        raise
    except (redis.RedisError, RedisClusterException, UnicodeEncodeError) as exc:
        raise _translate(f"fence store {mask_url(url)}", exc) from exc  # the URL masked on failure only


def _translate(where: str, exc: Exception) -> errors.FenceError:
    if isinstance(exc, (redis.AuthenticationError, redis.exceptions.AuthorizationError, NoPermissionError)):
        return errors.ConfigurationError(f"{where} refused the credentials: {exc}")
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        fix = "check that Redis runs and is reachable there, or fix fence_store_url"
        return errors.StoreUnavailable(f"{where} unavailable: {exc}; {fix}")
    if isinstance(exc, (ClusterError, TryAgainError, RedisClusterException)):
        # a cluster failing over (CLUSTERDOWN, TRYAGAIN past redis-py's redirects, no node reachable):
        # like a connection error, the call may have acted (a script whose reply was lost)
        fix = "the Redis Cluster is failing over or has no primary for the slot; retry once it has"
        return errors.StoreUnavailable(f"{where} unavailable: {exc}; {fix}")
    if isinstance(exc, redis.ResponseError):
        return _response_error(where, exc)
    if isinstance(exc, (redis.DataError, UnicodeEncodeError)):
        return errors.InvalidArgument(f"{where} cannot take this argument: {exc}")
    return errors.StoreUnavailable(f"{where} failed: {exc}")


def _response_error(where: str, exc: redis.ResponseError) -> errors.FenceError:
    message = str(exc).split(" script: ")[0]  # Redis appends the script's sha to a raised error
    if message.startswith("FENCE_RANGE "):
        return out_of_tokens()
    if message.startswith("FENCE_REWOUND "):
        return errors.TokenRewound(f"{message[14:]}: run 'celery fence advance' on {where}")
    if "DB index is out of range" in message:
        return errors.ConfigurationError(
            f"{where}: no such database ({message}); use one it has (0-15 by default)"
        )
    return errors.StoreUnavailable(f"{where} failed: {message}")
