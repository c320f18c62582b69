"""The etcd client of the etcd store: etcd's v3 JSON gateway (etcd >= 3.4 serves it at ``/v3/`` on the client
port; 3.3's ``/v3beta/`` is not supported), the process's etcd leases and the token offset (:class:`Epochs`).

Every transport and HTTP error is translated in :meth:`Gateway.call`, the one boundary: no answer (a refused
or failed connection, a timeout, an answer lost after the request went out) or a transient gRPC code ->
``StoreUnavailable``; an answer that is not the gateway's JSON (404 without the gateway, 501 from another
server) or etcd auth -> ``ConfigurationError``; ``requested lease not found`` -> :class:`LeaseNotFound`; any
other refusal (over ``--max-request-bytes``...) -> ``InvalidArgument``.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from ...errors import ConfigurationError, FenceError, InvalidArgument, StoreUnavailable
from ..urls import mask_url
from .http import Transport

__all__ = ["KV", "Epochs", "Gateway", "LeaseNotFound", "TxnResult", "parse_url"]

Op = dict[str, Any]
_TRANSIENT = {1, 2, 4, 10, 13, 14}  # gRPC Canceled, Unknown, DeadlineExceeded, Aborted, Internal, Unavailable
_AUTH = {7, 16}  # gRPC PermissionDenied, Unauthenticated
_BAD_GATEWAY = {502, 503, 504}  # a proxy in front of etcd: transient


class LeaseNotFound(FenceError):
    """The etcd lease named in a request expired or was revoked (internal to the etcd store)."""


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _range(key: str, prefix: bool) -> dict[str, str]:
    if not prefix:
        return {"key": _b64(key)}
    raw = key.encode()  # a prefix ends with "/": its successor never overflows
    return {"key": _b64(key), "range_end": base64.b64encode(raw[:-1] + bytes([raw[-1] + 1])).decode()}


@dataclass(frozen=True)
class KV:
    key: str
    value: str
    create: int  # create_revision
    mod: int  # mod_revision
    lease: int  # 0: attached to no etcd lease

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> KV:
        value = base64.b64decode(raw.get("value", "")).decode()
        fields = (int(raw.get(name, 0)) for name in ("create_revision", "mod_revision", "lease"))
        return cls(base64.b64decode(raw["key"]).decode(), value, *fields)


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store's revision after the Txn: the Txn's own revision when it wrote
    responses: list[Op] = field(default_factory=list)

    def kvs(self, index: int) -> list[KV]:
        """The key-values of the range at ``index`` of the branch that ran."""
        return [KV.parse(kv) for kv in self.responses[index].get("response_range", {}).get("kvs", [])]

    def first(self, index: int) -> KV | None:
        return next(iter(self.kvs(index)), None)


def put(key: str, value: str, lease: int = 0) -> Op:
    body = {"key": _b64(key), "value": _b64(value)}
    return {"request_put": {**body, "lease": str(lease)} if lease else body}


def get(key: str, *, prefix: bool = False, keys_only: bool = False) -> Op:
    return {"request_range": {**_range(key, prefix), "keys_only": keys_only}}


def delete(key: str, *, prefix: bool = False) -> Op:
    return {"request_delete_range": _range(key, prefix)}


def nested(compare: Sequence[Op], success: Sequence[Op], failure: Sequence[Op] = ()) -> Op:
    return {"request_txn": {"compare": list(compare), "success": list(success), "failure": list(failure)}}


def created(key: str, revision: int) -> Op:  # revision 0: the key does not exist
    return {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": str(revision)}


def modified(key: str, revision: int) -> Op:  # revision 0: the key does not exist
    return {"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}


def holds(key: str, value: str) -> Op:  # the key exists with this value
    return {"key": _b64(key), "target": "VALUE", "result": "EQUAL", "value": _b64(value)}


def parse_url(url: str, prefix: object = None) -> tuple[str, str]:
    """``etcd://host:port/prefix/`` -> ``("host:port", "prefix/")``: port 2379, prefix ``fence/`` by default;
    a ``prefix`` given apart wins over the URL's."""
    parts = urlsplit(url)
    try:
        port = parts.port or 2379
    except ValueError as exc:
        raise ConfigurationError(f"bad port in etcd store URL {mask_url(url)!r}: {exc}") from exc
    if parts.scheme != "etcd" or not parts.hostname or parts.username or parts.query or parts.fragment:
        raise ConfigurationError(f"an etcd store URL is etcd://host:2379[/prefix/], got {mask_url(url)!r}")
    prefix = prefix if prefix is not None else unquote(parts.path.lstrip("/")) or "fence/"
    if not isinstance(prefix, str) or not prefix.strip("/"):
        raise ConfigurationError(f"an etcd key prefix is a non-empty str such as 'fence/', got {prefix!r}")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port}", prefix if prefix.endswith("/") else f"{prefix}/"


class Gateway:
    """HTTP client of one etcd endpoint, over this process's keep-alive connections (:mod:`.http`)."""

    def __init__(self, base_url: str, timeout: tuple[float, float] = (3.0, 5.0)) -> None:
        self.base_url, self.timeout = base_url.rstrip("/"), timeout
        self.http = Transport(self.base_url, timeout)

    def close(self) -> None:
        self.http.close()

    def txn(self, compare: Sequence[Op], success: Sequence[Op], failure: Sequence[Op] = ()) -> TxnResult:
        reads = all("request_range" in op for op in (*success, *failure))  # a lost answer may be asked again
        body = {"compare": compare, "success": success, "failure": failure}
        answer = self.call("/kv/txn", body, idempotent=reads)
        revision = int(answer.get("header", {}).get("revision", 0))
        return TxnResult(bool(answer.get("succeeded")), revision, answer.get("responses", []))

    def grant(self, ttl: int) -> int:
        return int(self.call("/lease/grant", {"TTL": str(ttl)})["ID"])

    def keepalive(self, lease_id: int) -> int:
        """Seconds the lease now has; 0 when it is gone (the gateway then answers 200 without a TTL)."""
        return int(self.call("/lease/keepalive", {"ID": str(lease_id)}).get("result", {}).get("TTL", 0))

    def time_to_live(self, lease_id: int) -> int:
        """Seconds the lease has left; -1 when it is gone."""
        answer = self.call("/lease/timetolive", {"ID": str(lease_id)}, idempotent=True)
        return int(answer.get("TTL", -1))

    def revoke(self, lease_id: int) -> None:
        with contextlib.suppress(LeaseNotFound):  # already gone
            self.call("/lease/revoke", {"ID": str(lease_id)})

    def call(self, path: str, body: Op, idempotent: bool = False) -> Op:
        """POST ``body`` to ``/v3{path}``; ``idempotent``: a read, which the transport may send again once
        when a reused connection turns out dropped (a write never is: its outcome is unknown)."""
        try:
            status, raw = self.http.post(f"/v3{path}", json.dumps(body).encode(), idempotent)
        except (OSError, http.client.HTTPException) as exc:
            raise StoreUnavailable(
                f"etcd at {self.base_url} did not answer ({type(exc).__name__}: {exc}); check that etcd runs "
                "and that its --listen-client-urls and --advertise-client-urls include this address"
            ) from exc
        text = raw.decode("utf-8", "replace")
        try:  # the first JSON object: a streamed answer has one per line
            answer = json.loads(text.strip().split("\n", 1)[0])
        except ValueError:
            answer = None
        if status == http.HTTPStatus.OK and isinstance(answer, dict) and "code" not in answer:
            return answer
        raise _error(self.base_url, path, status, answer, text)


def _error(base: str, path: str, status: int, answer: Any, text: str) -> FenceError:
    if not isinstance(answer, dict) or "code" not in answer:
        if status in _BAD_GATEWAY:
            return StoreUnavailable(f"etcd at {base} is unavailable (HTTP {status} on /v3{path})")
        return ConfigurationError(
            f"{base} is not etcd's v3 JSON gateway (HTTP {status} on /v3{path}: {text[:60]!r}): the etcd "
            "store needs etcd >= 3.4, which serves it at /v3/ on its client port; check the URL's host, port"
        )
    code, message = int(answer["code"]), str(answer.get("message") or answer.get("error"))
    if "lease not found" in message:
        return LeaseNotFound(message)
    if code in _TRANSIENT:
        return StoreUnavailable(f"etcd at {base} could not serve /v3{path}: {message}")
    if code in _AUTH:
        return ConfigurationError(f"etcd at {base} requires authentication; celery-fence does not support it")
    return InvalidArgument(f"etcd at {base} refused /v3{path}, nothing was written: {message}")


@dataclass(frozen=True)
class Epochs:
    """Token = revision + the offset of its epoch; each advance starts one at the revision that wrote it."""

    mod: int = 0  # 0: never advanced
    offset: int = 0
    earlier: tuple[tuple[int, int], ...] = ()  # (start, offset) of the former epochs

    @classmethod
    def load(cls, kv: KV | None) -> Epochs:
        if kv is None:
            return cls()
        data = json.loads(kv.value)
        return cls(kv.mod, int(data["offset"]), tuple((int(s), int(o)) for s, o in data["earlier"]))

    def advanced(self, gap: int) -> tuple[int, str]:
        earlier = [*self.earlier, (self.mod, self.offset)] if self.mod else list(self.earlier)
        return self.offset + gap, json.dumps({"offset": self.offset + gap, "earlier": earlier})

    def token(self, revision: int) -> int:
        epochs = [(self.mod, self.offset), *reversed(self.earlier)]
        return next((revision + off for start, off in epochs if revision > start), revision)

    def revision(self, token: int) -> int:
        epochs = [(self.mod, self.offset), *reversed(self.earlier)]
        return next((token - off for start, off in epochs if token - off > start), token)
