"""The machinery of :mod:`celery_fence.testing` (bounded waits, real workers, a TCP proxy); no pytest."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from celery.app.utils import find_app

__all__ = ["Proxy", "Worker", "wait_for"]

T = TypeVar("T")
_QUIET = ("--without-gossip", "--without-mingle", "--without-heartbeat")


def wait_for(condition: Callable[[], T | None], timeout: float = 30.0, what: str = "the condition") -> T:
    """Poll ``condition()`` until it is truthy and return its value; ``AssertionError`` after ``timeout``.

    ``timeout`` is a bound on a wait that normally ends much sooner, never a measurement.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


class Worker:
    """A real ``celery -A <app> worker`` process in a process group of its own, stopped by its pid.

    Its log goes to ``<workdir>/<name>.log`` (stderr to ``<name>.err``); its node name is ``name`` plus a
    random suffix unless ``name`` has an ``@``. ``env`` is added to this process's environment, and ``cwd``
    (default: the current directory) is put first on ``PYTHONPATH`` so the app imports.
    """

    def __init__(
        self, app_path: str, name: str, workdir: Path, *, queues: str | Sequence[str] | None = None,
        pool: str = "prefork", concurrency: int = 1, env: dict[str, str] | None = None,
        args: Sequence[str] = (), cwd: Path | None = None, app: Any = None,
    ) -> None:  # fmt: skip
        self.app_path, self.pool, self.cwd, self._app, self._env = app_path, pool, cwd, app, env or {}
        self.name = name.split("@", 1)[0]  # the random suffix: other test runs may share the broker
        self.nodename = name if "@" in name else f"{name}-{os.urandom(3).hex()}@{socket.gethostname()}"
        self.log_path, self.err_path = Path(workdir) / f"{self.name}.log", Path(workdir) / f"{self.name}.err"
        queue_args = ["-Q", queues if isinstance(queues, str) else ",".join(queues)] if queues else []
        self.command = [
            *(sys.executable, "-m", "celery", "-A", app_path, "worker", "-P", pool, "-c", str(concurrency)),
            *("-n", self.nodename, "-l", "INFO", "--logfile", str(self.log_path), *_QUIET),
            *queue_args, *args,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self._terminated = self._stopped = False

    @property
    def pid(self) -> int:
        """The worker's main process (with the solo and threads pools it also runs the tasks)."""
        if self.proc is None:
            raise RuntimeError(f"worker {self.name} was never started")
        return self.proc.pid

    @property
    def app(self) -> Any:
        """The Celery app, in this process, that ``pid_of`` sends its remote-control request through."""
        self._app = self._app or find_app(self.app_path)
        return self._app

    def start(self, timeout: float = 60.0) -> Worker:
        """Start the process and wait until its log says ``ready.``."""
        cwd = str(self.cwd or os.getcwd())
        path = os.pathsep.join(p for p in (cwd, os.environ.get("PYTHONPATH", "")) if p)
        full_env = {**os.environ, **self._env, "PYTHONPATH": path}
        with open(self.err_path, "wb") as stderr:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                self.command, env=full_env, cwd=cwd, start_new_session=True,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
            )  # fmt: skip
        wait_for(self._ready, timeout, f"worker {self.name} to log 'ready.'")
        return self

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            code, output = self.proc.returncode, self.log_text()[-4000:]
            raise AssertionError(f"worker {self.name} exited with code {code} before it was ready:\n{output}")
        return "ready." in self.log_text()

    def log_text(self) -> str:
        """The worker's log, then anything it wrote to stderr."""
        return "".join(p.read_text(errors="replace") for p in (self.log_path, self.err_path) if p.exists())

    def pid_of(self, task_id: str, timeout: float = 10.0) -> int:
        """The pid of the process running ``task_id`` here: ``worker_pid`` from ``inspect().active()``.

        Fails if the worker never answers: remote control needs a transport that has it (Redis, AMQP,
        filesystem with a ``control_folder``; not ``sqla``) and a main process free to answer (not solo).
        """
        inspector = self.app.control.inspect(destination=[self.nodename], timeout=1.0)
        answered, error = False, None

        def find() -> int | None:
            nonlocal answered, error
            try:  # the filesystem transport can hand out a reply before it is written: ask again
                active = (inspector.active() or {}).get(self.nodename)
            except Exception as exc:
                error, active = exc, None
            answered = answered or active is not None
            pids = [t.get("worker_pid") for t in active or () if t.get("id") == task_id]
            return next((int(pid) for pid in pids if pid), None)

        try:
            return wait_for(find, timeout, f"task {task_id} to be active on {self.nodename}")
        except AssertionError:
            if answered:
                raise
            raise AssertionError(
                f"worker {self.nodename} never answered app.control.inspect().active() within {timeout}s "
                f"(last error: {error!r}): pid_of needs remote control (a transport that has it, no "
                f"--without-control, and a pool other than solo; this worker runs -P {self.pool})"
            ) from error

    def terminate(self) -> None:
        """Begin a warm shutdown: SIGCONT the group (a stopped process never sees a TERM), SIGTERM the main
        process, which stops its own pool (a TERM to the pool's children too can hang the main process)."""
        if self.proc is not None and self.proc.poll() is None and not self._terminated:
            self._terminated = True
            _signal_group(self.proc.pid, signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 15.0) -> None:
        """:meth:`terminate`, wait up to ``timeout``, then SIGKILL the whole group (also what is left of it
        if the main process died first)."""
        if self.proc is None or self._stopped:
            return
        self.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)
        _signal_group(self.proc.pid, signal.SIGKILL)  # still our group: its leader was reaped just now
        self._stopped = self.proc.wait(10) is not None


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


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
