"""The Redis store (``redis://``, ``rediss://``, redis-py): every operation is one Lua script.

Each script is ``lua/<operation>.lua`` with ``lua/common.lua`` prepended, run by ``EVALSHA`` (``NOSCRIPT``
loads it and retries once); acquire, renew (up to 10,000 leases), complete, release, save_step and refuse are
one round trip each. Expiry is judged by the server's ``TIME`` against a deadline in the key's lease hash,
which never expires. Keys share one prefix (``fence:``, or ``?prefix=``); a script gets its key's own names
as KEYS and makes the store-wide ones from the prefix (its first argument). Tokens come from ``INCR`` of one
counter; on a Redis Cluster (``?cluster=true``, see ``layout``) of one counter per slot.

Honest limits. Sentinel, replica or cluster failover is asynchronous and can lose acknowledged writes. A
restart without persistence, the ``everysec`` fsync window, a failover or an evicted counter (use
``maxmemory-policy noeviction``) move the counter back: a script refuses (``TokenRewound``, nothing written)
a token not above the key's own token or the highest token issued (kept in a key of its own), or a key's
stored token found above the counter. A token a client merely presents is never evidence (it may be forged):
after an empty restart tokens start again at 1. Run ``celery fence advance`` after any of these. Tokens are
in [1, 2**53 - 1]. No driver retries (a script could run twice): a failed call is ``StoreUnavailable``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ... import codec, errors
from ..._process import forget_in_child
from ...lease import Abandoned, HistoryEvent, Lease, LeaseState
from ..capabilities import Capabilities
from .boundary import split_url
from .layout import open_layout
from .rows import history_events, lease_state, raise_stale, to_ms, who

__all__ = ["RedisStore"]

RENEW_BATCH = 10_000  # leases per renew call (one round trip each)
READ_BATCH = 1_000  # keys per state or prune call


class RedisStore:
    """Lease store on one Redis primary or a Redis Cluster; see :class:`celery_fence.stores.base.Store`."""

    max_value_bytes = codec.MAX_VALUE_BYTES  # far below a Redis string's 512 MB
    capabilities = Capabilities(name="Redis", default_port=6379)

    def __init__(self, url: str, prefix: str | None = None, timeout: float = 5.0) -> None:
        self.url = url
        target, url_prefix, nodes = split_url(url)
        if None not in (prefix, url_prefix) and prefix != url_prefix:
            raise errors.ConfigurationError(f"two key prefixes: {prefix!r}, {url_prefix!r} (URL)")
        self.prefix = ("fence:" if url_prefix is None else url_prefix) if prefix is None else prefix
        if not isinstance(self.prefix, str) or not self.prefix or "{" in self.prefix:
            raise errors.ConfigurationError(f"a key prefix is a str, not empty, no '{{': {prefix!r}")
        self._layout = open_layout(url, target, nodes, self.prefix, timeout)  # a client is made on first use
        self._names = self._layout.names
        forget_in_child(self)

    def migrate(self) -> None:
        """Nothing to create; checks that the server answers on this database."""
        with self._layout.connection.io() as client:
            client.ping()

    def acquire(self, key: str, owner: str, ttl: float, run: Mapping[str, Any] | None = None) -> Lease:
        ttl_ms = to_ms(ttl, "ttl")
        run_text = codec.dumps_mapping(run, self.max_value_bytes) or ""  # a script argument cannot be nil
        names = self._names.names_of(key, "lease", "history")
        reply = self._script("acquire", names, [key, owner, ttl_ms, run_text])
        if reply[0] == "done":
            raise errors.AlreadyDone(key, int(reply[1]), codec.loads(reply[2]))
        if reply[0] == "held":
            raise errors.LeaseHeld(key, reply[1], int(reply[2]) / 1000)
        if reply[0] == "own":  # our own acquire, retried: whether it took over is not known
            return Lease(key, int(reply[1]), owner)
        gap = next((int(ms) / 1000 for ms in reply[2:]), None)  # a takeover: how long that lease had expired
        return Lease(key, int(reply[1]), owner, taken_over=gap is not None, expired_for=gap)

    def renew(self, leases: Sequence[Lease], ttl: float) -> list[Lease]:
        ttl_ms = to_ms(ttl, "ttl")
        lost: list[Lease] = []
        for batch in self._layout.batches(leases, RENEW_BATCH, lambda x: x.key):
            names = [self._names.name_of(kind, x.key) for x in batch for kind in ("lease", "history")]
            args = [ttl_ms, *(arg for lease in batch for arg in who(lease))]
            lost += [batch[i - 1] for i in self._script("renew", names, args)]
        return lost

    def complete(self, lease: Lease, result: Any) -> None:
        text = codec.dumps(result, self.max_value_bytes)
        names = self._names.names_of(lease.key, "lease", "history")
        reply = self._script("complete", names, [*who(lease), text])
        raise_stale(lease, reply, "complete")

    def release(self, lease: Lease) -> None:
        self._script("release", self._names.names_of(lease.key, "lease", "history"), who(lease))

    def save_step(self, lease: Lease, name: str, value: Any) -> None:
        text = codec.dumps(value, self.max_value_bytes)
        keys = self._names.names_of(lease.key, "lease", "steps", "history")
        reply = self._script("save_step", keys, [*who(lease), name, text])
        if reply[0] == "dup":
            raise errors.InvalidArgument(f"step {name!r} of key {lease.key!r} is already committed")
        raise_stale(lease, reply, f"step {name}")

    def steps(self, key: str) -> dict[str, Any]:
        name = self._names.name_of("steps", key)
        with self._layout.connection.io() as client:
            stored: dict[str, str] = client.hgetall(name)  # type: ignore[assignment]
        split = ((v.partition("\n"), k) for k, v in stored.items())
        return {k: codec.loads(v) for (_, _, v), k in sorted(split, key=lambda e: int(e[0][0]))}

    def refuse(self, lease: Lease, what: str) -> None:
        self._script("refuse", self._names.names_of(lease.key, "history"), [*who(lease), what])

    def get(self, key: str) -> LeaseState | None:
        return next(iter(self._states([key])), None)

    def history(self, key: str | None = None) -> list[HistoryEvent]:
        """One key's list, or every key's (found by SCAN: no global list grows), in event order."""
        if key is None:
            return self._layout.history()
        name = self._names.name_of("history", key)
        with self._layout.connection.io() as client:
            return history_events(client.lrange(name, 0, -1))  # type: ignore[arg-type]

    def leases(self) -> list[LeaseState]:
        return self._states(self._layout.lease_keys())

    def force_release(self, key: str) -> int:
        names = self._names.names_of(key, "lease", "history")
        token = self._script("force_release", names, [key])
        if token is None:
            raise errors.InvalidArgument(f"no lease for key {key!r}")
        return int(token)

    def prune(self, older_than: float) -> int:
        """Finished keys and the markers of earlier prunes older than ``older_than`` go; how many went (in
        what order and batches: each layout's ``prune``)."""
        age = to_ms(older_than, "age")
        return self._layout.prune(age, READ_BATCH)

    def advance(self, gap: int) -> int:
        return self._layout.advance(gap)

    def abandoned(self, grace: float, limit: int = 100) -> list[Abandoned]:
        grace_ms = to_ms(grace, "age")
        cutoff, batches = self._layout.candidates(grace_ms, READ_BATCH)
        found: list[Abandoned] = []
        for batch in batches:
            keys, args = [self._names.name_of("lease", k) for k in batch], [cutoff, grace_ms, *batch]
            rows = self._script("abandoned", keys, args)
            found += [Abandoned(k, int(t), codec.loads(r), int(n), int(s)) for k, t, r, n, s in rows]
            if len(found) >= limit:
                break
        return found[:limit]

    def recover(self, seen: Abandoned, max_recoveries: int, reason: str = "") -> int | None:
        keys = self._names.names_of(seen.key, "lease", "history")
        args = [seen.key, seen.token, seen.recoveries, max_recoveries, reason, seen.sent]
        attempt = self._script("recover", keys, args)
        return None if attempt is None else int(attempt)

    def strand(self, key: str, run: Mapping[str, Any] | None, reason: str) -> bool:
        run_text = codec.dumps_mapping(run, self.max_value_bytes) or ""  # a script argument cannot be nil
        names = self._names.names_of(key, "lease", "history")
        return bool(self._script("strand", names, [key, run_text, reason]))

    def close(self) -> None:
        self._layout.connection.close()

    def forget_after_fork(self) -> None:
        """Drop the client (in a forked child: the parent's, left open for it); the next call makes one."""
        self._layout.connection.forget_after_fork()

    def token_scope(self, key: str) -> int | None:
        """The keys whose tokens one counter issues: the store's (None), or on a cluster the key's slot."""
        return self._layout.token_scope(key)

    def _script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        return self._layout.script(name, keys, args)

    def _states(self, keys: Sequence[str]) -> list[LeaseState]:
        """The states of ``keys`` that have one, in the order of ``keys``: one script call per batch."""
        states: dict[str, LeaseState | None] = {}
        for batch in self._layout.batches(keys, READ_BATCH):
            now, *rows = self._script("state", [self._names.name_of("lease", k) for k in batch], [])
            states.update((k, r and lease_state(k, int(now), r)) for k, r in zip(batch, rows, strict=True))
        return [state for key in keys if (state := states[key]) is not None]
