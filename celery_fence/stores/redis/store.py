"""The Redis store (``redis://``, ``rediss://``, redis-py): every operation is one Lua script.

Each script is ``lua/<operation>.lua`` with ``lua/common.lua`` prepended, run by ``EVALSHA`` (``NOSCRIPT``
loads it and retries once); acquire, renew (up to 10,000 leases), complete, release, save_step and refuse are
one round trip each. Expiry is judged by the server's ``TIME`` against a deadline in the key's lease hash,
which never expires. Keys share one prefix (``fence:``, or ``?prefix=``); a script gets its key's own names
as KEYS and makes the store-wide ones from the prefix (its first argument). Tokens come from ``INCR`` of one
counter; on a Redis Cluster (``?cluster=true``, see ``cluster``) of one counter per slot.

Honest limits. Sentinel, replica or cluster failover is asynchronous and can lose acknowledged writes. A
restart without persistence, the ``everysec`` fsync window, a failover or an evicted counter (use
``maxmemory-policy noeviction``) move the counter back: a script refuses (``TokenRewound``, nothing written)
a token not above the key's own token or the highest token issued (kept in a key of its own), or a key's
stored token found above the counter. A token a client merely presents is never evidence (it may be forged):
after an empty restart tokens start again at 1. Run ``celery fence advance`` after any of these. Tokens are
in [1, 2**53 - 1]. No driver retries (a script could run twice): a failed call is ``StoreUnavailable``."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.retry import Retry

from ... import codec, errors
from ..._process import forget_in_child
from ...lease import Abandoned, HistoryEvent, Lease, LeaseState
from ..capabilities import Capabilities
from ..liveness import idle_socket_is_readable
from ..validation import past_the_range
from . import cluster
from .boundary import split_url, translated
from .rows import chunks, history_events, lease_state, raise_stale, source, to_ms, who

__all__ = ["RedisStore"]

RENEW_BATCH = 10_000  # leases per renew call (one round trip each)
READ_BATCH = 1_000  # keys per state or prune call
_PRUNED = {True: ("history",), False: ("lease", "steps", "history")}  # prune's keys: a marked, a finished key
# No PING before commands, no CLIENT SETINFO on connect (round trips), no retries (a script could run twice)
_OPTIONS = dict(decode_responses=True, health_check_interval=0, driver_info=None, retry=Retry(NoBackoff(), 0))


class RedisStore:
    """Lease store on one Redis primary or a Redis Cluster; see :class:`celery_fence.stores.base.Store`."""

    max_value_bytes = codec.MAX_VALUE_BYTES  # far below a Redis string's 512 MB
    capabilities = Capabilities(name="Redis", default_port=6379)
    _client: Any  # redis.Redis, or redis.cluster.RedisCluster in cluster mode
    _held: redis.Redis | None  # one connection of the client's pool, kept for scripts
    _held_lock: threading.Lock
    _scripts: dict[str, Script]

    def __init__(self, url: str, prefix: str | None = None, timeout: float = 5.0) -> None:
        self.url = url
        self._target, url_prefix, self._nodes = split_url(url)
        self._mark = "" if self._nodes is None else "="  # a cluster's hash tags: '{=key}', never empty
        if None not in (prefix, url_prefix) and prefix != url_prefix:
            raise errors.ConfigurationError(f"two key prefixes: {prefix!r}, {url_prefix!r} (URL)")
        self.prefix = ("fence:" if url_prefix is None else url_prefix) if prefix is None else prefix
        if not isinstance(self.prefix, str) or not self.prefix or "{" in self.prefix:
            raise errors.ConfigurationError(f"a key prefix is a str, not empty, no '{{': {prefix!r}")
        self._timeout = timeout
        self.forget_after_fork()  # no client yet: each process makes its own on first use
        forget_in_child(self)

    def migrate(self) -> None:
        """Nothing to create; checks that the server answers on this database."""
        with self._io() as client:
            client.ping()

    def acquire(self, key: str, owner: str, ttl: float, run: Mapping[str, Any] | None = None) -> Lease:
        ttl_ms = to_ms(ttl, "ttl")
        run_text = codec.dumps_mapping(run, self.max_value_bytes) or ""  # a script argument cannot be nil
        reply = self._script("acquire", self._keys(key, "lease", "history"), [key, owner, ttl_ms, run_text])
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
        groups = [leases] if self._nodes is None else cluster.by_slot(self, leases, lambda x: x.key)
        for batch in (part for group in groups for part in chunks(group, RENEW_BATCH)):
            names = [self._k(kind, x.key) for x in batch for kind in ("lease", "history")]
            args = [ttl_ms, *(arg for lease in batch for arg in who(lease))]
            lost += [batch[i - 1] for i in self._script("renew", names, args)]
        return lost

    def complete(self, lease: Lease, result: Any) -> None:
        text = codec.dumps(result, self.max_value_bytes)
        reply = self._script("complete", self._keys(lease.key, "lease", "history"), [*who(lease), text])
        raise_stale(lease, reply, "complete")

    def release(self, lease: Lease) -> None:
        self._script("release", self._keys(lease.key, "lease", "history"), who(lease))

    def save_step(self, lease: Lease, name: str, value: Any) -> None:
        text = codec.dumps(value, self.max_value_bytes)
        keys = self._keys(lease.key, "lease", "steps", "history")
        reply = self._script("save_step", keys, [*who(lease), name, text])
        if reply[0] == "dup":
            raise errors.InvalidArgument(f"step {name!r} of key {lease.key!r} is already committed")
        raise_stale(lease, reply, f"step {name}")

    def steps(self, key: str) -> dict[str, Any]:
        name = self._k("steps", key)
        with self._io() as client:
            stored: dict[str, str] = client.hgetall(name)  # type: ignore[assignment]
        split = ((v.partition("\n"), k) for k, v in stored.items())
        return {k: codec.loads(v) for (_, _, v), k in sorted(split, key=lambda e: int(e[0][0]))}

    def refuse(self, lease: Lease, what: str) -> None:
        self._script("refuse", self._keys(lease.key, "history"), [*who(lease), what])

    def get(self, key: str) -> LeaseState | None:
        return next(iter(self._states([key])), None)

    def history(self, key: str | None = None) -> list[HistoryEvent]:
        """One key's list, or every key's (found by SCAN: no global list grows), in event order."""
        name = None if key is None else self._k("history", key)
        if name is None and self._nodes is not None:
            return cluster.history(self)
        with self._io() as client:
            pipe = client.pipeline(transaction=False)
            names = client.scan_iter(match=cluster.pattern(self.prefix, "history:{*}"), count=1000)
            for each in [name] if name else sorted(names):
                pipe.lrange(each, 0, -1)
            return history_events(line for per_key in pipe.execute() for line in per_key)

    def leases(self) -> list[LeaseState]:
        if self._nodes is not None:
            return self._states(cluster.keys_of(self, "lease"))
        with self._io() as client:
            return self._states(sorted(client.smembers(f"{self.prefix}keys")))  # type: ignore[arg-type]

    def force_release(self, key: str) -> int:
        token = self._script("force_release", self._keys(key, "lease", "history"), [key])
        if token is None:
            raise errors.InvalidArgument(f"no lease for key {key!r}")
        return int(token)

    def prune(self, older_than: float) -> int:
        """Markers of earlier prunes past the cutoff first (they lead the batches), then finished keys, each
        leaving its marker: one script call per READ_BATCH keys, so no marker of this prune is dropped."""
        age = to_ms(older_than, "age")
        if self._nodes is not None:
            return cluster.prune(self, age)
        cutoff, due, marked = self._script("due", [], [age, "done", "pruned"])
        dropped, items = 0, [*marked, *due]
        for start in range(0, len(items), READ_BATCH):
            batch, m = items[start : start + READ_BATCH], min(READ_BATCH, max(0, len(marked) - start))
            names = [self._k(kind, key) for i, key in enumerate(batch) for kind in _PRUNED[i < m]]
            dropped += int(self._script("prune", names, [cutoff, age, m, *batch]))
        return dropped

    def advance(self, gap: int) -> int:
        if self._nodes is not None:
            return cluster.advance(self, gap)
        floor = self._script("advance", [], [gap])
        if floor is None:  # the counter would leave the token range: nothing changed
            raise past_the_range(gap)
        return int(floor)

    def abandoned(self, grace: float, limit: int = 100) -> list[Abandoned]:
        grace_ms = to_ms(grace, "age")
        if self._nodes is None:
            cutoff, due = self._script("due", [], [grace_ms, "live"])
            batches = chunks(due, READ_BATCH)
        else:  # no index: every leased key, each slot's cutoff by its own clock
            cutoff, batches = "", cluster.in_batches(self, cluster.keys_of(self, "lease"), READ_BATCH)
        found: list[Abandoned] = []
        for batch in batches:
            keys, args = [self._k("lease", k) for k in batch], [cutoff, grace_ms, *batch]
            rows = self._script("abandoned", keys, args)
            found += [Abandoned(k, int(t), codec.loads(r), int(n), int(s)) for k, t, r, n, s in rows]
            if len(found) >= limit:
                break
        return found[:limit]

    def recover(self, seen: Abandoned, max_recoveries: int, reason: str = "") -> int | None:
        keys = self._keys(seen.key, "lease", "history")
        args = [seen.key, seen.token, seen.recoveries, max_recoveries, reason, seen.sent]
        attempt = self._script("recover", keys, args)
        return None if attempt is None else int(attempt)

    def strand(self, key: str, run: Mapping[str, Any] | None, reason: str) -> bool:
        run_text = codec.dumps_mapping(run, self.max_value_bytes) or ""  # a script argument cannot be nil
        return bool(self._script("strand", self._keys(key, "lease", "history"), [key, run_text, reason]))

    def close(self) -> None:
        clients, self._client, self._held, self._scripts = (self._held, self._client), None, None, {}
        with translated(self.url):
            for client in clients:
                if client is not None:
                    client.close()

    def forget_after_fork(self) -> None:
        """Drop the client (in a forked child: the parent's, left open for it); the next call makes one."""
        self._client = self._held = None
        self._held_lock = threading.Lock()  # a fork may inherit it held
        self._scripts = {}

    def token_scope(self, key: str) -> int | None:
        """The keys whose tokens one counter issues: the store's (None), or on a cluster the key's slot."""
        return None if self._nodes is None else cluster.slot_of(self._k("lease", key))

    def _k(self, kind: str, key: str) -> str:  # the {key} hash tag keeps a key's data in one slot
        return f"{self.prefix}{kind}:{{{self._mark}{key}}}"

    def _keys(self, key: str, *kinds: str) -> list[str]:  # the key's own (the scripts make the others)
        return [self._k(kind, key) for kind in kinds]

    @contextmanager
    def _io(self) -> Iterator[redis.Redis]:
        """This process's client (made again after a fork), inside the one boundary of error translation."""
        with translated(self.url):
            if self._client is None:
                timeouts = {"socket_timeout": self._timeout, "socket_connect_timeout": self._timeout}
                make = redis.Redis.from_url if self._nodes is None else cluster.client(self._nodes)
                self._client = make(self._target, **timeouts, **_OPTIONS)
            yield self._client

    def _script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run script ``name`` on the held connection (a pool checkout and return cost more client CPU than
        the call), or on a pooled one when another thread is using it (a renew while a run completes). Its
        first arguments: the prefix and, in a cluster, the tag of the slot of its keys."""
        args = [self.prefix, "" if self._nodes is None else cluster.slot_tag(keys[0]), *args]
        with self._io() as client:  # a race registers a script twice, harmlessly
            script = self._scripts[name] = self._scripts.get(name) or client.register_script(source(name))
            # a cluster client routes each call to the slot's primary: no connection of its own is held
            if self._nodes is not None or not self._held_lock.acquire(blocking=False):
                return script(keys=keys, args=args, client=client)
            try:
                return script(keys=keys, args=args, client=self._held_client(client))
            finally:
                self._held_lock.release()

    def _held_client(self, client: redis.Redis) -> redis.Redis:
        """The held connection, checked as the pool checks one it hands out (but by one poll of its socket,
        see ``liveness``): one that the server closed is connected again."""
        if self._held is None:
            self._held = redis.Redis(connection_pool=client.connection_pool, single_connection_client=True)
        conn = self._held.connection
        sock = getattr(conn, "_sock", None)  # None: not connected, the next command connects
        if conn is not None and sock is not None and idle_socket_is_readable(sock.fileno()):
            conn.disconnect()  # type: ignore[no-untyped-call]  # the next command connects again
        return self._held

    def _states(self, keys: Sequence[str]) -> list[LeaseState]:
        if self._nodes is not None:
            return cluster.scan_states(self, keys)
        return [state for batch in chunks(keys, READ_BATCH) for state in self._slot_states(batch) if state]

    def _slot_states(self, keys: Sequence[str]) -> list[LeaseState | None]:  # keys of one slot in a cluster
        states = []
        for batch in chunks(keys, READ_BATCH):
            now, *rows = self._script("state", [self._k("lease", k) for k in batch], [])
            states += [r and lease_state(k, int(now), r) for k, r in zip(batch, rows, strict=True)]
        return states

