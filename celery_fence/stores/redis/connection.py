"""The Redis store's client in this process: made on first use (again after a fork), its registered
scripts, and the one connection held for scripts on one server; every call inside the error boundary."""

from __future__ import annotations

import select
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.retry import Retry

from .boundary import translated
from .rows import source

__all__ = ["Connection", "client_options"]

# No PING before commands, no CLIENT SETINFO on connect (round trips), no retries (a script could run twice)
_OPTIONS = dict(decode_responses=True, health_check_interval=0, driver_info=None, retry=Retry(NoBackoff(), 0))


def client_options(timeout: float) -> dict[str, Any]:
    """The keyword arguments of a redis-py client (one server's or a cluster's) for the store."""
    return {"socket_timeout": timeout, "socket_connect_timeout": timeout, **_OPTIONS}


class Connection:
    """The client ``make_client()`` returns (redis.Redis, or a RedisCluster), made in each process."""

    _client: Any  # redis.Redis, or redis.cluster.RedisCluster
    _held: redis.Redis | None  # one connection of the client's pool, kept for scripts
    _held_lock: threading.Lock
    _scripts: dict[str, Script]

    def __init__(self, url: str, make_client: Callable[[], Any]) -> None:
        self._url = url  # masked in errors by ``translated``
        self._make_client = make_client
        self.forget_after_fork()  # no client yet: each process makes its own on first use

    @contextmanager
    def io(self) -> Iterator[redis.Redis]:
        """This process's client (made again after a fork), inside the one boundary of error translation."""
        with translated(self._url):
            if self._client is None:
                self._client = self._make_client()
            yield self._client

    def script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run script ``name`` on a pooled connection (a cluster client routes it to the slot's primary)."""
        with self.io() as client:
            return self._registered(name, client)(keys=keys, args=args, client=client)

    def held_script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run script ``name`` on the held connection (a pool checkout and return cost more client CPU than
        the call), or on a pooled one when another thread is using it (a renew while a run completes)."""
        with self.io() as client:
            script = self._registered(name, client)
            if not self._held_lock.acquire(blocking=False):
                return script(keys=keys, args=args, client=client)
            try:
                return script(keys=keys, args=args, client=self._held_client(client))
            finally:
                self._held_lock.release()

    def close(self) -> None:
        clients, self._client, self._held, self._scripts = (self._held, self._client), None, None, {}
        with translated(self._url):
            for client in clients:
                if client is not None:
                    client.close()

    def forget_after_fork(self) -> None:
        """Drop the client (in a forked child: the parent's, left open for it); the next call makes one."""
        self._client = self._held = None
        self._held_lock = threading.Lock()  # a fork may inherit it held
        self._scripts = {}

    def _registered(self, name: str, client: redis.Redis) -> Script:  # a race registers one twice, harmlessly
        script = self._scripts[name] = self._scripts.get(name) or client.register_script(source(name))
        return script

    def _held_client(self, client: redis.Redis) -> redis.Redis:
        """The held connection, checked as the pool checks one it hands out, but by one ``poll`` of its
        socket rather than a round trip: an idle connection the server closed (a restart, ``CLIENT KILL``,
        an idle timeout) has the goodbye or EOF waiting on it, and is connected again before a script is
        sent on it (a script that fails in flight may have run: it cannot simply be sent again)."""
        if self._held is None:
            self._held = redis.Redis(connection_pool=client.connection_pool, single_connection_client=True)
        conn = self._held.connection
        sock = getattr(conn, "_sock", None)  # None: not connected, the next command connects
        if conn is not None and sock is not None and _readable(sock.fileno()):
            conn.disconnect()  # type: ignore[no-untyped-call]  # the next command connects again
        return self._held


def _readable(fd: int) -> bool:
    """True when the idle socket ``fd`` has data or EOF waiting: its server closed it."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))
