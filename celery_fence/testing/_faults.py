"""The machinery of :mod:`celery_fence.testing`: bounded waits and real workers (the TCP proxy is in
:mod:`celery_fence.testing._proxy`); no pytest."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from celery.app.utils import find_app

from ._indeterminate import ENV as STORE_FAULTS_ENV

__all__ = ["Worker", "free_port", "wait_for"]

T = TypeVar("T")
_QUIET = ("--without-gossip", "--without-mingle", "--without-heartbeat")
# Loaded into a worker whose environment asks for lost replies: it installs them (named, not imported here:
# importing it connects a receiver to ``worker_init``).
_IN_WORKER = "celery_fence.testing._in_worker"


def wait_for(
    condition: Callable[[], T | None],
    timeout: float = 30.0,
    what: str = "the condition",
    interval: float = 0.05,
) -> T:
    """Poll ``condition()`` every ``interval`` seconds until it is truthy and return its value;
    ``AssertionError`` after ``timeout``.

    ``timeout`` is a bound on a wait that normally ends much sooner, never a measurement.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, for a server a test starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Worker:
    """A real ``celery -A <app> worker`` process in a process group of its own, stopped by its pid.

    Its log goes to ``<workdir>/<name>.log`` (stderr to ``<name>.err``); its node name is ``name`` plus a
    random suffix unless ``name`` has an ``@``. ``env`` is added to this process's environment, and ``cwd``
    (default: the current directory) is put first on ``PYTHONPATH`` (then ``env``'s, else this process's)
    so the app imports. ``wrapper`` runs the worker under another command, e.g. ``("faketime", "-f",
    "+300s")`` for a worker whose clock is skewed. When the environment sets ``CELERY_FENCE_STORE_FAULTS``,
    the worker loads ``celery_fence.testing._in_worker`` (``-I``), which makes its store calls lose their
    replies as asked. ``start`` waits for ``ready.`` in the log, which Celery
    writes at ``INFO``: a subclass with a higher ``loglevel`` overrides ``_ready``.
    """

    def __init__(
        self, app_path: str, name: str, workdir: Path, *, queues: str | Sequence[str] | None = None,
        pool: str = "prefork", concurrency: int = 1, env: dict[str, str] | None = None,
        args: Sequence[str] = (), cwd: Path | None = None, app: Any = None, wrapper: Sequence[str] = (),
        loglevel: str = "INFO",
    ) -> None:  # fmt: skip
        self.app_path, self.pool, self.cwd, self._app, self._env = app_path, pool, cwd, app, env or {}
        self.name = name.split("@", 1)[0]  # the random suffix: other test runs may share the broker
        self.nodename = name if "@" in name else f"{name}-{os.urandom(3).hex()}@{socket.gethostname()}"
        self.log_path, self.err_path = Path(workdir) / f"{self.name}.log", Path(workdir) / f"{self.name}.err"
        queue_args = ["-Q", queues if isinstance(queues, str) else ",".join(queues)] if queues else []
        self.command = [
            *wrapper, sys.executable, "-m", "celery", "-A", app_path,
            *("worker", "-P", pool, "-c", str(concurrency)),
            *("-n", self.nodename, "-l", loglevel, "--logfile", str(self.log_path), *_QUIET),
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
        self.launch()
        wait_for(self._ready, timeout, f"worker {self.name} to log 'ready.'")
        return self

    def launch(self) -> Worker:
        """Start the process without waiting for it (several workers starting at once)."""
        cwd = str(self.cwd or os.getcwd())
        inherited = self._env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        path = os.pathsep.join(dict.fromkeys(p for p in (cwd, *inherited.split(os.pathsep)) if p))
        full_env = {**os.environ, **self._env, "PYTHONPATH": path}
        faults = ["-I", _IN_WORKER] if full_env.get(STORE_FAULTS_ENV) else []
        with open(self.err_path, "wb") as stderr:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [*self.command, *faults], env=full_env, cwd=cwd, start_new_session=True,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
            )  # fmt: skip
        return self

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            code, output = self.proc.returncode, self.log_text()[-4000:]
            raise AssertionError(f"worker {self.name} exited with code {code} before it was ready:\n{output}")
        return "ready." in self.log_text()

    def children(self) -> list[int]:
        """The pids of the pool's processes (the main process's children), from ``/proc``."""
        found = []
        for status in Path("/proc").glob("[0-9]*/status"):
            with contextlib.suppress(OSError, StopIteration):
                ppid = next(line for line in status.read_text().splitlines() if line.startswith("PPid:"))
                if int(ppid.split()[1]) == self.pid:
                    found.append(int(status.parent.name))
        return found

    def log_text(self) -> str:
        """The worker's log, then anything it wrote to stderr."""
        return "".join(p.read_text(errors="replace") for p in (self.log_path, self.err_path) if p.exists())

    def pid_of(self, task_id: str, timeout: float = 10.0) -> int:
        """The pid of the process running ``task_id`` here: ``worker_pid`` from ``inspect().active()``.

        Fails if the worker never answers: remote control needs a transport that has it (Redis, AMQP,
        filesystem with a ``control_folder``; not ``sqla``) and a main process free to answer (not solo).
        """
        # limit=1: the one reply ends the wait (not the whole timeout). Its own connection, closed below: a
        # pooled one could go back with a BRPOP for the reply still in flight, and the after-fork cleanup of
        # any process this one forks later reads that shared socket and hangs.
        connection = self.app.connection_for_write()
        inspector = self.app.control.inspect(
            destination=[self.nodename], timeout=1.0, limit=1, connection=connection
        )
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
        finally:
            connection.close()

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
