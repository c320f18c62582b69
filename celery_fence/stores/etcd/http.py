"""The etcd store's HTTP transport: keep-alive ``http.client`` connections to one gateway endpoint (one per
cluster member, :mod:`.members`).

Not ``requests``: on a loopback etcd 3.4 it cost about 540 µs of client CPU per ``Txn``, a bare keep-alive
``http.client`` connection about 143 µs (issue 16), and the gateway needs nothing more than POST with JSON.

- **Per process.** Connections are made lazily by the process that uses them; a forked child drops the
  parent's (never closing or reading them: the parent still talks on those sockets) and makes its own.
- **Per caller.** A thread takes an idle connection, or makes one, and puts it back after the answer: as many
  connections as calls run at once (the threads pool), none shared by two requests in flight.
- **Timeouts** as the ``requests`` client had them: ``connect`` seconds to connect, then ``read`` seconds for
  every socket operation (sending, each wait for the answer).
- **Dropped connections.** An idle connection the server closed (or reset) is seen before anything is sent
  on it and replaced: safe for every request. A request whose answer is lost after it was sent is resent only
  when the caller says it is ``idempotent`` (a read) and only once, on a fresh connection, when the lost
  connection was a reused one (the keep-alive race: the server closed it as the request went out). A write
  is never resent: whether it committed is unknown, and the caller reports that as the store being
  unavailable. Errors are raised as they come (``OSError``, ``http.client.HTTPException``); the gateway maps
  them. A connection that could not be made (refused, timed out) is :class:`NotSent`: nothing reached the
  member, so the gateway may send any request to another one.
"""

from __future__ import annotations

import http.client
import select
import socket
import threading
from urllib.parse import urlsplit

from ..._process import forget_in_child

__all__ = ["EtcdConnection", "NotSent", "Transport"]

_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}
# The keep-alive race: the server closed a reused connection as the request went out, before answering.
_DROPPED = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class NotSent(OSError):
    """No connection to the member could be made: not a byte of the request left this process."""


class EtcdConnection(http.client.HTTPConnection):
    """An ``HTTPConnection`` with a connect timeout and a read timeout, as ``requests`` has."""

    def __init__(self, host: str, port: int | None, connect: float, read: float) -> None:
        super().__init__(host, port, timeout=connect)
        self.read_timeout = read

    def connect(self) -> None:
        super().connect()  # http.client sets TCP_NODELAY
        self.sock.settimeout(self.read_timeout)


def _dropped(sock: socket.socket) -> bool:
    """Whether an idle connection's socket is readable: between requests that means the server closed or
    reset it (or sent what nobody asked for): either way it cannot carry the next request."""
    if hasattr(select, "poll"):  # no FD_SETSIZE limit, unlike select()
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([sock], [], [], 0)[0])


class Transport:
    """POST to one ``http://host:port`` endpoint over this process's keep-alive connections."""

    def __init__(self, base_url: str, timeout: tuple[float, float]) -> None:
        parts, self.base_url = urlsplit(base_url), base_url
        self.host, self.port, self.timeout = parts.hostname or "", parts.port, timeout
        self._lock, self._idle = threading.Lock(), list[EtcdConnection]()
        self._generation = 0  # close() bumps it: a connection taken before is closed when given back
        forget_in_child(self)

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's connections are not ours to use, nor to close; a connection in
        use at the fork is dropped when given back (a new generation)."""
        self._lock, self._idle, self._generation = threading.Lock(), [], self._generation + 1

    def post(self, path: str, body: bytes, idempotent: bool = False) -> tuple[int, bytes]:
        """``(status, body)`` of the answer to a POST of ``body`` to ``path``."""
        conn, generation = self._take()
        try:
            reused = conn.sock is not None
            try:
                return _exchange(conn, path, body)
            except _DROPPED:
                if not (idempotent and reused):  # a write may have committed: never sent twice
                    raise
                conn.close()
                return _exchange(conn, path, body)  # once, on a fresh connection
        except BaseException:
            conn.close()  # its state is unknown (half an answer read): never reused as it is
            raise
        finally:
            self._give_back(conn, generation)

    def close(self) -> None:
        """Close this process's idle connections; one in use is closed when its call ends. Idempotent."""
        with self._lock:
            idle, self._idle, self._generation = self._idle, [], self._generation + 1
        for conn in idle:
            conn.close()

    def _take(self) -> tuple[EtcdConnection, int]:
        with self._lock:
            conn, generation = (self._idle.pop() if self._idle else None), self._generation
        if conn is None:
            conn = EtcdConnection(self.host, self.port, *self.timeout)
        elif conn.sock is not None and _dropped(conn.sock):  # nothing sent yet: any request may go on
            conn.close()  # the next request connects again (http.client's auto_open)
        return conn, generation

    def _give_back(self, conn: EtcdConnection, generation: int) -> None:
        with self._lock:
            if generation == self._generation:
                self._idle.append(conn)  # last in, first out: the warmest connection is used next
                return
        conn.close()


def _exchange(conn: EtcdConnection, path: str, body: bytes) -> tuple[int, bytes]:
    if conn.sock is None:  # connect apart, so that a failure here is known to have sent nothing
        try:
            conn.connect()
        except OSError as exc:
            raise NotSent(f"{type(exc).__name__}: {exc}") from exc
    # http.client sends the headers and the body apart; sending them in one measured no cheaper (client and
    # etcd CPU per Txn within 3%)
    conn.request("POST", path, body, _HEADERS)
    response = conn.getresponse()
    return response.status, response.read()  # read to the end: the connection can carry the next request
