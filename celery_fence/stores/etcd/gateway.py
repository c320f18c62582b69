"""The etcd client of the etcd store: etcd's v3 JSON gateway (etcd >= 3.4 serves it at ``/v3/`` on the client
port; 3.3's ``/v3beta/`` is not supported), the process's etcd leases and the token offset (:class:`Epochs`).

Every transport and HTTP error is translated in :meth:`Gateway.call`, the one boundary: no answer (a refused
or failed connection, a timeout, an answer lost after the request went out) or a transient gRPC code ->
``StoreUnavailable``; an answer that is not the gateway's JSON (404 without the gateway, 501 from another
server) or etcd auth -> ``ConfigurationError``; ``requested lease not found`` -> :class:`LeaseNotFound`; any
other refusal (over ``--max-request-bytes``...) -> ``InvalidArgument``. With several members, a request
that reached none goes on to the next, and so does a read whose answer was lost or transient; a write whose
answer was lost is ``StoreUnavailable`` at once (it may have committed): see :meth:`Gateway.call`.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import ConfigurationError, FenceError, InvalidArgument, StoreUnavailable
from .http import NotSent, Transport
from .members import Members, parse_url

__all__ = ["KV", "Epochs", "Gateway", "LeaseNotFound", "TxnResult", "parse_url"]  # parse_url: .members

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


class Gateway:
    """HTTP client of an etcd cluster's members (one for a single endpoint), over this process's keep-alive
    connections (:mod:`.http`), failing over between them (:mod:`.members`)."""

    def __init__(self, base_urls: str | Sequence[str], timeout: tuple[float, float] = (3.0, 5.0)) -> None:
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        self.members, self.timeout = Members(urls, timeout), timeout
        self.base_url = ",".join(t.base_url for t in self.members.transports)  # for messages

    @property
    def http(self) -> Transport:
        """The transport of the member asked first now."""
        return self.members.preferred

    def close(self) -> None:
        self.members.close()

    def txn(self, compare: Sequence[Op], success: Sequence[Op], failure: Sequence[Op] = ()) -> TxnResult:
        reads = all("request_range" in op for op in (*success, *failure))  # a lost answer may be asked again
        body = {"compare": compare, "success": success, "failure": failure}
        answer = self.call("/kv/txn", body, idempotent=reads)
        revision = int(answer.get("header", {}).get("revision", 0))
        return TxnResult(bool(answer.get("succeeded")), revision, answer.get("responses", []))

    def grant(self, ttl: int) -> int:  # asked again, it grants a second lease, which runs out unused
        return int(self.call("/lease/grant", {"TTL": str(ttl)}, idempotent=True)["ID"])

    def keepalive(self, lease_id: int) -> int:
        """Seconds the lease now has; 0 when it is gone (the gateway then answers 200 without a TTL)."""
        answer = self.call("/lease/keepalive", {"ID": str(lease_id)}, idempotent=True)  # twice: no harm
        return int(answer.get("result", {}).get("TTL", 0))

    def time_to_live(self, lease_id: int) -> int:
        """Seconds the lease has left; -1 when it is gone."""
        answer = self.call("/lease/timetolive", {"ID": str(lease_id)}, idempotent=True)
        return int(answer.get("TTL", -1))

    def revoke(self, lease_id: int) -> None:
        with contextlib.suppress(LeaseNotFound):  # already gone
            self.call("/lease/revoke", {"ID": str(lease_id)}, idempotent=True)

    def call(self, path: str, body: Op, idempotent: bool = False) -> Op:
        """POST ``body`` to ``/v3{path}`` on the preferred member, failing over to the next ones.

        A request that reached no member (connection refused or timed out) goes to the next one, whatever it
        is. Once sent, only an ``idempotent`` one (a read, a repeatable lease call) does, when its answer is
        lost or is a transient refusal ("no leader", "leader changed"...); a write's lost answer raises
        ``StoreUnavailable`` at once: it may have committed, on any member, and only the caller can find out.
        """
        data, failures, cause = json.dumps(body).encode(), list[str](), None
        for member in self.members.in_order():
            try:
                status, raw = member.post(f"/v3{path}", data, idempotent)
            except NotSent as exc:
                self.members.pass_over(member, exc)
                failures.append(f"{member.base_url}: {exc}")
                cause = exc.__cause__ or exc
                continue
            except (OSError, http.client.HTTPException) as exc:
                self.members.pass_over(member, f"{type(exc).__name__}: {exc}")
                if idempotent:
                    failures.append(f"{member.base_url}: {type(exc).__name__}: {exc}")
                    cause = exc
                    continue
                raise StoreUnavailable(
                    f"etcd at {member.base_url} did not answer ({type(exc).__name__}: {exc}); the write may "
                    "have committed or not"
                ) from exc
            text = raw.decode("utf-8", "replace")
            try:  # the first JSON object: a streamed answer has one per line
                answer = json.loads(text.strip().split("\n", 1)[0])
            except ValueError:
                answer = None
            if status == http.HTTPStatus.OK and isinstance(answer, dict) and "code" not in answer:
                return answer
            error = _error(member.base_url, path, status, answer, text)
            if isinstance(error, StoreUnavailable):  # a member in trouble: the next call starts elsewhere
                self.members.pass_over(member, error)
            if not (idempotent and isinstance(error, StoreUnavailable)):
                raise error
            failures.append(str(error))
            cause = error
        raise StoreUnavailable(
            f"no etcd member answered ({'; '.join(failures)}); check that etcd runs and that its "
            "--listen-client-urls and --advertise-client-urls include these addresses"
        ) from cause


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
