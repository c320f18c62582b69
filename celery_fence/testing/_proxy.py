"""A TCP proxy for the fault kit (:mod:`celery_fence.testing`): latency, cuts, resets; no pytest."""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
from collections.abc import Callable

__all__ = ["Proxy"]


def _reset(sock: socket.socket) -> None:
    """Close with an RST, as a dead peer or a refused connection looks to a client."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class _Link:
    """One proxied connection: the client's socket, the store's, and the thread relaying between them."""

    def __init__(self, client: socket.socket, upstream: socket.socket, pump: Callable[[_Link], None]) -> None:
        self.peer = {client: upstream, upstream: client}
        self.killed = threading.Event()
        self.thread = threading.Thread(target=pump, args=(self,), name="store-proxy", daemon=True)


class Proxy:
    """A TCP proxy on ``127.0.0.1:<free port>`` in front of ``target_host:target_port``.

    Threads only, loopback only. ``cut()`` resets every open connection and refuses new ones (each is
    accepted and reset at once) until ``restore()``; ``delay(s)`` holds every chunk ``s`` seconds in
    each direction. Every wait inside is bounded; ``close()`` (or leaving a ``with`` block) stops it.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, int(target_port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.host, self.port = "127.0.0.1", int(self._listener.getsockname()[1])
        self._lock, self._links, self._closed = threading.Lock(), set[_Link](), threading.Event()
        self._cut, self._delay = False, 0.0
        self._acceptor = threading.Thread(target=self._accept, name="store-proxy-accept", daemon=True)
        self._acceptor.start()

    @property
    def connections(self) -> int:
        """How many proxied connections are open now."""
        with self._lock:
            return len(self._links)

    def cut(self) -> None:
        """Reset every open connection and refuse new ones until :meth:`restore`."""
        with self._lock:
            self._cut = True
        self._kill_all()

    def restore(self) -> None:
        """Let new connections through again (the ones ``cut()`` reset stay gone)."""
        with self._lock:
            self._cut = False

    def delay(self, seconds: float) -> None:
        """Hold every chunk ``seconds`` before passing it on, both ways (0 removes the latency)."""
        if seconds < 0:
            raise ValueError(f"a delay must be >= 0, got {seconds}")
        with self._lock:
            self._delay = float(seconds)

    def close(self) -> None:
        """Stop accepting, reset every connection, join the threads (each join is bounded). Idempotent."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._acceptor.join(5)
        self._kill_all()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _kill_all(self) -> None:
        with self._lock:
            links = list(self._links)
            for link in links:
                link.killed.set()
        for link in links:
            link.thread.join(5)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the listener was closed
            try:
                upstream = self._upstream()
            except OSError:
                _reset(client)
                continue
            link = _Link(client, upstream, self._pump)
            with self._lock:  # a cut() since _upstream() must see this link, or this link must see the cut
                if self._cut or self._closed.is_set():
                    link.killed.set()
                self._links.add(link)
            link.thread.start()

    def _upstream(self) -> socket.socket:
        with self._lock:
            if self._cut or self._closed.is_set():
                raise ConnectionRefusedError("the proxy is cut")
        return socket.create_connection(self.target, timeout=5)

    def _pump(self, link: _Link) -> None:
        with selectors.DefaultSelector() as selector:
            for sock in link.peer:
                sock.settimeout(5)  # bounds a send to a peer that stopped reading
                selector.register(sock, selectors.EVENT_READ)
            try:
                while not link.killed.is_set() and self._relay(selector, link):
                    pass
            except OSError:
                link.killed.set()
        with self._lock:
            self._links.discard(link)
        for sock in link.peer:
            if link.killed.is_set():
                _reset(sock)
            else:
                sock.close()

    def _relay(self, selector: selectors.BaseSelector, link: _Link) -> bool:
        """Pass on what is readable now; ``False`` once both sides have closed or the link is killed."""
        for key, _ in selector.select(0.1):
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            data = sock.recv(65536)
            if not data:  # pass the half-close on, and keep relaying the other way
                selector.unregister(sock)
                link.peer[sock].shutdown(socket.SHUT_WR)
                return bool(selector.get_map())
            with self._lock:
                delay = self._delay
            if delay and link.killed.wait(delay):
                return False
            link.peer[sock].sendall(data)
        return True
