"""The Redis store's URL parsing and its one error boundary, where redis-py exceptions become celery-fence
errors (``raise ... from``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.connection import URL_QUERY_ARGUMENT_PARSERS
from redis.exceptions import NoPermissionError

from ... import errors
from ..urls import mask_url
from ..validation import out_of_tokens

__all__ = ["split_url", "translated"]


def split_url(url: str) -> tuple[str, str | None]:
    try:
        parts = urlsplit(url)
        query, db = parse_qsl(parts.query, keep_blank_values=True), parts.path.strip("/")
        unknown = {k for k, _ in query} - {*URL_QUERY_ARGUMENT_PARSERS, "prefix"}
        if unknown or parts.scheme not in ("redis", "rediss") or not (db.isdigit() or not db):
            raise ValueError(f"unknown parameters {sorted(unknown)}" if unknown else "not Redis")
        parts.port  # noqa: B018 (raises ValueError for a bad port)
    except (TypeError, ValueError) as exc:
        usage = "redis[s]://[[user]:password@]host[:port][/db][?prefix=...]"
        raise errors.ConfigurationError(f"bad Redis URL {mask_url(url)} ({exc}): use {usage}") from exc
    rest = urlencode([(name, value) for name, value in query if name != "prefix"])
    return urlunsplit(parts._replace(query=rest)), dict(query).get("prefix")  # the last one wins


@contextmanager
def translated(url: str) -> Iterator[None]:
    """The one boundary where redis-py exceptions become celery-fence errors (``raise from``)."""
    where = f"fence store {mask_url(url)}"
    try:
        yield
    except errors.FenceError:
        raise
    except (redis.AuthenticationError, redis.exceptions.AuthorizationError, NoPermissionError) as exc:
        raise errors.ConfigurationError(f"{where} refused the credentials: {exc}") from exc
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        fix = "check that Redis runs and is reachable there, or fix fence_store_url"
        raise errors.StoreUnavailable(f"{where} unavailable: {exc}; {fix}") from exc
    except redis.ResponseError as exc:
        raise _response_error(where, exc) from exc
    except (redis.DataError, UnicodeEncodeError) as exc:
        raise errors.InvalidArgument(f"{where} cannot take this argument: {exc}") from exc
    except redis.RedisError as exc:
        raise errors.StoreUnavailable(f"{where} failed: {exc}") from exc


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
