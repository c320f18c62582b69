"""An HTTP/1.1 server on loopback that treats each request as its script says, for the etcd transport's tests.

Actions, one per request in arrival order (``"answer"`` once the script is used up):

- ``answer``: answer, keep the connection open;
- ``answer-close``: answer, then close the connection (as a server closing an idle keep-alive connection);
- ``lose``: close without answering, after passing the request on when there is an upstream (a write that
  committed and whose answer was lost);
- ``hang``: never answer (the connection stays open until the server stops).

Without an upstream the answer is a canned successful ``Txn``; with one (``host:port`` of a real etcd), each
request is passed on and etcd's answer is relayed.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
from typing import BinaryIO

CANNED = b'{"header":{"revision":"7"},"succeeded":true,"responses":[]}'


class ScriptedServer:
    def __init__(self, script: list[str], upstream: tuple[str, int] | None = None) -> None:
        self.script, self.upstream = list(script), upstream
        self.received: list[bytes] = []  # the request bodies, in arrival order
        self.connections = 0
        self.closed = threading.Event()  # set each time a connection ends
        self._stop, self._lock = threading.Event(), threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._stop.set()
        self._acceptor.join(5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                conn, _ = self._listener.accept()
                with self._lock:
                    self.connections += 1
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:
            while (request := _read_request(reader)) is not None:
                path, body = request
                with self._lock:
                    self.received.append(body)
                    action = self.script.pop(0) if self.script else "answer"
                if action == "hang":
                    self._stop.wait(30)
                    return
                status, answer = self._answer(path, body)
                if action == "lose":
                    break
                head = f"HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\n"
                conn.sendall(f"{head}Content-Length: {len(answer)}\r\n\r\n".encode() + answer)
                if action == "answer-close":
                    break
        self.closed.set()

    def _answer(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.upstream is None:
            return 200, CANNED
        etcd = http.client.HTTPConnection(*self.upstream, timeout=5)
        try:
            etcd.request("POST", path, body, {"Content-Type": "application/json"})
            response = etcd.getresponse()
            return response.status, response.read()
        finally:
            etcd.close()


def _read_request(reader: BinaryIO) -> tuple[str, bytes] | None:
    """``(path, body)`` of the next request, ``None`` once the client closed the connection."""
    line = reader.readline()
    if not line:
        return None
    length = 0
    while (header := reader.readline()) not in (b"\r\n", b""):
        name, _, value = header.decode().partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return line.split()[1].decode(), reader.read(length)
